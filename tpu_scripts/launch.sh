#!/usr/bin/env bash
# Launch `jaxmem train` (or `jaxmem reproduce`) in the background on every worker.
usage() {
  cat <<'EOF'
Usage: [TPU_NAME=x ZONE=z ACCELERATOR=v4-8] tpu_scripts/launch.sh [train] --config FILE[:variant]
           [--config.SECTION.FIELD=VALUE ...] [--workdir DIR] [--stop_after N] [--dry-run]
       tpu_scripts/launch.sh reproduce [--only NAME ...] [--out DIR] [--quick]
           [--config.EXPERIMENT.FIELD=VALUE ...] [--dry-run]
       tpu_scripts/launch.sh --stop [--dry-run]

Runs, on every worker (--worker=all) and in the background (nohup), from ~/$REMOTE_DIR:
  JAXMEM_DISTRIBUTED=1 .venv/bin/jaxmem train ... --workdir DIR --no_progress >> train.log
JAXMEM_DISTRIBUTED=1 makes jaxmem call jax.distributed.initialize() (one process per host).
The pid goes to ~/$REMOTE_DIR/train.pid; a second launch while one runs is refused.
Rerunning the same command resumes from the latest checkpoint in DIR (e.g. after preemption).

  --workdir DIR   the run's folder [$WORKDIR, else runs/tpu under ~/$REMOTE_DIR]. On a multi-host
                  slice (v4-16 and up, v5litepod-16 and up, ...) every host writes the checkpoints,
                  so DIR must be shared: a bucket mounted by `setup.sh --bucket B`, i.e.
                  /mnt/B/runs/NAME; anything else is refused. gs://... is refused too: jaxmem opens
                  the work dir as a local path, so it would become a folder named "gs:" on each VM.
  reproduce       `jaxmem reproduce` instead (single-host accelerators only); --out DIR as above
  --stop          stop the run started by launch.sh on every worker (SIGTERM; the last complete
                  checkpoint is kept)
  --dry-run       print the gcloud command instead of running it
  -h, --help      this help

Follow the log with tpu_scripts/logs.sh.
EOF
}
source "$(dirname "$0")/common.sh"

mode=train config="" workdir="${WORKDIR:-runs/tpu}" out="" args=() nargs=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    train|reproduce) (( nargs == 0 )) || bad_usage "$1 must come before the other arguments"
                     mode="$1"; nargs=1; shift; continue ;;
    --dry-run) DRY_RUN=1; shift; continue ;;
    -h|--help) usage; exit 0 ;;
    --stop) (( nargs == 0 )) || bad_usage "--stop takes no other arguments"
            mode=stop; shift ;;
    --config.*=*) args+=("$1"); shift ;;
    --config.*) bad_usage "write overrides as --config.FIELD=VALUE (got: $1)" ;;
    --config) [[ $mode == train ]] || bad_usage "--config is for train"; need_value "$@"; config="$2"; shift 2 ;;
    --config=*) [[ $mode == train ]] || bad_usage "--config is for train"; config="${1#*=}"; shift ;;
    --workdir) [[ $mode == train ]] || bad_usage "--workdir is for train"; need_value "$@"; workdir="$2"; shift 2 ;;
    --workdir=*) [[ $mode == train ]] || bad_usage "--workdir is for train"; workdir="${1#*=}"; shift ;;
    --stop_after) [[ $mode == train ]] || bad_usage "--stop_after is for train"; need_value "$@"
                  [[ "$2" =~ ^[0-9]+$ ]] || bad_usage "--stop_after takes a number of steps"; args+=(--stop_after "$2"); shift 2 ;;
    --only) [[ $mode == reproduce ]] || bad_usage "--only is for reproduce"; need_value "$@"; args+=(--only "$2"); shift 2 ;;
    --out) [[ $mode == reproduce ]] || bad_usage "--out is for reproduce"; need_value "$@"; out="$2"; shift 2 ;;
    --quick) [[ $mode == reproduce ]] || bad_usage "--quick is for reproduce"; args+=(--quick); shift ;;
    *) bad_usage "unknown argument: $1" ;;
  esac
  nargs=1
done
[[ $mode == stop && ${#args[@]} -gt 0 ]] && bad_usage "--stop takes no other arguments"

running="$REMOTE_RUNNING"
if [[ $mode == stop ]]; then
  ssh_all "cd $REMOTE_DIR && if $running; then kill \"\$(cat train.pid)\" && echo \"\$(hostname): stopped pid \$(cat train.pid)\"; \
else echo \"\$(hostname): not running\"; fi"
  exit 0
fi

check_dir() {  # check_dir FLAG DIR: refuse gs:// and, on a multi-host slice, unshared folders
  local flag="$1" dir="$2" rc=0
  if [[ "$dir" == gs://* ]]; then
    die "$flag $dir: jaxmem opens its work dir as a local path (pathlib), so gs://... would become a \
local folder named 'gs:' on every VM. Mount the bucket instead (tpu_scripts/setup.sh --bucket BUCKET) \
and pass $flag /mnt/BUCKET/..."
  fi
  is_multi_host "$ACCELERATOR" || rc=$?
  if [[ $rc == 0 && "$dir" != /mnt/?* ]]; then
    die "ACCELERATOR=$ACCELERATOR is a multi-host slice: every host writes the checkpoints, so $flag must \
be a folder all hosts share, not a local one ($dir). Mount a bucket on every worker with \
tpu_scripts/setup.sh --bucket BUCKET and pass $flag /mnt/BUCKET/runs/NAME."
  elif [[ $rc == 2 ]]; then
    echo "$SCRIPT: warning: unknown ACCELERATOR=$ACCELERATOR; cannot tell whether $flag $dir must be shared" >&2
  fi
}

if [[ $mode == train ]]; then
  [[ -n "$config" ]] || bad_usage "train needs --config FILE (e.g. --config configs/lm_baseline.py)"
  check_dir --workdir "$workdir"
  cmd=(train --config "$config" "${args[@]+"${args[@]}"}" --workdir "$workdir" --no_progress)
else
  rc=0; is_multi_host "$ACCELERATOR" || rc=$?
  [[ $rc == 0 ]] && die "jaxmem reproduce runs on one host; ACCELERATOR=$ACCELERATOR is a multi-host slice \
(use v4-8, v5litepod-8 or v6e-8)"
  [[ -n "$out" ]] && check_dir --out "$out"
  cmd=(reproduce "${args[@]+"${args[@]}"}")
  [[ -n "$out" ]] && cmd+=(--out "$out")
  cmd+=(--no_progress)
fi
quoted=$(printf ' %q' "${cmd[@]}")
ssh_all "cd $REMOTE_DIR && if $running; then \
echo \"\$(hostname): already running (pid \$(cat train.pid)); stop it with tpu_scripts/launch.sh --stop\" >&2; exit 1; fi; \
JAXMEM_DISTRIBUTED=1 nohup .venv/bin/jaxmem$quoted >> train.log 2>&1 < /dev/null & \
echo \$! > train.pid; echo \"\$(hostname): started pid \$(cat train.pid); log ~/$REMOTE_DIR/train.log\""
note "follow the log: tpu_scripts/logs.sh --follow"
