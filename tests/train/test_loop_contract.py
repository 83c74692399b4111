"""train()'s contract checks at start (resumable iterator, TensorBoard), the divergence message before any
checkpoint, and the learning rate and tokens/s of the metrics rows."""

import sys

import numpy as np
import pytest

from jaxmem.train import NonFiniteLossError, TrainConfig, TrainTask, read_metrics, train
from jaxmem.train.loop import batch_tokens, make_schedule
from tests.train.test_loop import _Batches, _mse, _Regression

_STEPS = []


def _recording_mse(model, batch):
  _STEPS.append(1)   # runs when the train step is traced: never, if train() refuses the task at start
  return _mse(model, batch)


def _plain_generator():
  while True:
    yield next(_Batches(-1))


@pytest.mark.parametrize("make_iter, missing", [
    (_plain_generator, "get_state, set_state"),
    (lambda: [next(_Batches(-1))] * 4, "__next__, get_state, set_state"),
], ids=["generator", "list"])
def test_a_non_resumable_train_iter_is_refused_before_any_step(tmp_path, make_iter, missing):
  cfg = TrainConfig(n_steps=4, warmup_steps=0, ckpt_every=2, log_every=1)
  task = TrainTask(init_model=_Regression, loss_fn=_recording_mse, train_iter=make_iter())
  _STEPS.clear()
  with pytest.raises(ValueError, match=rf"`task.train_iter` \(\w+\) lacks {missing}.*"
                                       r"jaxmem\.data\.RandomWindows.*jaxmem\.data\.KeyedBatches"):
    train(task, cfg, tmp_path / "w", progress=False)
  assert _STEPS == []
  assert not (tmp_path / "w" / "metrics.jsonl").exists()


def test_nan_before_the_first_checkpoint_says_none_exists_yet(tmp_path):
  cfg = TrainConfig(n_steps=5, lr=0.05, warmup_steps=0, ckpt_every=5, log_every=1)
  task = TrainTask(init_model=_Regression, loss_fn=_mse, train_iter=_Batches(poison_at=0))
  with pytest.raises(NonFiniteLossError, match=r"step 1: loss=nan") as err:
    train(task, cfg, tmp_path / "w", progress=False)
  msg = str(err.value)
  assert "step None" not in msg
  assert "no checkpoint exists yet" in msg
  assert "lower lr" in msg and "token ids" in msg


def test_metrics_rows_carry_the_learning_rate_and_tokens_per_second(tmp_path):
  cfg = TrainConfig(n_steps=6, lr=0.1, warmup_steps=4, ckpt_every=6, log_every=2)
  task = TrainTask(init_model=_Regression, loss_fn=_mse, train_iter=_Batches(-1))
  train(task, cfg, tmp_path / "w", progress=False)
  rows = [r for r in read_metrics(tmp_path / "w" / "metrics.jsonl") if "loss" in r]
  assert [r["step"] for r in rows] == [2, 4, 6]
  # the row of step s: the rate of the update that produced it (optax counts it as update s - 1)
  schedule = make_schedule(cfg)
  assert [r["lr"] for r in rows] == [float(schedule(s - 1)) for s in (2, 4, 6)]
  np.testing.assert_allclose([r["lr"] for r in rows[:2]], [0.025, 0.075])   # linear warmup 0 -> 0.1 over 4
  assert all(np.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0 for r in rows)


def test_batch_tokens_counts_rows_times_time_of_the_inputs():
  assert batch_tokens({"inputs": np.zeros((4, 5), np.int32), "targets": np.zeros((4, 5))}) == 20
  assert batch_tokens({"inputs": np.zeros((4, 5, 3))}) == 20
  assert batch_tokens({"inputs": np.zeros((4,), np.int32)}) == 4     # no time axis: one token per row
  assert batch_tokens({"x": np.zeros((4, 3)), "y": np.zeros((4, 1))}) == 4


def test_tensorboard_is_off_by_default(tmp_path):
  assert TrainConfig().tensorboard is False
  cfg = TrainConfig(n_steps=2, warmup_steps=0, ckpt_every=2, log_every=1)
  train(TrainTask(init_model=_Regression, loss_fn=_mse, train_iter=_Batches(-1)), cfg, tmp_path / "w",
        progress=False)
  assert not (tmp_path / "w" / "tb").exists()


def test_tensorboard_without_tensorboardx_is_refused_at_start(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)   # `import tensorboardX` raises ImportError
  cfg = TrainConfig(n_steps=2, warmup_steps=0, ckpt_every=2, log_every=1, tensorboard=True)
  task = TrainTask(init_model=_Regression, loss_fn=_recording_mse, train_iter=_Batches(-1))
  _STEPS.clear()
  with pytest.raises(ValueError, match=r"tensorboard.*pip install 'jaxmem\[tensorboard\]'"):
    train(task, cfg, tmp_path / "w", progress=False)
  assert _STEPS == [] and not (tmp_path / "w" / "metrics.jsonl").exists()


class _FakeSummaryWriter:
  """Records what train() sends to tensorboardX's SummaryWriter (not installed in the test environment)."""
  made = []

  def __init__(self, logdir, **kwargs):
    self.logdir, self.kwargs, self.scalars, self.closed = logdir, kwargs, [], False
    _FakeSummaryWriter.made.append(self)

  def add_scalar(self, tag, value, global_step=None):
    self.scalars.append((tag, value, global_step))

  def flush(self):
    pass

  def close(self):
    self.closed = True


def test_tensorboard_gets_the_scalars_of_the_metrics_rows(tmp_path, monkeypatch):
  fake = type(sys)("tensorboardX")
  fake.SummaryWriter = _FakeSummaryWriter
  monkeypatch.setitem(sys.modules, "tensorboardX", fake)
  _FakeSummaryWriter.made.clear()
  cfg = TrainConfig(n_steps=4, warmup_steps=0, ckpt_every=2, log_every=2, eval_every=4, tensorboard=True)
  task = TrainTask(init_model=_Regression, loss_fn=_mse, train_iter=_Batches(-1),
                   evaluate=lambda model, step: {"val_score": 0.5})
  train(task, cfg, tmp_path / "w", stop_after=2, progress=False)
  train(task, cfg, tmp_path / "w", progress=False)   # resumed at step 2: events after it are purged
  first, second = _FakeSummaryWriter.made
  assert first.logdir == str(tmp_path / "w" / "tb") and second.logdir == first.logdir
  assert "purge_step" not in first.kwargs and second.kwargs["purge_step"] == 3
  assert first.closed and second.closed
  rows = read_metrics(tmp_path / "w" / "metrics.jsonl")
  want = [(k, v, r["step"]) for r in rows for k, v in r.items() if k not in ("step", "time_s")]
  assert first.scalars + second.scalars == want
  assert {"loss", "lr", "tokens_per_s", "grad_norm", "val_score"} <= {tag for tag, _, _ in want}
