"""The depth-vs-width experiment runs end to end at tiny size; shapes and guards are right."""

import dataclasses

import pytest

from jaxmem.cli import main
from jaxmem.experiments import depth_width as exp


def tiny(quick):
  return exp.Settings(tasks=(exp.RecallTask("2-hop recall", 2, 2),),
                      shapes=((2, 16), (4, 8)), rules=("delta",), head_dim=8, vocab_size=32,
                      seq_len=16, n_steps=3, batch_size=4, eval_batches=1)


def test_depth_width_experiment_tiny(tmp_path, monkeypatch):
  monkeypatch.setattr(exp, "settings", tiny)
  out = tmp_path / "r"
  assert main(["reproduce", "--quick", "--only", "assoc_depth_width", "--out", str(out), "--no_progress"]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| assoc_depth_width | ok |" in report
  assert "| 2-hop recall | delta |" in report and "| L=2, d=16 | 2 | 8 |" in report
  assert (out / "assoc_depth_width" / "depth_width.png").exists()


def test_model_shapes_hold_head_width_fixed():
  s = exp.settings(True)
  params = []
  for L, d in s.shapes:
    c = exp.model_config("delta", L, d, s)
    assert c.n_layers == L and c.head_dim == s.head_dim and c.memory == "assoc" and c.key_norm
    assert c.short_conv == s.short_conv
    params.append(L * d * d)
  assert max(params) <= 1.15 * min(params)  # "equal parameters" within integer head counts
  assert exp.model_config("softmax", 2, 64, s).memory == "softmax"
  with pytest.raises(ValueError, match="head_dim"):
    exp.model_config("delta", 2, 60, s)


def test_shapes_too_shallow_for_the_hops_are_refused(tmp_path, monkeypatch):
  monkeypatch.setattr(exp, "settings", lambda q: dataclasses.replace(tiny(q), shapes=((1, 16),)))
  out = tmp_path / "r"
  main(["reproduce", "--quick", "--only", "assoc_depth_width", "--out", str(out), "--no_progress"])
  assert "L >= hops" in (out / "REPORT.md").read_text()
