"""Process-level guarantee: a SIGKILLed ``jaxmem train`` resumes from its last checkpoint and ends where an
uninterrupted run ends. (8 devices == 1 device: ``tests/train/test_sharding.py``.)"""

import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from jaxmem.train import load_trained_lm, train_lm
from jaxmem.train.checkpoint import Checkpointer
from tests.conftest import REPO, TINY_OVERRIDES, subprocess_env, tiny_lm_config, wait_until_paused

pytestmark = pytest.mark.slow


def _params(model):
  return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_sigkilled_run_resumes_and_completes(synthetic_data_dir, tmp_path):
  extra = ["--config.train.n_steps=16", "--config.train.ckpt_every=4"]
  workdir = tmp_path / "killed"
  cmd = [sys.executable, "-m", "jaxmem", "train", "--config", "configs/lm_baseline.py:quick",
         "--workdir", str(workdir), "--no_progress", *TINY_OVERRIDES, *extra]
  # the run stops dead after step 10 (checkpoints 4 and 8 committed, step 12's not yet taken) until killed
  proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(JAXMEM_TEST_PAUSE_AT_STEP=10),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  wait_until_paused([proc])
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  ck = Checkpointer(workdir / "checkpoints", keep=3)
  assert ck.latest_step() == 8
  ck.close()

  rerun = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  resumed, _, step = load_trained_lm(workdir)
  assert step == 16

  straight = train_lm(tiny_lm_config(*extra), tmp_path / "straight", progress=False)
  for a, b in zip(_params(straight.model), _params(resumed), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
