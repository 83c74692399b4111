"""Training loop: learning, resume equivalence, divergence handling, bad workdirs."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.data import load_corpus
from jaxmem.data.corpora import Corpus
from jaxmem.data.packing import PackedDocuments, split_documents
from jaxmem.models import DNCLM, DNCLMConfig
from jaxmem.models.transformer import TransformerLM
from jaxmem.train import NonFiniteLossError, TrainConfig, TrainTask, read_metrics, train, train_lm
from jaxmem.train.checkpoint import Checkpointer
from jaxmem.train.losses import lm_loss
from tests.conftest import CompileCounter, synthetic_text, tiny_lm_config


def params_of(model):
  return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_a_few_steps_reduce_the_loss(synthetic_data_dir, tmp_path):
  cfg = tiny_lm_config("--config.train.n_steps=30", "--config.train.ckpt_every=30")
  res = train_lm(cfg, tmp_path / "w", progress=False)
  losses = [r["loss"] for r in res.history if "loss" in r]
  assert len(losses) == 30
  assert np.mean(losses[-3:]) < 0.75 * np.mean(losses[:3]), losses
  assert res.final_metrics["val_bpb"] < np.mean(losses[:3]) / np.log(2)


def test_resume_equals_an_uninterrupted_run(synthetic_data_dir, tmp_path):
  """2N steps in one run == N steps, restart from the checkpoint, N more."""
  cfg = tiny_lm_config()
  straight = train_lm(cfg, tmp_path / "a", progress=False)
  first = train_lm(cfg, tmp_path / "b", stop_after=4, progress=False)
  assert first.step == 4 and first.resumed_from is None
  second = train_lm(cfg, tmp_path / "b", progress=False)
  assert second.resumed_from == 4 and second.step == 8
  for a, b in zip(params_of(straight.model), params_of(second.model), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # one history, no duplicated steps, identical per-step losses
  rows_a = [r for r in read_metrics(tmp_path / "a" / "metrics.jsonl") if "loss" in r]
  rows_b = [r for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if "loss" in r]
  assert [r["step"] for r in rows_b] == list(range(1, 9))
  np.testing.assert_allclose([r["loss"] for r in rows_a], [r["loss"] for r in rows_b], rtol=1e-6)
  # a finished run is a no-op on rerun
  assert train_lm(cfg, tmp_path / "b", progress=False).step == 8


def test_keeps_only_the_last_k_checkpoints(synthetic_data_dir, tmp_path):
  cfg = tiny_lm_config("--config.train.ckpt_every=2", "--config.train.keep_checkpoints=2")
  train_lm(cfg, tmp_path / "w", progress=False)
  ck = Checkpointer(tmp_path / "w" / "checkpoints", keep=2)
  assert ck.all_steps() == [6, 8]
  ck.close()


class _Regression(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(3, 1, rngs=rngs)

  def __call__(self, x):
    return self.lin(x)


class _Batches:
  """Regression batches; the batch at ``poison_at`` holds a NaN."""

  def __init__(self, poison_at):
    self.position, self.poison_at = 0, poison_at

  def get_state(self):
    return {"position": self.position}

  def set_state(self, s):
    self.position = s["position"]

  def __next__(self):
    rng = np.random.default_rng(self.position)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    if self.position == self.poison_at:
      x[0, 0] = np.nan
    self.position += 1
    return {"x": x, "y": x.sum(1, keepdims=True)}


def _mse(model, batch):
  return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  cfg = TrainConfig(n_steps=20, lr=0.05, warmup_steps=0, ckpt_every=3, log_every=1)
  task = TrainTask(init_model=_Regression, loss_fn=_mse, train_iter=_Batches(poison_at=7))
  with pytest.raises(NonFiniteLossError, match=r"step 8: loss=nan.*last good checkpoint is step 6"):
    train(task, cfg, tmp_path / "w", progress=False)
  ck = Checkpointer(tmp_path / "w" / "checkpoints", keep=3)
  assert ck.latest_step() == 6
  model = _Regression(nnx.Rngs(0))
  _, params, _ = nnx.split(model, nnx.Param, ...)
  from jaxmem.train import make_optimizer
  tx = make_optimizer(cfg)
  state, meta = ck.restore(6, {"step": jnp.zeros((), jnp.int32), "params": params,
                               "opt_state": tx.init(params)})
  ck.close()
  assert meta["data"] == {"position": 6}
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state))
  rows = read_metrics(tmp_path / "w" / "metrics.jsonl")
  assert max(r["step"] for r in rows) == 7  # the bad step is never logged as a result


class _Dropped(nnx.Module):
  """A linear map under dropout 0.5: every training call draws a mask from the model's dropout stream."""

  def __init__(self, rngs):
    self.lin = nnx.Linear(3, 16, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    return self.drop(self.lin(x)).sum(-1, keepdims=True)


def _mse_and_mask(model, batch):
  # which of the 16 units the mask kept, as one number (a mask id)
  kept = (model.drop(jnp.ones(16)) > 0).astype(jnp.float32) @ (2.0 ** jnp.arange(16))
  return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {"mask_id": kept}


def test_dropout_draws_a_new_mask_every_step_resumes_them_and_evaluates_without(tmp_path):
  """The loop advances the model's RNG counters each step (not one frozen mask), checkpoints them (a resumed
  run draws the uninterrupted run's masks, not step 1's again), and evaluates in eval mode (dropout off)."""
  seen = []

  def evaluate(model, step):
    x = jnp.ones((2, 3))
    seen.append(bool(jnp.all(model(x) == model.lin(x).sum(-1, keepdims=True))))
    return {}

  cfg = TrainConfig(n_steps=6, lr=0.01, warmup_steps=0, ckpt_every=3, log_every=1, eval_every=3)

  def run(workdir, **kw):
    task = TrainTask(init_model=lambda r: _Dropped(nnx.Rngs(0, dropout=1)), loss_fn=_mse_and_mask,
                     train_iter=_Batches(-1), evaluate=evaluate)
    return train(task, cfg, workdir, progress=False, **kw)

  straight = run(tmp_path / "a")
  run(tmp_path / "b", stop_after=3)
  resumed = run(tmp_path / "b")
  assert resumed.resumed_from == 3
  masks = [r["mask_id"] for r in read_metrics(tmp_path / "a" / "metrics.jsonl") if "mask_id" in r]
  assert len(masks) == 6 and len(set(masks)) == 6, masks
  assert masks == [r["mask_id"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if "mask_id" in r]
  for a, b in zip(params_of(straight.model), params_of(resumed.model), strict=True):
    np.testing.assert_array_equal(a, b)
  assert seen and all(seen)
  x = jnp.ones((2, 3))
  np.testing.assert_array_equal(straight.model(x), straight.model(x))   # the returned model: eval mode


def test_unwritable_workdir_raises_value_error(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a folder")
  cfg = TrainConfig(n_steps=2, warmup_steps=0)
  task = TrainTask(init_model=_Regression, loss_fn=_mse, train_iter=_Batches(-1))
  with pytest.raises(ValueError, match=r"`workdir` .*a_file/run.* is not writable"):
    train(task, cfg, blocker / "run", progress=False)


def test_workdir_of_a_different_model_is_refused(synthetic_data_dir, tmp_path):
  train_lm(tiny_lm_config("--config.train.n_steps=2", "--config.train.warmup_steps=0"),
           tmp_path / "w", progress=False)
  other = tiny_lm_config("--config.model.d_model=32", "--config.train.n_steps=2",
                         "--config.train.warmup_steps=0")
  # only the differing field is listed (the saved and the new value), not the two whole configs
  with pytest.raises(ValueError, match=r"different model config \(saved → now: model\.d_model: 16 → 32\)") as e:
    train_lm(other, tmp_path / "w", progress=False)
  assert "vocab_size" not in str(e.value)


def test_a_run_saved_before_a_config_field_existed_still_resumes(synthetic_data_dir, tmp_path):
  # config.json of a run saved before TransformerConfig.ffn existed: the missing field takes its default
  cfg = tiny_lm_config("--config.train.n_steps=2", "--config.train.warmup_steps=0")
  train_lm(cfg, tmp_path / "w", progress=False)
  saved = json.loads((tmp_path / "w" / "config.json").read_text())
  del saved["model"]["ffn"]
  (tmp_path / "w" / "config.json").write_text(json.dumps(saved))
  assert train_lm(cfg, tmp_path / "w", progress=False).resumed_from == 2


def test_config_diff_lists_nested_and_missing_fields():
  from jaxmem.train.lm import config_diff
  old = {"a": 1, "m": {"name": "assoc", "rule": "delta"}, "gone": 2}
  new = {"a": 1, "m": {"name": "assoc", "rule": "hebb"}, "added": [1, 2]}
  assert config_diff(old, new) == ["added: <missing> → [1, 2]", "gone: 2 → <missing>",
                                   "m.rule: 'delta' → 'hebb'"]
  assert config_diff(old, old) == []


def test_config_json_is_written(synthetic_data_dir, tmp_path):
  cfg = tiny_lm_config("--config.train.n_steps=2", "--config.train.warmup_steps=0")
  train_lm(cfg, tmp_path / "w", progress=False)
  saved = json.loads((tmp_path / "w" / "config.json").read_text())
  assert saved["model"]["d_model"] == 16 and saved["train"]["n_steps"] == 2
  assert load_corpus("tinyshakespeare").source.startswith(str(synthetic_data_dir))


def test_weight_decay_applies_to_kernels_and_embeddings_only():
  """The AdamW mask, from the parameters' logical axes (jaxmem.sharding.decays)."""
  from jaxmem.models import TransformerConfig, TransformerLM
  from jaxmem.sharding import decay_mask, path_str
  # built abstractly (only the state's metadata matters): nothing is compiled
  cfg = TransformerConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=2, d_ff=8, max_len=4)
  model = nnx.eval_shape(lambda: TransformerLM(cfg, rngs=nnx.Rngs(0)))
  params = nnx.state(model, nnx.Param)
  mask = jax.tree_util.tree_leaves_with_path(decay_mask(params))
  decayed = sorted(path_str(p) for p, m in mask if m)
  assert decayed == ["blocks/attn/out/kernel", "blocks/attn/qkv/kernel", "blocks/ffn/down/kernel",
                     "blocks/ffn/up/kernel", "embed/embedding"]


_TRACES = []


def _counting_mse(model, batch):
  _TRACES.append(1)   # runs once per trace of the train step, never per step
  return _mse(model, batch)


def test_a_second_identical_run_compiles_nothing(tmp_path):
  """train() keeps its jitted step per (model structure, loss, optimizer config, layout): another seed, a
  resumed run and a rerun of the same config trace and compile nothing (jit caches per function object, so a
  closure built per call would compile every run anew)."""
  import dataclasses
  cfg = TrainConfig(n_steps=4, lr=0.05, warmup_steps=0, ckpt_every=2, log_every=1)
  task = lambda: TrainTask(init_model=_Regression, loss_fn=_counting_mse, train_iter=_Batches(-1))
  _TRACES.clear()
  first = train(task(), cfg, tmp_path / "a", progress=False)
  assert len(_TRACES) == 1
  with CompileCounter() as compiles:
    other_seed = train(task(), dataclasses.replace(cfg, seed=1), tmp_path / "b", progress=False)
    train(task(), cfg, tmp_path / "c", stop_after=2, progress=False)
    resumed = train(task(), cfg, tmp_path / "c", progress=False)
  assert len(_TRACES) == 1 and compiles.n == 0, (len(_TRACES), compiles.n)
  assert resumed.resumed_from == 2
  assert not np.array_equal(params_of(first.model)[0], params_of(other_seed.model)[0])   # a real other run
  # another optimizer config is another program
  train(task(), dataclasses.replace(cfg, lr=0.01), tmp_path / "d", progress=False)
  assert len(_TRACES) == 2


def test_packed_documents_train_the_model_with_their_segment_ids(tmp_path, monkeypatch):
  # data.pack=True: the batches are packed documents and the loss passes their segment_ids to the model (the
  # model sees them: its call records them) with the mask off at document starts; a body that takes no
  # segment_ids is refused before any step
  text = np.frombuffer(synthetic_text(6000).replace(b"lord", b"lord\n\n"), np.uint8)
  corpus = Corpus("tinyshakespeare", {"train": text[:5000], "validation": text[5000:]}, "test")
  seen = []
  original = TransformerLM.__call__
  monkeypatch.setattr(TransformerLM, "__call__", lambda self, tokens, segment_ids=None:
                      (seen.append(segment_ids is not None), original(self, tokens, segment_ids))[1])
  cfg = tiny_lm_config("--config.data.pack=True", "--config.train.n_steps=3", "--config.train.ckpt_every=3")
  res = train_lm(cfg, tmp_path / "packed", corpus=corpus, progress=False)
  assert np.isfinite(res.final_metrics["val_bpb"]) and len([r for r in res.history if "loss" in r]) == 3
  assert seen[0] is True   # the first trace is the training step's
  batch = PackedDocuments(split_documents(corpus["train"], "tinyshakespeare"), 16, 8, seed=0).batch_at(0)
  assert batch["segment_ids"].max() > 1 and 0 < batch["mask"].mean() < 1
  monkeypatch.setattr(TransformerLM, "__call__", original)
  loss, _ = lm_loss(TransformerLM(cfg.model, rngs=nnx.Rngs(0)), {k: jnp.asarray(v) for k, v in batch.items()})
  assert np.isfinite(float(loss))
  monkeypatch.setattr(DNCLM, "__call__", lambda self, tokens: None)   # a body without segment_ids
  with pytest.raises(ValueError, match="needs a body that takes segment_ids; the 'dnc' body does not"):
    train_lm(dataclasses.replace(cfg, model=DNCLMConfig()), tmp_path / "dnc", corpus=corpus, progress=False)
