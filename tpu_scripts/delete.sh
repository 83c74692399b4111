#!/usr/bin/env bash
# Delete the TPU VM (or its queued resource) so that it stops costing money.
usage() {
  cat <<'EOF'
Usage: [TPU_NAME=x ZONE=z QR_NAME=q] tpu_scripts/delete.sh [--queued] [--delete-gcs gs://BUCKET/PATH] [--dry-run]

  (default)           gcloud compute tpus tpu-vm delete $TPU_NAME --zone=... --quiet
  --queued            the VM was made with create.sh --queued: delete the queued resource $QR_NAME
                      with --force, which deletes its TPU VM too
                      (gcloud compute tpus queued-resources delete $QR_NAME --zone=... --quiet --force)
  --delete-gcs URL    also delete the folder URL (gs://BUCKET/PATH, recursively) - e.g. a finished
                      run's checkpoints. Without it nothing in Cloud Storage is touched: your
                      bucket and the checkpoints in it are NOT deleted (storage is billed until you
                      remove them: gcloud storage rm --recursive gs://BUCKET/PATH).
  --dry-run           print the gcloud commands instead of running them
  -h, --help          this help

--quiet skips gcloud's confirmation prompt: the VM and its local disk are gone once this returns.
EOF
}
source "$(dirname "$0")/common.sh"

queued=0 gcs=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --queued) queued=1; shift ;;
    --delete-gcs) need_value "$@"; gcs="$2"; shift 2 ;;
    --delete-gcs=*) gcs="${1#*=}"; [[ -n "$gcs" ]] || bad_usage "--delete-gcs needs a value"; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_usage "unknown argument: $1" ;;
  esac
done
if [[ -n "$gcs" ]]; then
  [[ "$gcs" =~ ^gs://[^/]+/.*[^/] ]] \
    || bad_usage "--delete-gcs takes a folder inside a bucket, gs://BUCKET/PATH (not a whole bucket), got: $gcs"
fi

if (( queued )); then
  run gcloud compute tpus queued-resources delete "$QR_NAME" --zone="$ZONE" --quiet --force
else
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" --quiet
fi
if [[ -n "$gcs" ]]; then
  run gcloud storage rm --recursive "$gcs"
else
  note "Cloud Storage is not touched: buckets and checkpoints stay (and are billed) until you delete them"
fi
