"""The TPU VM recipes produce the intended gcloud commands (--dry-run, no gcloud needed)."""

import subprocess

import pytest

from tests.conftest import REPO


def dry(script, *args, **env):
  r = subprocess.run(["bash", str(REPO / "tpu_scripts" / script), "--dry-run", *args],
                     capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}, cwd=REPO)
  return r


def test_create():
  r = dry("create.sh", "--spot", TPU_NAME="t1", ACCELERATOR="v5litepod-8")
  assert r.returncode == 0, r.stderr
  assert "gcloud compute tpus tpu-vm create t1" in r.stdout and "v5litepod-8" in r.stdout
  assert "--spot" in r.stdout


def test_setup_installs_on_all_workers():
  r = dry("setup.sh", TPU_NAME="t1")
  assert r.returncode == 0, r.stderr
  assert "--worker=all" in r.stdout and "jax\\[tpu\\]" in r.stdout


def test_launch_passes_config_and_overrides():
  r = dry("launch.sh", "--config", "configs/lm_baseline.py", "--config.train.n_steps=10",
          "--workdir", "/mnt/runs/a", TPU_NAME="t1")
  assert r.returncode == 0, r.stderr
  assert "jaxmem\\ train" in r.stdout or "jaxmem train" in r.stdout
  assert "--config.train.n_steps=10" in r.stdout and "/mnt/runs/a" in r.stdout
  assert "JAXMEM_DISTRIBUTED=1" in r.stdout


@pytest.mark.parametrize("script,args", [("create.sh", ["--bogus"]), ("launch.sh", [])])
def test_bad_arguments_fail(script, args):
  assert dry(script, *args).returncode == 2
