"""The MQAR experiment runs end to end at tiny size; its models and state sizes are right.

(Its loss / accuracy code is :mod:`jaxmem.train.recall`'s, tested in ``tests/train/test_recall.py``.)
"""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.cli import main
from jaxmem.experiments import REGISTRY
from jaxmem.experiments.pavlovian import mqar as exp
from jaxmem.models import AssocConfig, SoftmaxConfig
from jaxmem.tasks.mqar import mqar_stream
from tests.conftest import forward
from tests.experiments.pavlovian.helpers import keep_trained_models

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`

# tiny settings, given on the command line as --config.mqar.<field>=<value>
# (one KV-cache and one circuit model: the training / scoring code is shared by all six)
TINY = dict(vocab_size=64, seq_len=16, num_kv_pairs=2, widths=(16,), n_layers=1, n_heads=2, short_conv=0,
            n_steps=3, batch_size=4, lr=1e-3, eval_batches=1, models=("softmax", "delta"))
TINY_ARGS = [f"--config.mqar.{k}={v!r}" for k, v in TINY.items()]


def quick_settings() -> exp.MQARSettings:
  return REGISTRY["mqar"].load_config(quick=True)


def test_state_sizes():
  s = quick_settings()
  soft = exp.model_config("softmax", 64, s)
  delta = exp.model_config("delta", 64, s)
  conv = (s.short_conv - 1) * 3 * 64   # the short convolution's last K − 1 inputs of q, k, v, per layer
  assert s.short_conv == 4
  assert soft.state_floats(64) == 2 * (2 * 64 * 64 + conv)
  assert delta.state_floats(64) == 2 * (2 * 32 * 32 + conv)
  assert isinstance(soft.mixer, SoftmaxConfig) and isinstance(delta.mixer, AssocConfig)
  assert delta.mixer.key_norm and not exp.model_config("hebb", 64, s).mixer.key_norm


def test_tiny_overrides_reach_the_settings():
  s = REGISTRY["mqar"].load_config(True, [a[len("--config.mqar."):] for a in TINY_ARGS])
  assert s == exp.MQARSettings(**TINY)
  assert quick_settings().models == exp.MODELS == REGISTRY["mqar"].load_config(False).models  # all six
  assert exp.MQARSettings(**(TINY | {"models": ["delta", "softmax"]})).models == ("softmax", "delta")
  with pytest.raises(ValueError, match="unknown MQAR models"):
    exp.MQARSettings(**(TINY | {"models": ("delta", "lstm")}))


def numpy_accuracy(model, stream, n_batches: int) -> float:
  """Query-position accuracy written out with numpy (argmax of the logits vs the targets where mask = 1),
  mean over batches; independent of ``recall_loss`` / ``recall_accuracy``."""
  accs = []
  for i in range(n_batches):
    b = {k: np.asarray(v) for k, v in stream.batch_at(i).items()}
    hit = (np.asarray(forward(model, jnp.asarray(b["inputs"]))).argmax(-1) == b["targets"]) & (b["mask"] > 0)
    accs.append(hit.sum() / (b["mask"] > 0).sum())
  return float(np.mean(accs))


def test_mqar_experiment_tiny(tmp_path, monkeypatch):
  trained = keep_trained_models(monkeypatch, exp)  # the trained models, to re-evaluate here
  out = tmp_path / "r"
  assert main(["reproduce", "--quick", "--only", "mqar", "--out", str(out), "--no_progress", *TINY_ARGS]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| mqar | ok |" in report
  for name in exp.MODELS:
    assert (f"| {name} |" in report) == (name in TINY["models"])
  assert (out / "mqar" / "accuracy_vs_state.png").exists()
  acc = [float(r.split("|")[2].split()[0]) for r in report.splitlines() if r.startswith("| delta |")]
  assert len(acc) == 1 and 0.0 <= acc[0] <= 1.0 and np.isfinite(acc[0])
  # the accuracy (results.json, the table) recomputed from the trained weights on the held-out stream, and
  # every model's state size from the closed forms 2·L·T·d (KV cache) / L·H·(d/H)² (one S per head)
  results = json.loads((out / "mqar" / "results.json").read_text())
  held_out = mqar_stream(1_000_000, batch_size=64, vocab_size=64, seq_len=16, num_kv_pairs=2)
  assert sorted(trained) == sorted(f"{n}_d16" for n in TINY["models"]) and len(results) == 2
  for name in TINY["models"]:
    r = results[f"{name}/d16"]
    assert r["state_floats"] == (2 * 16 * 16 if name == "softmax" else 2 * (16 // 2) ** 2)
    ours = numpy_accuracy(trained[f"{name}_d16"], held_out, TINY["eval_batches"])
    assert abs(r["accuracy"] - ours) < 1e-6, (name, r["accuracy"], ours)
    assert f"| {name} | {r['accuracy']:.3f} ({r['state_floats']:,}) |" in report
  summary = f"width 16: softmax {results['softmax/d16']['accuracy']:.3f}, best rule delta " \
            f"{results['delta/d16']['accuracy']:.3f}"
  assert f"| mqar | ok | {summary} |" in report


def test_every_registered_mixer_is_an_mqar_model_with_its_state_size():
  # a new memory is selected by its registry name and reports its own state size (no edit to the experiment)
  from jaxmem.models import mixers
  s = quick_settings()
  for name in mixers.names():
    assert exp.MQARSettings(**{**dataclasses.asdict(s), "models": ("softmax", name)}).models[-1] == name
    mcfg = exp.model_config(name, 64, s)
    assert mcfg.mixer.name == name
    per_layer = mcfg.mixer.state_floats(d_model=64, n_heads=s.n_heads, seq_len=s.seq_len)
    assert mcfg.state_floats(s.seq_len) == s.n_layers * per_layer > 0
  with pytest.raises(ValueError, match="unknown MQAR models"):
    exp.MQARSettings(**{**dataclasses.asdict(s), "models": ("no_such_memory",)})
