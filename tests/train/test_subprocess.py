"""Process-level guarantees: a SIGKILLed run resumes; 8 devices match 1 device."""

import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest
from flax import nnx

from jaxmem.train import load_trained_lm, train_lm
from jaxmem.train.checkpoint import Checkpointer
from tests.conftest import REPO, TINY_OVERRIDES, subprocess_env, tiny_lm_config

pytestmark = pytest.mark.slow


def _params(model):
  return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_sigkilled_run_resumes_and_completes(synthetic_data_dir, tmp_path):
  extra = ["--config.train.n_steps=24", "--config.train.ckpt_every=4"]
  workdir = tmp_path / "killed"
  cmd = [sys.executable, "-m", "jaxmem", "train", "--config", "configs/lm_baseline.py:quick",
         "--workdir", str(workdir), "--no_progress", *TINY_OVERRIDES, *extra]
  env = subprocess_env(JAXMEM_TEST_STEP_DELAY=0.25)
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  ckpt_dir = workdir / "checkpoints"
  deadline = time.time() + 120
  while time.time() < deadline and proc.poll() is None:
    if (ckpt_dir / "8").is_dir():  # mid-training: at least two checkpoints written
      break
    time.sleep(0.05)
  assert proc.poll() is None, "training ended before it could be killed:\n" + proc.stdout.read().decode()
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  ck = Checkpointer(ckpt_dir, keep=3)
  killed_at = ck.latest_step()
  ck.close()
  assert killed_at is not None and 4 <= killed_at < 24

  rerun = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                         timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  resumed, _, step = load_trained_lm(workdir)
  assert step == 24

  straight = train_lm(tiny_lm_config(*extra), tmp_path / "straight", progress=False)
  for a, b in zip(_params(straight.model), _params(resumed), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


_MULTI = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from flax import nnx
    assert jax.device_count() == 8, jax.devices()
    from jaxmem.train import train_lm
    from tests.conftest import tiny_lm_config
    res = train_lm(tiny_lm_config("--config.train.n_steps=5"), sys.argv[1], progress=False)
    leaves = jax.tree.leaves(nnx.state(res.model, nnx.Param))
    np.savez(sys.argv[2], *[np.asarray(x) for x in leaves])
    try:
      train_lm(tiny_lm_config("--config.data.batch_size=12"), sys.argv[1] + "_bad", progress=False)
    except ValueError as e:
      print("DIVISIBILITY:", e)
""")


def test_eight_fake_devices_match_one_device(synthetic_data_dir, tmp_path):
  out = tmp_path / "multi.npz"
  env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=8",
                       JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-c", _MULTI, str(tmp_path / "w8"), str(out)], cwd=REPO,
                     env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "DIVISIBILITY: batch size 12" in r.stdout and "8 devices" in r.stdout
  single = train_lm(tiny_lm_config("--config.train.n_steps=5"), tmp_path / "w1", progress=False)
  multi = np.load(out)
  leaves = _params(single.model)
  assert len(multi.files) == len(leaves)
  for i, a in enumerate(leaves):
    np.testing.assert_allclose(multi[f"arr_{i}"], a, rtol=1e-5, atol=1e-6)
