#!/usr/bin/env bash
# Create a TPU VM.  Usage: TPU_NAME=x ZONE=z ACCELERATOR=v4-32 tpu_scripts/create.sh [--spot] [--dry-run]
source "$(dirname "$0")/common.sh"
parse_common "$@"
extra=()
for a in "${REST[@]+"${REST[@]}"}"; do
  case "$a" in
    --spot) extra+=(--spot) ;;
    *) echo "unknown argument: $a" >&2; exit 2 ;;
  esac
done
run gcloud compute tpus tpu-vm create "$TPU_NAME" --zone "$ZONE" \
  --accelerator-type "$ACCELERATOR" --version "$RUNTIME" "${extra[@]+"${extra[@]}"}"
