#!/usr/bin/env bash
# Copy this checkout to every worker and install jaxmem with JAX for TPU.
# Usage: TPU_NAME=x ZONE=z tpu_scripts/setup.sh [--dry-run]
source "$(dirname "$0")/common.sh"
parse_common "$@"
root="$(cd "$(dirname "$0")/.." && pwd)"
archive="/tmp/jaxmem-src.tar.gz"
run git -C "$root" archive --format=tar.gz -o "$archive" HEAD
run gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME:/tmp/jaxmem-src.tar.gz" --zone "$ZONE" --worker=all
ssh_all "mkdir -p $REMOTE_DIR && tar -xzf /tmp/jaxmem-src.tar.gz -C $REMOTE_DIR && cd $REMOTE_DIR && \
python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e '.[data]' && \
.venv/bin/pip install -q 'jax[tpu]' && .venv/bin/python -c 'import jax; print(jax.device_count(), jax.devices()[0])'"
