"""tpu_scripts/*: the exact gcloud commands each recipe prints with --dry-run, and its checks.

Every run has PATH=/usr/bin:/bin (plus, in the last test, a folder holding a fake gcloud), so a
real gcloud is never called. The `+ cmd` lines are parsed with shlex and compared as argument
lists; the commands sent to the workers (--command=...) are parsed again and checked as bash.
"""

import os
import shlex
import subprocess
import time

import pytest

from tests.conftest import REPO

SCRIPTS = REPO / "tpu_scripts"
ALL_SCRIPTS = ["create.sh", "setup.sh", "launch.sh", "logs.sh", "delete.sh", "status.sh"]
TPU = ["gcloud", "compute", "tpus", "tpu-vm"]
QR = ["gcloud", "compute", "tpus", "queued-resources"]
Z = "--zone=us-central2-b"


def run(script, *args, dry=True, path="/usr/bin:/bin", **env):
  env = {"PATH": path, "TPU_NAME": "t1", **env}
  env = {k: v for k, v in env.items() if v is not None}
  return subprocess.run(["bash", str(SCRIPTS / script), *(["--dry-run"] if dry else []), *args],
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=60)


def commands(r):
  """The `+ ...` lines of a dry run, each as its argument list."""
  assert r.returncode == 0, r.stderr
  return [shlex.split(line[2:]) for line in r.stdout.splitlines() if line.startswith("+ ")]


def ssh(worker, remote):
  return TPU + ["ssh", "t1", Z, f"--worker={worker}", f"--command={remote}"]


def remote_of(argv):
  """The --command=... of an ssh argument list, checked to be valid bash."""
  assert argv[:6] == TPU + ["ssh", "t1"], argv
  (cmd,) = [a[len("--command="):] for a in argv if a.startswith("--command=")]
  check = subprocess.run(["bash", "-n", "-c", cmd], capture_output=True, text=True)
  assert check.returncode == 0, (cmd, check.stderr)
  return cmd


def jaxmem_argv(remote):
  """What the launch command runs on the workers: the tokens between `nohup` and `>>`."""
  toks = shlex.split(remote)
  i = toks.index("nohup")
  assert toks[i - 1] == "JAXMEM_DISTRIBUTED=1"
  j = toks.index(">>", i)
  assert toks[j + 1:j + 3] == ["train.log", "2>&1"]
  return toks[i + 1:j]


def has_seq(toks, seq):
  return any(toks[i:i + len(seq)] == seq for i in range(len(toks) - len(seq) + 1))


# ---------------------------------------------------------------- create.sh


def test_create_single_host_v4_8():
  assert commands(run("create.sh", ACCELERATOR="v4-8")) == [
      TPU + ["create", "t1", Z, "--accelerator-type=v4-8", "--version=tpu-ubuntu2204-base"],
      TPU + ["describe", "t1", Z, "--format=value(state)"],
  ]


