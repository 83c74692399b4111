#!/usr/bin/env bash
# Where things stand: the TPU VM, its queued resource, or the training run on each worker.
usage() {
  cat <<'EOF'
Usage: [TPU_NAME=x ZONE=z QR_NAME=q] tpu_scripts/status.sh [--queued | --list | --training] [--dry-run]

  (default)    gcloud compute tpus tpu-vm describe $TPU_NAME --zone=...
  --queued     gcloud compute tpus queued-resources describe $QR_NAME --zone=...
  --list       the TPU VMs and queued resources in $ZONE (things still costing money)
  --training   on every worker: whether the run launch.sh started is still running, and the
               last line of its log
  --dry-run    print the gcloud commands instead of running them
  -h, --help   this help
EOF
}
source "$(dirname "$0")/common.sh"

what=vm
while [[ $# -gt 0 ]]; do
  case "$1" in
    --queued) what=queued; shift ;;
    --list) what=list; shift ;;
    --training) what=training; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_usage "unknown argument: $1" ;;
  esac
done

case "$what" in
  vm) run gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" ;;
  queued) run gcloud compute tpus queued-resources describe "$QR_NAME" --zone="$ZONE" ;;
  list)
    run gcloud compute tpus tpu-vm list --zone="$ZONE"
    run gcloud compute tpus queued-resources list --zone="$ZONE" ;;
  training)
    ssh_all "cd $REMOTE_DIR && if $REMOTE_RUNNING; \
then echo \"\$(hostname): running (pid \$(cat train.pid))\"; else echo \"\$(hostname): not running\"; fi; \
tail -n 1 train.log 2>/dev/null || true" ;;
esac
