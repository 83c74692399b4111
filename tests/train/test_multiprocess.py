"""A real 2-process run on this machine: ``jax.distributed`` with a localhost coordinator and gloo CPU
collectives, 2 processes × 4 CPU devices on a (data=2, model=4) mesh, driven through ``jaxmem train
--distributed`` exactly as tpu_scripts/launch.sh drives TPU hosts. It trains, checkpoints, loses one
process to SIGKILL, resumes, and ends at the parameters of an uninterrupted single-process run."""

import json
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from jaxmem.train import load_trained_lm, read_metrics, train_lm
from jaxmem.train.checkpoint import Checkpointer
from tests.conftest import REPO, TINY_OVERRIDES, subprocess_env, tiny_lm_config, wait_until_paused

STEPS = 16
EXTRA = [f"--config.train.n_steps={STEPS}", "--config.train.ckpt_every=4", "--config.model.n_heads=4",
         "--config.train.model_axis=4"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(workdir, extra_by_process=((), ()), **env) -> list:
  port = _free_port()
  procs = []
  for pid, extra in enumerate(extra_by_process):
    cmd = [sys.executable, "-m", "jaxmem", "train", "--distributed", "--config", "configs/lm_baseline.py:quick",
           "--workdir", str(workdir), "--no_progress", *TINY_OVERRIDES, *EXTRA, *extra]
    e = subprocess_env(JAXMEM_COORDINATOR=f"localhost:{port}", JAXMEM_NUM_PROCESSES=2, JAXMEM_PROCESS_ID=pid,
                       XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
                       JAXMEM_INIT_TIMEOUT_S=120, **env)
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True))
  return procs


def _finish(procs, timeout=400) -> list:
  outs = []
  for p in procs:
    out, _ = p.communicate(timeout=timeout)
    outs.append(out)
  return outs


@pytest.mark.slow
def test_two_processes_train_survive_a_sigkill_resume_and_match_one_process(synthetic_data_dir, tmp_path):
  workdir = tmp_path / "two"
  t0 = time.time()
  # both processes stop dead after step 10 (checkpoints 4 and 8 committed) until killed
  procs = _launch(workdir, JAXMEM_TEST_PAUSE_AT_STEP=10)
  wait_until_paused(procs)
  procs[1].send_signal(signal.SIGKILL)   # one host dies; the other cannot go on without its peer
  procs[1].wait()
  t_kill = time.time()
  procs[0].send_signal(signal.SIGKILL)
  _finish(procs)
  assert procs[1].returncode == -signal.SIGKILL and procs[0].returncode != 0
  ck = Checkpointer(workdir / "checkpoints", keep=3)
  killed_at = ck.latest_step()
  ck.close()
  assert killed_at == 8

  t_resume = time.time()
  procs = _launch(workdir)
  outs = _finish(procs)
  assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
  t_end = time.time()
  assert all(f'"step": {STEPS}' in o for o in outs)
  rows = [r for r in read_metrics(workdir / "metrics.jsonl") if "loss" in r]
  assert [r["step"] for r in rows] == list(range(1, STEPS + 1))   # process 0 alone wrote: one history
  resumed, cfg, step = load_trained_lm(workdir)
  assert step == STEPS and cfg.train.model_axis == 4

  straight = train_lm(tiny_lm_config(*EXTRA, "--config.train.model_axis=1"), tmp_path / "one", progress=False,
                      devices=[jax.devices()[0]])
  # the final evaluation, each process feeding its rows of every validation batch, is the 1-device one
  finals = [json.loads(o.strip().splitlines()[-1]) for o in outs]
  for f in finals:
    np.testing.assert_allclose(f["val_bpb"], straight.final_metrics["val_bpb"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(nnx.state(straight.model, nnx.Param)),
                  jax.tree.leaves(nnx.state(resumed, nnx.Param)), strict=True):
    np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
  print(f"\n2-process run: killed at step 10 (checkpoint {killed_at}) after {t_kill - t0:.1f}s; resume to "
        f"step {STEPS} took {t_end - t_resume:.1f}s")


def test_processes_that_disagree_on_the_config_stop_with_a_clear_error(synthetic_data_dir, tmp_path, capsys,
                                                                        monkeypatch):
  """In-process: this process is process 0 of 2 and the all-gathered config fingerprints say process 1
  holds another LM config (here: another lr). `jaxmem train` refuses before training, exit code 2. (Processes
  that agree pass the same check for real in the 2-process test above.)"""
  from jax.experimental import multihost_utils

  from jaxmem import distributed
  from jaxmem.cli import main
  other = distributed.fingerprint({"another": "config"})

  def allgather(digest):   # process 0's own digest, and process 1's other one
    theirs = np.frombuffer(bytes.fromhex(other), np.uint8).astype(np.int32)
    return np.stack([np.asarray(digest), theirs])

  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
  rc = main(["train", "--config", "configs/lm_baseline.py:quick", "--workdir", str(tmp_path / "w"),
             "--no_progress", *TINY_OVERRIDES, *EXTRA])
  assert rc == 2
  err = capsys.readouterr().err
  assert "the processes disagree on the LM config: processes [1] differ from process 0" in err
  assert not (tmp_path / "w" / "checkpoints").exists()
