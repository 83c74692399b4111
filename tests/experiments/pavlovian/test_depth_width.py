"""The depth-vs-width experiment runs end to end at tiny size; shapes and guards are right."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.cli import main
from jaxmem.experiments import REGISTRY
from jaxmem.experiments.pavlovian import depth_width as exp
from jaxmem.experiments.report import reproduce
from jaxmem.models import AssocConfig, SoftmaxConfig
from tests.conftest import forward
from tests.experiments.pavlovian.helpers import keep_trained_models

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`

# tiny settings, given on the command line as --config.assoc_depth_width.<field>=<value>
TINY = dict(tasks=({"name": "2-hop recall", "hops": 2, "num_items": 2},), shapes=((2, 16), (4, 8)),
            rules=("delta",), head_dim=8, vocab_size=32, seq_len=16, n_steps=3, batch_size=4, eval_batches=1,
            seeds=(0, 1))   # two seeds: the per-seed spread and the seed wins; one compile per shape
TINY_ARGS = [f"--config.assoc_depth_width.{k}={v!r}" for k, v in TINY.items()]


def tiny() -> exp.DepthWidthSettings:
  """The quick settings with TINY's fields (what the command line above gives)."""
  return REGISTRY["assoc_depth_width"].load_config(True, [a[len("--config.assoc_depth_width."):]
                                                          for a in TINY_ARGS])


def test_tiny_settings():
  s = tiny()
  quick = REGISTRY["assoc_depth_width"].load_config(True)
  assert s == dataclasses.replace(quick, tasks=(exp.RecallTask("2-hop recall", 2, 2),),
                                  shapes=((2, 16), (4, 8)), rules=("delta",), head_dim=8, vocab_size=32,
                                  seq_len=16, n_steps=3, batch_size=4, eval_batches=1, seeds=(0, 1))
  assert quick.seeds == (0, 1, 2) and s.short_conv == 4 and s.lr == 3e-3   # the quick size's, unchanged
  # a task may also be given as a (name, hops, num_items) sequence
  assert dataclasses.replace(s, tasks=(("MQAR", 1, 8),)).tasks == (exp.RecallTask("MQAR", 1, 8),)


def test_depth_width_experiment_tiny(tmp_path, monkeypatch):
  trained = keep_trained_models(monkeypatch, exp)  # the trained models, to re-evaluate here
  out = tmp_path / "r"
  assert main(["reproduce", "--quick", "--only", "assoc_depth_width", "--out", str(out), "--no_progress",
               *TINY_ARGS]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| assoc_depth_width | ok |" in report
  assert "| 2-hop recall | delta |" in report and "| L=2, d=16 | 2 | 8 |" in report
  assert (out / "assoc_depth_width" / "depth_width.png").exists()

  # independent of the experiment's summary: the per-seed accuracies it stored, checked against the trained
  # weights (seed 0, numpy argmax at query positions), and the mean / verdict / seed wins recomputed from them
  s = tiny()
  task = s.tasks[0]
  runs = json.loads((out / "assoc_depth_width" / "results.json").read_text())
  accs = {(L, d): runs[f"{task.name}/delta/{L}/{d}"]["accuracies"] for L, d in s.shapes}
  assert sorted(trained) == sorted(f"2hop_delta_L{L}_d{d}_s{seed}" for L, d in s.shapes for seed in s.seeds)
  held_out = exp.stream(task, s, seed=1_000_000, batch_size=64).batch_at(0)
  b = {k: np.asarray(v) for k, v in held_out.items()}
  for L, d in s.shapes:
    logits = np.asarray(forward(trained[f"2hop_delta_L{L}_d{d}_s0"], jnp.asarray(b["inputs"])))
    ours = float(((logits.argmax(-1) == b["targets"]) & (b["mask"] > 0)).sum() / (b["mask"] > 0).sum())
    assert abs(accs[(L, d)][0] - ours) < 1e-6, ((L, d), accs[(L, d)][0], ours)
  wide, deep = (float(np.mean(accs[shape])) for shape in (s.shapes[0], s.shapes[-1]))
  wins = sum(x > y for x, y in zip(accs[s.shapes[0]], accs[s.shapes[-1]], strict=True))
  means = [np.mean(accs[shape]) for shape in s.shapes]
  best = "L={}, d={}".format(*s.shapes[int(np.argmax(means))])
  assert (f"| 2-hop recall | delta | {wide:.3f} | {deep:.3f} | {wins}/{len(s.seeds)} | {best} | "
          f"{'yes' if wide >= deep else 'NO'} |") in report
  metrics = json.loads((out / "results.json").read_text())["assoc_depth_width"]["metrics"]
  assert metrics["wide_beats_deep"] == int(wide >= deep) and metrics["cells"] == 1
  for (L, d), m in zip(s.shapes, means, strict=True):
    assert metrics[f"{task.name}/delta/{L}/{d}"] == pytest.approx(m, abs=1e-12)


def test_model_shapes_hold_head_width_fixed():
  s = REGISTRY["assoc_depth_width"].load_config(quick=True)
  params = []
  for L, d in s.shapes:
    c = exp.model_config("delta", L, d, s)
    assert c.n_layers == L and c.head_dim == s.head_dim
    assert isinstance(c.mixer, AssocConfig) and c.mixer.key_norm
    assert c.mixer.rule == "delta" and c.mixer.short_conv == s.short_conv
    params.append(L * d * d)
  assert max(params) <= 1.15 * min(params)  # "equal parameters" within integer head counts
  assert isinstance(exp.model_config("softmax", 2, 64, s).mixer, SoftmaxConfig)
  with pytest.raises(ValueError, match="head_dim"):
    exp.model_config("delta", 2, 60, s)


def test_shapes_too_shallow_for_the_hops_are_refused(tmp_path):
  out = tmp_path / "r"
  reproduce(out, quick=True, only=["assoc_depth_width"], progress=False, echo=lambda *a: None,
            configs={"assoc_depth_width": dataclasses.replace(tiny(), shapes=((1, 16),))})
  assert "L >= hops" in (out / "REPORT.md").read_text()
