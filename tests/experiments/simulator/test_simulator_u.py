"""simulator_u end to end at the smallest size that runs every branch (attention, float64,
encoder and saturating error tables, the size and layer tables, the constructions, the figure): the
report is written through ``jaxmem.experiments.report.reproduce``, and its numbers are the
ones recomputed here from the library (``error_table``, ``build_simulator``,
``construction_errors``) with the same settings; config variants."""

import dataclasses

import pytest

from jaxmem import config_files
from jaxmem.experiments import REGISTRY
from jaxmem.experiments.simulator import simulator_u as exp
from jaxmem.results import markdown_table
from jaxmem.simulator import build_simulator, error_table
from tests.conftest import reproduce_tiny

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`


def tiny():
  # one head count, two lengths below max_len: U runs padded to the sequence of n = 3, the cells of the
  # missing rows hidden by the key mask, and every real query's selection still exact
  return dataclasses.replace(REGISTRY["simulator_u"].load_config(True), max_len=3, heads=(2,),
                             n_values=(1, 2), trials=2, d_model=3, head_dim=2, ffn_dim=3)


def test_simulator_u_tiny_report_holds_the_recomputed_numbers(tmp_path):
  s = tiny()
  out = tmp_path / "r"
  entry, report = reproduce_tiny(out, "simulator_u", s)
  metrics = entry["metrics"]

  # the error tables, recomputed (same seed: the same T, X through the same compiled U)
  common = (s.max_len, s.d_model, s.heads, s.head_dim, s.n_values, s.trials, s.seed)
  f32, f64 = error_table(*common), error_table(*common, reference="float64")
  enc = error_table(*common, ffn_dim=s.ffn_dim)
  sat = error_table(*common, reference="float64", scale=s.saturating_scale)
  rows = [[a.heads, a.n, f"{a.max_abs_err:.2e}", f"{a.max_abs_out:.3g}", f"{a.rel_err:.2e}",
           f"{b.rel_err:.2e}", f"{e.rel_err:.2e}", f"{z.rel_err:.2e}", f"{z.ref_rel_err:.2e}"]
          for a, b, e, z in zip(f32, f64, enc, sat, strict=True)]
  assert len(rows) == len(s.heads) * len(s.n_values)
  assert markdown_table(["heads", "n", "max abs err (f32 ref)", "max |T(X)|", "rel (f32 ref)", "rel (f64 ref)",
                         "rel, encoder", "rel, saturating (f64 ref)", "float32 T(X), saturating (f64 ref)"],
                        rows) in report
  worst = max(r.rel_err for r in f32 + enc)
  assert metrics["worst_rel_err"] == worst and worst <= exp.BOUND
  assert metrics["worst_saturating_rel_err"] == max(z.rel_err for z in sat)
  assert all(r.rel_err <= exp.BOUND for r in f64 + sat) and all(0 < z.ref_rel_err < exp.BOUND for z in sat)

  # U's sizes and layer table, recomputed from the simulators (weights depend on the sizes only)
  for H in s.heads:
    for ffn in (None, s.ffn_dim):
      row = exp.size_row(build_simulator(s.max_len, s.d_model, H, s.head_dim, ffn_dim=ffn))
      assert markdown_table(exp.SIZE_COLUMNS, [row]).splitlines()[-1] in report
  layers = exp.layer_table(build_simulator(s.max_len, s.d_model, s.heads[0], s.head_dim, ffn_dim=s.ffn_dim))
  assert len(layers) == 27 and markdown_table(exp.LAYER_COLUMNS, layers) in report
  assert {r[2] for r in layers} == {"AHAT", "linear", "product a·b", "exp", "reciprocal", "relu"}

  # the constructions, recomputed
  cons = exp.construction_errors(s.seed)
  assert len(cons) == 9 and metrics["constructions"] == {a: e for a, _, e in cons}
  for a, b, e in cons:
    assert e <= 1e-5 and f"| {a} | {b} | {e:.1e} |" in report
  assert metrics["held"] is True


def test_config_variants():
  e = REGISTRY["simulator_u"]
  full, quick = (config_files.load_config(f"{e.config}{v}") for v in (":full", ":quick"))
  assert full.to_dict() != quick.to_dict()
  assert isinstance(e.load_config(False), exp.SimulatorSettings)
  with pytest.raises(ValueError, match="must be 'quick', 'full' or omitted"):
    config_files.load_config(f"{e.config}:tiny")
