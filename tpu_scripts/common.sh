#!/usr/bin/env bash
# Shared helpers for the TPU VM scripts. Every script accepts --dry-run, which prints the
# gcloud commands instead of running them (no gcloud needed), so recipes can be checked.
set -euo pipefail

TPU_NAME="${TPU_NAME:-jaxmem}"
ZONE="${ZONE:-us-central2-b}"
ACCELERATOR="${ACCELERATOR:-v4-8}"
RUNTIME="${RUNTIME:-tpu-ubuntu2204-base}"
REMOTE_DIR="${REMOTE_DIR:-jaxmem}"
DRY_RUN=0

parse_common() {
  REST=()
  for arg in "$@"; do
    case "$arg" in
      --dry-run) DRY_RUN=1 ;;
      *) REST+=("$arg") ;;
    esac
  done
}

run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

ssh_all() {  # ssh_all "command": run on every worker of a (multi-host) TPU VM
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command "$1"
}