@pytest.mark.parametrize("accel,runtime", [
    ("v4-32", "tpu-ubuntu2204-base"), ("v5litepod-8", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e"), ("v3-8", "tpu-ubuntu2204-base")])
def test_create_picks_the_runtime_from_the_accelerator(accel, runtime):
  create = commands(run("create.sh", "--no-wait", ACCELERATOR=accel))
  assert create == [TPU + ["create", "t1", Z, f"--accelerator-type={accel}", f"--version={runtime}"]]


def test_create_runtime_env_wins_and_unknown_accelerator_needs_it():
  r = run("create.sh", "--no-wait", ACCELERATOR="v6e-8", RUNTIME="v2-alpha-tpuv6e-custom")
  assert commands(r)[0][-1] == "--version=v2-alpha-tpuv6e-custom"
  r = run("create.sh", ACCELERATOR="v9z-8")
  assert r.returncode == 1 and "set RUNTIME" in r.stderr and "+ " not in r.stdout
  r = run("create.sh", "--no-wait", ACCELERATOR="v9z-8", RUNTIME="rt")
  assert commands(r) == [TPU + ["create", "t1", Z, "--accelerator-type=v9z-8", "--version=rt"]]


@pytest.mark.parametrize("flag", ["--spot", "--preemptible"])
def test_create_spot_or_preemptible_vm(flag):
  assert commands(run("create.sh", flag, ZONE="us-west4-a", ACCELERATOR="v5litepod-8")) == [
      TPU + ["create", "t1", "--zone=us-west4-a", "--accelerator-type=v5litepod-8",
             "--version=v2-alpha-tpuv5-lite", flag],
      TPU + ["describe", "t1", "--zone=us-west4-a", "--format=value(state)"],
  ]


def test_create_queued_resource_spot_pod_slice_and_waits_for_active_then_ready():
  r = run("create.sh", "--queued", "--spot", "--valid-until-duration", "6h", ACCELERATOR="v4-32")
  assert commands(r) == [
      QR + ["create", "t1-qr", "--node-id=t1", Z, "--accelerator-type=v4-32",
            "--runtime-version=tpu-ubuntu2204-base", "--spot", "--valid-until-duration=6h"],
      QR + ["describe", "t1-qr", Z, "--format=value(state.state)"],
      TPU + ["describe", "t1", Z, "--format=value(state)"],
  ]
  assert "until queued resource t1-qr is ACTIVE" in r.stdout and "until TPU VM t1 is READY" in r.stdout


def test_create_queued_name_and_extra_gcloud_flags():
  r = run("create.sh", "--queued", "--no-wait", "--", "--service-account=sa@p.iam", QR_NAME="q7")
  assert commands(r) == [
      QR + ["create", "q7", "--node-id=t1", Z, "--accelerator-type=v4-8",
            "--runtime-version=tpu-ubuntu2204-base", "--service-account=sa@p.iam"]]


# ---------------------------------------------------------------- setup.sh

INSTALL = [".venv/bin/pip", "install", "-q", "-c", "constraints.txt", "-e", ".[data]", "jax[tpu]"]


def test_setup_copies_installs_and_checks_on_all_workers():
  cmds = commands(run("setup.sh"))
  assert cmds[0] == ["git", "-C", str(REPO), "archive", "--format=tar.gz", "-o",
                     "/tmp/jaxmem-src.tar.gz", "HEAD"]
  assert cmds[1] == TPU + ["scp", "/tmp/jaxmem-src.tar.gz", "t1:/tmp/jaxmem-src.tar.gz", Z,
                           "--worker=all"]
  assert [c[:8] for c in cmds[2:]] == [TPU + ["ssh", "t1", Z, "--worker=all"]] * 2 and len(cmds) == 4
  install = shlex.split(remote_of(cmds[2]))
  assert has_seq(install, ["tar", "-xzf", "/tmp/jaxmem-src.tar.gz", "-C", "jaxmem"])
  assert has_seq(install, ["python3.11", "-m", "venv", ".venv"])
  assert has_seq(install, INSTALL)
  assert not any("libtpu_releases" in t for t in install)  # jax[tpu] pulls libtpu from PyPI
  check = remote_of(cmds[3])
  assert check.startswith("cd jaxmem && .venv/bin/python -c ") and "jax.distributed.initialize()" in check
  assert "jax.device_count()" in check and "jax.local_device_count()" in check


def test_setup_remote_dir_and_python():
  cmds = commands(run("setup.sh", REMOTE_DIR="work/jm", REMOTE_PYTHON="python3.12"))
  install = shlex.split(remote_of(cmds[2]))
  assert has_seq(install, ["tar", "-xzf", "/tmp/jaxmem-src.tar.gz", "-C", "work/jm"])
  assert has_seq(install, ["python3.12", "-m", "venv", ".venv"])
  assert remote_of(cmds[3]).startswith("cd work/jm && ")


def test_setup_bucket_mounts_it_on_every_worker():
  cmds = commands(run("setup.sh", "--bucket", "gs://my-bkt/"))
  assert len(cmds) == 5 and cmds[3][:8] == TPU + ["ssh", "t1", Z, "--worker=all"]
  mount = shlex.split(remote_of(cmds[3]))
  assert has_seq(mount, ["gcsfuse", "--implicit-dirs", "--rename-dir-limit=10000", "my-bkt", "/mnt/my-bkt;"])
  assert has_seq(mount, ["sudo", "apt-get", "install", "-y", "-q", "fuse", "gcsfuse;"])


def test_setup_check_only():
  cmds = commands(run("setup.sh", "--check-only", ACCELERATOR="v4-32"))
  assert len(cmds) == 1 and "jax.device_count()" in remote_of(cmds[0])
  assert cmds[0][6:8] == [Z, "--worker=all"]


# ---------------------------------------------------------------- launch.sh

LM = ["--config", "configs/lm_baseline.py"]


def test_launch_single_host_v4_8():
  cmds = commands(run("launch.sh", *LM, "--config.train.n_steps=10", ACCELERATOR="v4-8"))
  assert len(cmds) == 1 and cmds[0][:8] == TPU + ["ssh", "t1", Z, "--worker=all"]
  remote = remote_of(cmds[0])
  assert remote.startswith("cd jaxmem && ")
  assert jaxmem_argv(remote) == [".venv/bin/jaxmem", "train", *LM, "--config.train.n_steps=10",
                                 "--workdir", "runs/tpu", "--no_progress"]
  assert "echo $! > train.pid" in remote and "already running" in remote


def test_launch_pod_slice_v4_32_on_the_shared_mount():
  r = run("launch.sh", "--config=configs/lm_baseline.py:full", "--workdir", "/mnt/bkt/runs/lm",
          "--stop_after", "100", ACCELERATOR="v4-32", ZONE="us-central2-b")
  (cmd,) = commands(r)
  assert cmd[:8] == TPU + ["ssh", "t1", Z, "--worker=all"]
  assert jaxmem_argv(remote_of(cmd)) == [
      ".venv/bin/jaxmem", "train", "--config", "configs/lm_baseline.py:full", "--stop_after", "100",
      "--workdir", "/mnt/bkt/runs/lm", "--no_progress"]


def test_launch_quotes_values_with_spaces():
  (cmd,) = commands(run("launch.sh", *LM, "--config.model.mixer.name=assoc delta", "--workdir", "runs/a b"))
  argv = jaxmem_argv(remote_of(cmd))
  assert argv[4] == "--config.model.mixer.name=assoc delta" and argv[6] == "runs/a b"


@pytest.mark.parametrize("accel", ["v4-16", "v4-32", "v5litepod-16", "v5litepod-32", "v6e-16", "v5p-16"])
@pytest.mark.parametrize("workdir", [None, "runs/lm", "/home/me/runs/lm", "/mnt"])
def test_launch_refuses_a_local_workdir_on_a_multi_host_slice(accel, workdir):
  r = run("launch.sh", *LM, *(["--workdir", workdir] if workdir else []), ACCELERATOR=accel)
  assert r.returncode == 1 and "+ " not in r.stdout
  assert f"ACCELERATOR={accel} is a multi-host slice" in r.stderr
  assert "setup.sh --bucket BUCKET" in r.stderr and "/mnt/BUCKET/runs/NAME" in r.stderr


@pytest.mark.parametrize("accel", ["v4-8", "v5litepod-8", "v6e-8", "v5litepod-4"])
def test_launch_allows_a_local_workdir_on_one_host(accel):
  (cmd,) = commands(run("launch.sh", *LM, "--workdir", "runs/lm", ACCELERATOR=accel))
  assert jaxmem_argv(remote_of(cmd))[-3:] == ["--workdir", "runs/lm", "--no_progress"]


def test_launch_refuses_gs_workdirs():
  r = run("launch.sh", *LM, "--workdir", "gs://bkt/runs/lm", ACCELERATOR="v4-8")
  assert r.returncode == 1 and "+ " not in r.stdout
  assert "local folder named 'gs:'" in r.stderr and "--workdir /mnt/BUCKET/" in r.stderr


def test_launch_reproduce_single_host_only():
  (cmd,) = commands(run("launch.sh", "reproduce", "--only", "lm_baseline", "--only", "mqar",
                        "--config.mqar.n_steps=100", "--out", "reports/full", ACCELERATOR="v5litepod-8"))
  assert jaxmem_argv(remote_of(cmd)) == [
      ".venv/bin/jaxmem", "reproduce", "--only", "lm_baseline", "--only", "mqar",
      "--config.mqar.n_steps=100", "--out", "reports/full", "--no_progress"]
  r = run("launch.sh", "reproduce", ACCELERATOR="v4-32")
  assert r.returncode == 1 and "runs on one host" in r.stderr and "+ " not in r.stdout


def test_launch_stop():
  (cmd,) = commands(run("launch.sh", "--stop", ACCELERATOR="v4-32"))
  assert cmd[:8] == TPU + ["ssh", "t1", Z, "--worker=all"]
  assert 'kill "$(cat train.pid)"' in remote_of(cmd)


# ---------------------------------------------------------------- logs.sh


def test_logs_worker_0_by_default():
  assert commands(run("logs.sh")) == [ssh(0, "tail -n 100 jaxmem/train.log")]


def test_logs_all_workers_follow():
  (cmd,) = commands(run("logs.sh", "--all", "--follow", "--lines", "20", ACCELERATOR="v4-32"))
  assert cmd[:8] == TPU + ["ssh", "t1", Z, "--worker=all"]
  assert remote_of(cmd) == 'tail -n 20 -F jaxmem/train.log | sed -u "s/^/[$(hostname)] /"'


def test_logs_one_worker():
  assert commands(run("logs.sh", "--worker=3", "-f")) == [ssh(3, "tail -n 100 -F jaxmem/train.log")]


# ---------------------------------------------------------------- delete.sh / status.sh


def test_delete_tpu_vm_keeps_the_bucket():
  r = run("delete.sh")
  assert commands(r) == [TPU + ["delete", "t1", Z, "--quiet"]]
  assert "Cloud Storage is not touched" in r.stdout


def test_delete_queued_resource():
  assert commands(run("delete.sh", "--queued", QR_NAME="q7")) == [
      QR + ["delete", "q7", Z, "--quiet", "--force"]]


def test_delete_a_gcs_folder_only_when_asked():
  assert commands(run("delete.sh", "--queued", "--delete-gcs", "gs://bkt/runs/lm")) == [
      QR + ["delete", "t1-qr", Z, "--quiet", "--force"],
      ["gcloud", "storage", "rm", "--recursive", "gs://bkt/runs/lm"]]
  for url in ["gs://bkt", "gs://bkt/", "/mnt/bkt/runs", "bkt/runs"]:
    r = run("delete.sh", "--delete-gcs", url)
    assert r.returncode == 2 and "gs://BUCKET/PATH" in r.stderr and "+ " not in r.stdout


@pytest.mark.parametrize("args,expected", [
    ([], [TPU + ["describe", "t1", Z]]),
    (["--queued"], [QR + ["describe", "t1-qr", Z]]),
    (["--list"], [TPU + ["list", Z], QR + ["list", Z]]),
])
def test_status(args, expected):
  assert commands(run("status.sh", *args)) == expected


def test_status_training():
  (cmd,) = commands(run("status.sh", "--training"))
  assert cmd[:8] == TPU + ["ssh", "t1", Z, "--worker=all"] and "train.pid" in remote_of(cmd)


# ---------------------------------------------------------------- every script


@pytest.mark.parametrize("script", ALL_SCRIPTS)
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help(script, flag):
  r = run(script, flag, dry=False)
  assert r.returncode == 0 and r.stdout.startswith("Usage:") and "--dry-run" in r.stdout
  assert "+ " not in r.stdout and r.stderr == ""


@pytest.mark.parametrize("script,args", [(s, ["--bogus"]) for s in ALL_SCRIPTS] + [
    ("create.sh", ["extra"]),
    ("create.sh", ["--queued", "--preemptible"]),
    ("create.sh", ["--spot", "--preemptible"]),
    ("create.sh", ["--valid-until-duration", "6h"]),
    ("create.sh", ["--queued", "--valid-until-duration"]),
    ("setup.sh", ["--bucket"]),
    ("setup.sh", ["--bucket", "gs://bkt/folder"]),
    ("launch.sh", []),
    ("launch.sh", ["--workdir", "runs/x"]),
    ("launch.sh", [*LM, "--workdir"]),
    ("launch.sh", [*LM, "--workdir", "--dry-run"]),
    ("launch.sh", [*LM, "--config.train.n_steps", "10"]),
    ("launch.sh", [*LM, "--stop_after", "ten"]),
    ("launch.sh", [*LM, "--only", "x"]),
    ("launch.sh", ["reproduce", *LM]),
    ("launch.sh", ["--stop", *LM]),
    ("logs.sh", ["--worker", "x"]),
    ("logs.sh", ["--lines", "-5"]),
    ("delete.sh", ["--delete-gcs"]),
    ("status.sh", ["extra"]),
])
def test_bad_arguments_exit_2(script, args):
  r = run(script, *args)
  assert r.returncode == 2, (r.stdout, r.stderr)
  assert r.stderr.startswith(f"{script}: ") and f"Try '{script} --help'." in r.stderr
  assert "+ " not in r.stdout


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_strict_mode(script):
  head = (SCRIPTS / script).read_text()
  assert 'source "$(dirname "$0")/common.sh"' in head
  assert "set -euo pipefail" in (SCRIPTS / "common.sh").read_text()


# ---------------------------------------------------------------- without --dry-run, on a fake worker


FAKE_GCLOUD = r"""#!/bin/bash
# Stands in for gcloud: records each call; `tpu-vm ssh --command=C` runs C in $FAKE_HOME (one worker).
printf '%s\n' "$*" >> "$FAKE_LOG"
for a in "$@"; do
  case "$a" in --command=*) cd "$FAKE_HOME" && exec bash -c "${a#--command=}" ;; esac
done
case "$*" in *"--format=value(state)"*) echo READY ;; *"--format=value(state.state)"*) echo ACTIVE ;; esac
"""

FAKE_JAXMEM = """#!/bin/bash
echo "jaxmem $*"
exec sleep 30
"""


def test_without_dry_run_commands_run_and_launch_keeps_one_run(tmp_path):
  bin_dir, home = tmp_path / "bin", tmp_path / "home"
  bin_dir.mkdir()
  (bin_dir / "gcloud").write_text(FAKE_GCLOUD)
  venv = home / "jaxmem" / ".venv" / "bin"
  venv.mkdir(parents=True)
  (venv / "jaxmem").write_text(FAKE_JAXMEM)
  for f in (bin_dir / "gcloud", venv / "jaxmem"):
    f.chmod(0o755)
  env = dict(path=f"{bin_dir}:/usr/bin:/bin", FAKE_HOME=str(home), FAKE_LOG=str(tmp_path / "calls"),
             POLL_SECONDS="0")

  r = run("create.sh", "--queued", dry=False, **env)
  assert r.returncode == 0, r.stderr
  assert "+ gcloud compute tpus queued-resources create t1-qr" in r.stderr  # echoed on stderr
  assert "queued resource t1-qr: ACTIVE" in r.stderr and "TPU VM t1: READY" in r.stderr
  calls = (tmp_path / "calls").read_text().splitlines()
  assert calls[0].startswith("compute tpus queued-resources create t1-qr --node-id=t1")
  assert len(calls) == 3

  try:
    r = run("launch.sh", *LM, dry=False, **env)
    assert r.returncode == 0, r.stderr
    pid = int((home / "jaxmem" / "train.pid").read_text())
    os.kill(pid, 0)  # running
    r = run("status.sh", "--training", dry=False, **env)
    assert f"running (pid {pid})" in r.stdout
    r = run("launch.sh", *LM, dry=False, **env)
    assert r.returncode != 0 and "already running" in r.stderr
    r = run("logs.sh", dry=False, **env)
    assert "jaxmem train --config configs/lm_baseline.py --workdir runs/tpu --no_progress" in r.stdout
  finally:
    r = run("launch.sh", "--stop", dry=False, **env)
  assert "stopped pid" in r.stdout
  for _ in range(50):  # the process may take a moment to exit
    r = run("status.sh", "--training", dry=False, **env)
    if "not running" in r.stdout:
      break
    time.sleep(0.1)
  assert "not running" in r.stdout


# ---------------------------------------------------------------- local.sh: N processes on this machine

def test_local_starts_one_process_per_rank_with_its_own_cpu_devices():
  r = run("local.sh", "--processes", "3", "--devices", "2", "--port", "999", "--python", "/x/py", "--",
          "--config", "configs/lm_baseline.py:quick", "--workdir", "runs/three", "--config.train.model_axis=2")
  cmds = commands(r)
  assert len(cmds) == 3
  for i, argv in enumerate(cmds):
    assert argv == [
        "env", "JAXMEM_COORDINATOR=localhost:999", "JAXMEM_NUM_PROCESSES=3", f"JAXMEM_PROCESS_ID={i}",
        "XLA_FLAGS=--xla_force_host_platform_device_count=2", "JAX_PLATFORMS=cpu", "/x/py", "-m", "jaxmem",
        "train", "--distributed", "--config", "configs/lm_baseline.py:quick", "--workdir", "runs/three",
        "--config.train.model_axis=2", ">", f"runs/three.process{i}.log", "2>&1", "&"]


def test_local_help_and_bad_arguments():
  r = run("local.sh", "--help", dry=False)
  assert r.returncode == 0 and r.stdout.startswith("Usage:") and "--dry-run" in r.stdout
  for args in (["--bogus"], ["--processes", "0", "--", "--workdir", "w"],
               ["--devices", "x", "--", "--workdir", "w"], [], ["--", "--config", "c"], ["--port"]):
    r = run("local.sh", *args)
    assert r.returncode == 2 and "+ " not in r.stdout and r.stderr, args
