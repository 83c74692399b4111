#!/usr/bin/env bash
# Create a TPU VM (plain, or through a queued resource) and wait until it is READY.
usage() {
  cat <<'EOF'
Usage: [TPU_NAME=x ZONE=z ACCELERATOR=v4-8 RUNTIME=...] tpu_scripts/create.sh [options] [-- GCLOUD_FLAGS...]

Creates the TPU VM $TPU_NAME and waits until it is READY.

  (default)                   gcloud compute tpus tpu-vm create $TPU_NAME --zone=... --accelerator-type=...
                              --version=$RUNTIME
  --queued                    request it as a queued resource instead ($QR_NAME, node id $TPU_NAME):
                              gcloud compute tpus queued-resources create ... --runtime-version=...;
                              waits until the request is ACTIVE, then until the node is READY
  --spot                      a Spot TPU VM (cheaper; can be preempted at any time)
  --preemptible               a preemptible TPU VM (plain create only; Google now recommends --spot)
  --valid-until-duration D    with --queued: give up if not provisioned within D (e.g. 6h, 2d)
  --no-wait                   return after the create request; do not poll the state
  --dry-run                   print the gcloud commands instead of running them
  -h, --help                  this help
  -- GCLOUD_FLAGS...          passed to the create command as they are (e.g. --service-account=...)

Environment: see tpu_scripts/common.sh (TPU_NAME, ZONE, ACCELERATOR, RUNTIME, QR_NAME);
POLL_SECONDS (default 30) between state checks.
EOF
}
source "$(dirname "$0")/common.sh"

queued=0 spot=0 preemptible=0 wait=1 valid_until="" extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --queued) queued=1; shift ;;
    --spot) spot=1; shift ;;
    --preemptible) preemptible=1; shift ;;
    --valid-until-duration) need_value "$@"; valid_until="$2"; shift 2 ;;
    --valid-until-duration=*) valid_until="${1#*=}"; [[ -n "$valid_until" ]] || bad_usage "--valid-until-duration needs a value"; shift ;;
    --no-wait) wait=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) bad_usage "unknown argument: $1" ;;
  esac
done
(( spot && preemptible )) && bad_usage "--spot and --preemptible exclude each other"
(( queued && preemptible )) && bad_usage "--preemptible is for a plain TPU VM; a queued resource takes --spot"
[[ -n "$valid_until" && $queued == 0 ]] && bad_usage "--valid-until-duration needs --queued"
runtime="$(runtime_version)"
POLL_SECONDS="${POLL_SECONDS:-30}"

poll() {  # poll WHAT WANT FAIL_STATES CMD...: rerun CMD until it prints WANT
  local what="$1" want="$2" fail="$3" state="" last=""
  shift 3
  if [[ "$DRY_RUN" == 1 ]]; then
    run "$@"
    note "polls the command above every ${POLL_SECONDS}s until $what is $want"
    return 0
  fi
  while true; do
    state="$("$@" 2>/dev/null || true)"
    [[ "$state" != "$last" ]] && echo "$SCRIPT: $what: ${state:-(not visible yet)}" >&2
    last="$state"
    [[ "$state" == "$want" ]] && return 0
    if [[ -n "$state" && " $fail " == *" $state "* ]]; then
      die "$what is $state; see: gcloud compute tpus queued-resources describe $QR_NAME --zone=$ZONE"
    fi
    sleep "$POLL_SECONDS"
  done
}

if (( queued )); then
  cmd=(gcloud compute tpus queued-resources create "$QR_NAME" --node-id="$TPU_NAME" --zone="$ZONE"
       --accelerator-type="$ACCELERATOR" --runtime-version="$runtime")
  (( spot )) && cmd+=(--spot)
  [[ -n "$valid_until" ]] && cmd+=(--valid-until-duration="$valid_until")
else
  cmd=(gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" --accelerator-type="$ACCELERATOR"
       --version="$runtime")
  (( spot )) && cmd+=(--spot)
  (( preemptible )) && cmd+=(--preemptible)
fi
run "${cmd[@]}" "${extra[@]+"${extra[@]}"}"

if (( wait )); then
  if (( queued )); then
    poll "queued resource $QR_NAME" ACTIVE "FAILED SUSPENDING SUSPENDED" \
      gcloud compute tpus queued-resources describe "$QR_NAME" --zone="$ZONE" --format="value(state.state)"
  fi
  poll "TPU VM $TPU_NAME" READY "" \
    gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" --format="value(state)"
  note "next: TPU_NAME=$TPU_NAME ZONE=$ZONE ACCELERATOR=$ACCELERATOR tpu_scripts/setup.sh"
fi
