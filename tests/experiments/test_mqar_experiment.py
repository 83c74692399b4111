"""The MQAR experiment runs end to end at tiny size; its loss/accuracy are computed correctly."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.cli import main
from jaxmem.experiments import mqar as exp


def test_recall_loss_counts_only_query_positions():
  class Oracle:
    def __call__(self, inputs):
      logits = jnp.full(inputs.shape + (8,), -10.0)
      return logits.at[0, 1, 5].set(10.0).at[0, 3, 2].set(10.0)  # right at t=1, wrong at t=3
  batch = {"inputs": jnp.zeros((1, 4), jnp.int32), "targets": jnp.array([[0, 5, 0, 7]]),
           "mask": jnp.array([[0.0, 1.0, 0.0, 1.0]])}
  loss, metrics = exp.recall_loss(Oracle(), batch)
  assert float(metrics["accuracy"]) == 0.5
  assert float(loss) > 0


def test_state_sizes():
  s = exp.settings(True)
  soft = exp.model_config("softmax", 64, s)
  delta = exp.model_config("delta", 64, s)
  assert exp.state_floats(soft, 64) == 2 * 2 * 64 * 64
  assert exp.state_floats(delta, 64) == 2 * 2 * 32 * 32
  assert delta.key_norm and not exp.model_config("hebb", 64, s).key_norm


def numpy_accuracy(model, stream, n_batches: int) -> float:
  """Query-position accuracy written out with numpy (argmax of the logits vs the targets where mask = 1),
  mean over batches; independent of ``recall_loss`` / ``recall_accuracy``."""
  accs = []
  for i in range(n_batches):
    b = {k: np.asarray(v) for k, v in stream.batch_at(i).items()}
    hit = (np.asarray(model(jnp.asarray(b["inputs"]))).argmax(-1) == b["targets"]) & (b["mask"] > 0)
    accs.append(hit.sum() / (b["mask"] > 0).sum())
  return float(np.mean(accs))


@pytest.mark.slow
def test_mqar_experiment_tiny(tmp_path, monkeypatch):
  tiny = dict(vocab_size=64, seq_len=16, num_kv_pairs=2, widths=(16,), n_layers=1, n_heads=2, n_steps=3,
              batch_size=4, lr=1e-3, eval_batches=1)
  monkeypatch.setattr(exp, "settings", lambda quick: tiny)
  trained, train_recall = {}, exp.train_recall

  def keep(mcfg, stream, cfg, workdir, progress):   # the trained models, to re-evaluate them here
    trained[workdir.name] = model = train_recall(mcfg, stream, cfg, workdir, progress)
    return model

  monkeypatch.setattr(exp, "train_recall", keep)
  out = tmp_path / "r"
  assert main(["reproduce", "--quick", "--only", "mqar", "--out", str(out), "--no_progress"]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| mqar | ok |" in report
  for name in exp.MODELS:
    assert f"| {name} |" in report
  assert (out / "mqar" / "accuracy_vs_state.png").exists()
  acc = [float(r.split("|")[2].split()[0]) for r in report.splitlines() if r.startswith("| hebb |")]
  assert len(acc) == 1 and 0.0 <= acc[0] <= 1.0 and np.isfinite(acc[0])
  # the accuracy (results.json, the table) recomputed from the trained weights on the held-out stream, and
  # every model's state size from the closed forms 2·L·T·d (KV cache) / L·H·(d/H)² (one S per head)
  results = json.loads((out / "mqar" / "results.json").read_text())
  held_out = exp.MQARStream(1_000_000, batch_size=64, vocab_size=64, seq_len=16, num_kv_pairs=2)
  assert sorted(trained) == sorted(f"{n}_d16" for n in exp.MODELS)
  for name in exp.MODELS:
    r = results[f"{name}/d16"]
    assert r["state_floats"] == (2 * 16 * 16 if name == "softmax" else 2 * (16 // 2) ** 2)
    if name in ("softmax", "delta"):   # one KV-cache and one circuit model: the accuracy code is shared
      ours = numpy_accuracy(trained[f"{name}_d16"], held_out, tiny["eval_batches"])
      assert abs(r["accuracy"] - ours) < 1e-6, (name, r["accuracy"], ours)
    assert f"| {name} | {r['accuracy']:.3f} ({r['state_floats']:,}) |" in report
