#!/usr/bin/env bash
# Copy this checkout to every worker, install jaxmem with JAX for TPU, print the devices.
usage() {
  cat <<'EOF'
Usage: [TPU_NAME=x ZONE=z] tpu_scripts/setup.sh [--bucket BUCKET] [--check-only] [--dry-run]

On every worker of $TPU_NAME (--worker=all):
  1. copies `git archive HEAD` of this checkout (committed files only) into ~/$REMOTE_DIR;
  2. installs Python 3.11 if missing (jax >= 0.7 needs Python >= 3.11; the TPU images ship 3.10),
     makes ~/$REMOTE_DIR/.venv and installs jaxmem[data] with jax[tpu] under constraints.txt
     (jax[tpu] pulls the matching libtpu from PyPI; no extra index is needed);
  3. prints, from every worker, its process index, the global and local device counts and the
     device kind (after jax.distributed.initialize(), as launch.sh's runs do).

  --bucket BUCKET   also install Cloud Storage FUSE and mount gs://BUCKET at /mnt/BUCKET on every
                    worker: the shared work dir a multi-host slice needs (launch.sh --workdir
                    /mnt/BUCKET/runs/NAME). Directory renames (Orbax's atomic commit) are allowed
                    with --rename-dir-limit.
  --check-only      only step 3
  --dry-run         print the commands instead of running them
  -h, --help        this help

Environment: see tpu_scripts/common.sh; REMOTE_PYTHON (default python3.11).
EOF
}
source "$(dirname "$0")/common.sh"

bucket="" check_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bucket) need_value "$@"; bucket="$2"; shift 2 ;;
    --bucket=*) bucket="${1#*=}"; [[ -n "$bucket" ]] || bad_usage "--bucket needs a value"; shift ;;
    --check-only) check_only=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_usage "unknown argument: $1" ;;
  esac
done
bucket="${bucket#gs://}"; bucket="${bucket%/}"
[[ -z "$bucket" || "$bucket" =~ ^[a-z0-9][a-z0-9._-]*[a-z0-9]$ ]] \
  || bad_usage "--bucket takes a bucket name (gs://NAME or NAME, no folder), got: $bucket"
py="${REMOTE_PYTHON:-python3.11}"
root="$(cd "$(dirname "$0")/.." && pwd)"
archive="/tmp/jaxmem-src.tar.gz"

if (( ! check_only )); then
  if [[ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    echo "$SCRIPT: note: uncommitted changes are not copied (git archive HEAD); commit them first" >&2
  fi
  run git -C "$root" archive --format=tar.gz -o "$archive" HEAD
  run gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME:$archive" --zone="$ZONE" --worker=all
  ssh_all "set -e; if ! command -v $py >/dev/null || ! $py -c 'import ensurepip' 2>/dev/null; then \
sudo apt-get update -q && sudo apt-get install -y -q $py $py-venv; fi; \
mkdir -p $REMOTE_DIR && tar -xzf $archive -C $REMOTE_DIR && cd $REMOTE_DIR && \
$py -m venv .venv && .venv/bin/pip install -q -U pip && \
.venv/bin/pip install -q -c constraints.txt -e '.[data]' 'jax[tpu]'"
  if [[ -n "$bucket" ]]; then
    mnt="/mnt/$bucket"
    # Cloud Storage FUSE from Google's apt repository (cloud.google.com/storage/docs/cloud-storage-fuse/install)
    ssh_all "set -e; if ! command -v gcsfuse >/dev/null; then \
echo \"deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-\$(lsb_release -c -s) main\" \
| sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null && \
curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null && \
sudo apt-get update -q && sudo apt-get install -y -q fuse gcsfuse; fi; \
sudo mkdir -p $mnt && sudo chown \$(id -u):\$(id -g) $mnt; \
mountpoint -q $mnt || gcsfuse --implicit-dirs --rename-dir-limit=10000 $bucket $mnt; \
touch $mnt/.jaxmem_probe_\$(hostname) && rm $mnt/.jaxmem_probe_\$(hostname) && echo \"\$(hostname): gs://$bucket at $mnt\""
  fi
fi
ssh_all "cd $REMOTE_DIR && .venv/bin/python -c 'import jax; jax.distributed.initialize(); print(\"process\", jax.process_index(), \"of\", jax.process_count(), \"devices\", jax.device_count(), \"local\", jax.local_device_count(), jax.devices()[0].device_kind)'"
