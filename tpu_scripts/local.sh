#!/usr/bin/env bash
# Run `jaxmem train` as several processes on this machine, each with its own CPU devices: the
# multi-host code path (jax.distributed, a coordinator on localhost, gloo collectives) without a
# TPU. This is how tests/train/test_multiprocess.py exercises it.
usage() {
  cat <<'EOF'
Usage: tpu_scripts/local.sh [--processes N] [--devices D] [--port P] [--python PY] [--dry-run]
                            -- --config FILE --workdir DIR [--config.field=value ...]

  --processes N  processes to start (default 2); process i logs to DIR.process<i>.log
  --devices D    CPU devices per process (default 4; XLA_FLAGS=--xla_force_host_platform_device_count)
  --port P       coordinator port on localhost (default: a free one)
  --python PY    interpreter with jaxmem installed (default: .venv/bin/python if present, else python3)
  --dry-run      print the commands instead of running them
  -h, --help     this help
Everything after -- goes to `jaxmem train` unchanged. Exits 0 when every process does; otherwise
with the first failing process's status. Killing one process and running the same command again
resumes from the last complete checkpoint.
EOF
}
set -euo pipefail
SCRIPT="$(basename "$0")"
bad_usage() { echo "$SCRIPT: $1" >&2; echo "Try '$SCRIPT --help'." >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || bad_usage "$1 needs a value"; }

root="$(cd "$(dirname "$0")/.." && pwd)"
procs=2 devices=4 port="" dry=0
python="$root/.venv/bin/python"; [[ -x "$python" ]] || python=python3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --processes) need_value "$@"; procs="$2"; shift 2 ;;
    --devices) need_value "$@"; devices="$2"; shift 2 ;;
    --port) need_value "$@"; port="$2"; shift 2 ;;
    --python) need_value "$@"; python="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) bad_usage "unknown argument: $1 (jaxmem train's arguments go after --)" ;;
  esac
done
[[ "$procs" =~ ^[1-9][0-9]*$ ]] || bad_usage "--processes takes a positive number"
[[ "$devices" =~ ^[1-9][0-9]*$ ]] || bad_usage "--devices takes a positive number"
[[ -z "$port" || "$port" =~ ^[0-9]+$ ]] || bad_usage "--port takes a number"
[[ $# -gt 0 ]] || bad_usage "give jaxmem train's arguments after --"
workdir=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --workdir) workdir="${args[i+1]:-}" ;;
    --workdir=*) workdir="${args[i]#*=}" ;;
  esac
done
[[ -n "$workdir" ]] || bad_usage "jaxmem train needs --workdir (after --)"
if [[ -z "$port" ]]; then
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])' \
         2>/dev/null || echo 12355)
fi

pids=()
for ((i = 0; i < procs; i++)); do
  cmd=(env JAXMEM_COORDINATOR="localhost:$port" JAXMEM_NUM_PROCESSES="$procs" JAXMEM_PROCESS_ID="$i"
       XLA_FLAGS="--xla_force_host_platform_device_count=$devices" JAX_PLATFORMS=cpu
       "$python" -m jaxmem train --distributed "$@")
  log="$workdir.process$i.log"
  if (( dry )); then
    printf '+'; printf ' %q' "${cmd[@]}"; printf ' > %q 2>&1 &\n' "$log"
  else
    mkdir -p "$(dirname "$workdir")"
    "${cmd[@]}" > "$log" 2>&1 &
    pids+=($!)
  fi
done
(( dry )) && exit 0
echo "$SCRIPT: $procs processes × $devices CPU devices, coordinator localhost:$port; logs $workdir.process*.log" >&2
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[i]}"; then
    rc=$?
    echo "$SCRIPT: process $i exited with $rc (see $workdir.process$i.log)" >&2
    (( status )) || status=$rc
  fi
done
exit "$status"
