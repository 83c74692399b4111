"""The UniMatrix experiments run end to end at tiny size, and what they report is recomputed here
independently (numpy accuracy / bits per byte from the trained weights); their configs load."""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem import config_files
from jaxmem.cli import main
from jaxmem.experiments import load_all
from jaxmem.experiments.unimatrix import common, lm, recall, three_token
from jaxmem.models.unimatrix.baselines import matched_transformer
from jaxmem.tasks import unimatrix as tt

NAMES = {"unimatrix_recall": recall.RecallSettings, "unimatrix_three_token": three_token.ThreeTokenSettings,
         "unimatrix_lm": lm.LMSettings}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_configs_load(name):
  exp = load_all()[name]
  assert exp.paper == "unimatrix" and exp.settings is NAMES[name]
  quick, full = exp.load_config(True), exp.load_config(False)
  assert isinstance(quick, NAMES[name]) and quick != full
  default, full = (config_files.load_config(f"{exp.config}{v}").to_dict() for v in ("", ":full"))
  assert default == full


def test_unknown_model_name():
  with pytest.raises(ValueError, match="unknown model"):
    common.model_factory("mamba", vocab_size=64, max_len=16)


def keep_models(monkeypatch, module) -> dict:
  kept, orig = {}, module.train_on_stream

  def wrapped(init, stream, n_steps, lr, workdir, progress, **kw):
    model, history = orig(init, stream, n_steps, lr, workdir, progress, **kw)
    kept[workdir.name.split("-")[0]] = model
    return model, history

  monkeypatch.setattr(module, "train_on_stream", wrapped)
  return kept


def numpy_last_position_accuracy(model, stream, n_batches, group=None):
  hits, total = {}, {}
  for i in range(n_batches):
    b = {k: np.asarray(v) for k, v in stream.batch_at(i).items()}
    pred = np.asarray(model(jnp.asarray(b["inputs"])))[:, -1].argmax(-1)
    assert np.all(b["mask"][:, :-1] == 0) and np.all(b["mask"][:, -1] == 1)
    for row in range(len(pred)):
      g = group(b["inputs"][row]) if group else "all"
      hits[g] = hits.get(g, 0) + int(pred[row] == b["targets"][row, -1])
      total[g] = total.get(g, 0) + 1
  return {g: hits[g] / total[g] for g in hits}


@pytest.mark.slow
def test_recall_experiment_tiny(tmp_path, monkeypatch):
  kept = keep_models(monkeypatch, recall)
  out = tmp_path / "r"
  R = "--config.unimatrix_recall."
  args = [R + "models=('core','sparse_pointer_dropout')", R + "seq_len=24", R + "train_steps=3",
          R + "batch_size=4", R + "eval_batches=1", R + "ablation_pairs=(3,)", R + "ablation_rows=(3,)"]
  assert main(["reproduce", "--quick", "--only", "unimatrix_recall", "--out", str(out), "--no_progress",
               *args]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| unimatrix_recall | ok |" in report and "32 slots, no pointer" in report
  results = json.loads((out / "unimatrix_recall" / "results.json").read_text())
  # (the dropout model is scored in eval mode: the numpy recount of its returned model agrees exactly)
  for name, tag in (("core", "core_p4"), ("sparse_pointer_dropout", "sparse_pointer_dropout_p4"),
                    ("ablation/32 slots, no pointer/p3", "ablation3_p3")):
    pairs = 3 if "ablation" in name else 4
    held = tt.recall_stream(recall.EVAL_SEED, batch_size=recall.EVAL_BATCH, num_pairs=pairs, seq_len=24)
    ours = numpy_last_position_accuracy(kept[tag], held, 1)["all"]
    assert abs(results[name]["accuracy"] - ours) < 1e-9, (name, results[name]["accuracy"], ours)
  assert not kept["ablation3_p3"].cfg.pointer and kept["ablation3_p3"].cfg.n_slots == 32
  assert kept["sparse_pointer_dropout_p4"].cfg.dropout == 0.1 and kept["ablation3_p3"].cfg.dropout == 0.0
  core = results["core"]
  assert f"| UniMatrix-Core | {core['params']:,} | {100 * core['accuracy']:.1f} |" in report


@pytest.mark.slow
def test_three_token_experiment_tiny(tmp_path, monkeypatch):
  kept = keep_models(monkeypatch, three_token)
  out = tmp_path / "t"
  args = ["--config.unimatrix_three_token.models=('typed_latent','core')",
          "--config.unimatrix_three_token.train_steps=3", "--config.unimatrix_three_token.batch_size=4",
          "--config.unimatrix_three_token.eval_batches=1"]
  assert main(["reproduce", "--quick", "--only", "unimatrix_three_token", "--out", str(out), "--no_progress",
               *args]) == 0
  results = json.loads((out / "unimatrix_three_token" / "results.json").read_text())
  held = tt.three_token_stream(three_token.EVAL_SEED, batch_size=three_token.EVAL_BATCH, seq_len=49, num_tags=4)
  for name in ("typed_latent", "core"):
    ours = numpy_last_position_accuracy(kept[name], held, 1, group=lambda x: tt.decode_three_token(x).task)
    for task in tt.THREE_TOKEN_TASKS:
      if task in ours:
        assert abs(results[name][task] - ours[task]) < 1e-9, (name, task)


@pytest.mark.slow
def test_lm_experiment_tiny(tmp_path, monkeypatch, synthetic_data_dir):
  out = tmp_path / "l"
  args = ["--config.unimatrix_lm.models=('core','transformer_matched')", "--config.unimatrix_lm.seq_len=16",
          "--config.unimatrix_lm.batch_size=2", "--config.unimatrix_lm.paper_steps=2",
          "--config.unimatrix_lm.curve_steps=4", "--config.unimatrix_lm.eval_every=2",
          "--config.unimatrix_lm.eval_windows=2", "--config.unimatrix_lm.corpora=('tinyshakespeare',)"]
  trained = {}
  orig = lm.train

  def keep(task, cfg, workdir, **kw):
    r = orig(task, cfg, workdir, **kw)
    trained[workdir.name.split("-")[0]] = r.model
    return r

  monkeypatch.setattr(lm, "train", keep)
  assert main(["reproduce", "--quick", "--only", "unimatrix_lm", "--out", str(out), "--no_progress",
               *args]) == 0
  results = json.loads((out / "unimatrix_lm" / "results.json").read_text())["tinyshakespeare"]
  from jaxmem.data import eval_windows, load_corpus
  val = load_corpus("tinyshakespeare")["validation"]
  w = eval_windows(val, 16)
  model = next(m for k, m in trained.items() if k.endswith("curve_core"))
  logits = np.concatenate([np.asarray(model(jnp.asarray(w["inputs"][i:i + 64])), np.float64)
                           for i in range(0, len(w["inputs"]), 64)])
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
      -1, keepdims=True)
  nll = -np.take_along_axis(logp, w["targets"][..., None], -1)[..., 0]
  bpb = float((nll * w["mask"]).sum() / w["mask"].sum() / math.log(2))
  assert abs(results["core"]["final_bpb"] - bpb) < 1e-4, (results["core"]["final_bpb"], bpb)
  assert [s for s, _ in results["core"]["curve"]] == [2, 4]
  assert results["transformer_matched"]["params"] == matched_transformer(
      results["core"]["params"], vocab_size=259, max_len=16)[1]
