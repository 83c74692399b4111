#!/usr/bin/env bash
# Shared helpers for the TPU VM scripts (sourced, not run). Every script accepts --dry-run,
# which prints the exact gcloud commands (one `+ cmd` line each, shell-quoted) instead of
# running them, so a recipe can be checked without gcloud; and -h / --help.
#
# Settings (environment variables; defaults in brackets):
#   TPU_NAME     TPU VM (node) name                                  [jaxmem]
#   ZONE         zone; v4 lives in us-central2-b, pick a v5e / v6e zone for those  [us-central2-b]
#   ACCELERATOR  accelerator type: v4-8, v4-32, v5litepod-8, v6e-8, ...             [v4-8]
#   RUNTIME      TPU software (runtime) version; unset: chosen from ACCELERATOR:
#                v2/v3/v4 tpu-ubuntu2204-base, v5litepod v2-alpha-tpuv5-lite,
#                v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e  (cloud.google.com/tpu/docs/runtimes)
#   QR_NAME      queued-resource name (create.sh --queued, delete.sh --queued)  [$TPU_NAME-qr]
#   REMOTE_DIR   folder on every worker, relative to the home directory          [jaxmem]
# gcloud's own settings apply as usual (gcloud config set project ..., CLOUDSDK_CORE_PROJECT).
set -euo pipefail

TPU_NAME="${TPU_NAME:-jaxmem}"
ZONE="${ZONE:-us-central2-b}"
ACCELERATOR="${ACCELERATOR:-v4-8}"
QR_NAME="${QR_NAME:-${TPU_NAME}-qr}"
REMOTE_DIR="${REMOTE_DIR:-jaxmem}"
DRY_RUN=0
SCRIPT="$(basename "$0")"

die() {  # die MESSAGE: a failure the user can fix (exit 1)
  echo "$SCRIPT: error: $1" >&2
  exit 1
}

bad_usage() {  # bad_usage MESSAGE: a bad command line (exit 2)
  echo "$SCRIPT: $1" >&2
  echo "Try '$SCRIPT --help'." >&2
  exit 2
}

need_value() {  # need_value "$@" (at a flag that takes a value): the flag has one, not another flag
  [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || bad_usage "$1 needs a value"
}

# accel_family / accel_size: "v4-32" -> "v4" / "32" (empty when ACCELERATOR has another form)
accel_family() { [[ "$1" =~ ^(v[0-9]+[a-z]*)-([0-9]+)$ ]] && echo "${BASH_REMATCH[1]}" || true; }
accel_size() { [[ "$1" =~ ^(v[0-9]+[a-z]*)-([0-9]+)$ ]] && echo "${BASH_REMATCH[2]}" || true; }

default_runtime() {  # default_runtime ACCELERATOR: the runtime version Google lists for JAX
  case "$(accel_family "$1")" in
    v2|v3|v4) echo tpu-ubuntu2204-base ;;
    v5litepod|v5e) echo v2-alpha-tpuv5-lite ;;
    v5p) echo v2-alpha-tpuv5 ;;
    v6e) echo v2-alpha-tpuv6e ;;
    *) die "no default runtime version for ACCELERATOR=$1; set RUNTIME (see cloud.google.com/tpu/docs/runtimes)" ;;
  esac
}

runtime_version() { if [[ -n "${RUNTIME:-}" ]]; then echo "$RUNTIME"; else default_runtime "$ACCELERATOR"; fi; }

# is_multi_host ACCELERATOR: exit 0 if the slice spans more than one TPU VM host, 1 if it is a
# single host, 2 if the type is not one we know. v2/v3/v4/v5p sizes count TensorCores (8 per
# host: v4-8 is one host of 4 chips, v4-16 two hosts); v5litepod / v6e sizes count chips
# (at most 8 on one host).
is_multi_host() {
  local family size
  family="$(accel_family "$1")"; size="$(accel_size "$1")"
  case "$family" in
    v2|v3|v4|v5p|v5litepod|v5e|v6e) [[ "$size" -gt 8 ]] && return 0 || return 1 ;;
    *) return 2 ;;
  esac
}

run() {  # run CMD...: print `+ CMD` (stdout in dry-run, stderr otherwise) and run it unless dry-run
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    { printf '+'; printf ' %q' "$@"; printf '\n'; } >&2
    "$@"
  fi
}

note() {  # note TEXT: a comment line; in dry-run it goes to stdout after the commands it explains
  if [[ "$DRY_RUN" == 1 ]]; then echo "# $1"; else echo "$SCRIPT: $1" >&2; fi
}

# A remote shell test: true while the run launch.sh started is alive (its pid, in train.pid under
# REMOTE_DIR, names a process that is not a zombie).
# shellcheck disable=SC2016,SC2034  # expands on the worker; used by launch.sh and status.sh
REMOTE_RUNNING='[ -f train.pid ] && ps -o stat= -p "$(cat train.pid)" 2>/dev/null | grep -qv Z'

ssh_workers() {  # ssh_workers WORKER COMMAND: run COMMAND on worker WORKER (0, 1, ... or all)
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker="$1" --command="$2"
}

ssh_all() { ssh_workers all "$1"; }  # every worker of the slice (one on a single-host TPU VM)
