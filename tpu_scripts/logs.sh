#!/usr/bin/env bash
# Show the training log (~/$REMOTE_DIR/train.log) that launch.sh writes on each worker.
usage() {
  cat <<'EOF'
Usage: [TPU_NAME=x ZONE=z] tpu_scripts/logs.sh [--worker N | --all] [--follow] [--lines N] [--dry-run]

  --worker N    the worker to read (default 0: process 0, the one jaxmem reports from; look at
                the others when one of them fails)
  --all         every worker, each line prefixed with the worker's hostname
  -f, --follow  keep following the log (tail -F; Ctrl-C to stop, training keeps running)
  --lines N     lines of history to show first (default 100)
  --dry-run     print the gcloud command instead of running it
  -h, --help    this help
EOF
}
source "$(dirname "$0")/common.sh"

worker=0 follow=0 lines=100
while [[ $# -gt 0 ]]; do
  case "$1" in
    --worker) need_value "$@"; worker="$2"; shift 2 ;;
    --worker=*) worker="${1#*=}"; shift ;;
    --all) worker=all; shift ;;
    -f|--follow) follow=1; shift ;;
    --lines) need_value "$@"; lines="$2"; shift 2 ;;
    --lines=*) lines="${1#*=}"; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_usage "unknown argument: $1" ;;
  esac
done
[[ "$worker" =~ ^([0-9]+|all)$ ]] || bad_usage "--worker takes a worker number (0, 1, ...) or all"
[[ "$lines" =~ ^[0-9]+$ ]] || bad_usage "--lines takes a number"

tail_cmd="tail -n $lines"
(( follow )) && tail_cmd+=" -F"
tail_cmd+=" $REMOTE_DIR/train.log"
[[ $worker == all ]] && tail_cmd+=" | sed -u \"s/^/[\$(hostname)] /\""
ssh_workers "$worker" "$tail_cmd"
