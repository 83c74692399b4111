#!/usr/bin/env bash
# Launch training on every worker (single- or multi-host); rerunning resumes from the
# latest checkpoint in WORKDIR. On multi-host slices WORKDIR must be a shared filesystem
# path (e.g. a gcsfuse mount) so that every host sees the same checkpoints.
# Usage: TPU_NAME=x tpu_scripts/launch.sh --config configs/lm_baseline.py [--config.x=y ...]
#        [--workdir DIR] [--dry-run]
source "$(dirname "$0")/common.sh"
parse_common "$@"
workdir="${WORKDIR:-runs/tpu}"
args=()
set -- "${REST[@]+"${REST[@]}"}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --workdir) workdir="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ ${#args[@]} -gt 0 ]] || { echo "usage: launch.sh --config FILE [--config.field=value ...]" >&2; exit 2; }
quoted=$(printf ' %q' "${args[@]}")
# JAXMEM_DISTRIBUTED=1 makes the CLI call jax.distributed.initialize() (multi-host).
ssh_all "cd $REMOTE_DIR && JAXMEM_DISTRIBUTED=1 nohup .venv/bin/jaxmem train$quoted --workdir $workdir --no_progress > train.log 2>&1 &"
