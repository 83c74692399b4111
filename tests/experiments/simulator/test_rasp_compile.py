"""rasp_compile end to end at the smallest size that runs every branch (compiled rows, the
tracr comparison, a program skipped for its length, the figure): the report is written
through ``jaxmem.experiments.report.reproduce`` and its sizes and input counts are the ones
recomputed here (``rasp.compile`` and ``conformance.inputs_for``, no forward pass); every row
exact. Its config file and settings; the max_params refusal reported, not raised."""

import dataclasses

import pytest

from jaxmem import config_files, rasp
from jaxmem.experiments import REGISTRY, RunContext
from jaxmem.experiments.simulator import rasp_compile as exp
from jaxmem.rasp import conformance, programs
from tests.conftest import reproduce_tiny

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`


def _ctx(tmp_path):
  (tmp_path / "rasp_compile").mkdir()
  return RunContext(quick=True, outdir=tmp_path / "rasp_compile", report_dir=tmp_path, progress=False)


def test_rasp_compile_tiny_report_holds_the_recomputed_numbers(tmp_path):
  # frac_prevs (numerical, has tracr sizes) at N = 5 and 6; transpose (length 6 only) compiled at 6,
  # skipped at 5
  s = dataclasses.replace(REGISTRY["rasp_compile"].load_config(True), programs=("frac_prevs", "transpose"),
                          max_seq_lens=(5, 6), exhaustive_len=3, n_random=30)
  out = tmp_path / "r"
  entry, report = reproduce_tiny(out, "rasp_compile", s)
  metrics = entry["metrics"]
  rows = {(r["name"], r["max_seq_len"]): r for r in metrics["rows"]}
  assert sorted(rows) == [("frac_prevs", 5), ("frac_prevs", 6), ("transpose", 5), ("transpose", 6)]
  assert rows["transpose", 5]["skipped"] == "accepts no length <= 5"
  assert "| transpose | 5 | accepts no length <= 5 |" in report

  total = 0
  for name, N in (("frac_prevs", 5), ("frac_prevs", 6), ("transpose", 6)):
    spec, r = programs.PROGRAMS[name], rows[name, N]
    vocab = sorted(spec.vocab, key=repr)
    model = rasp.compile(spec.build(N), vocab, N)   # sizes only
    inputs = conformance.inputs_for(vocab, spec.lengths(N), exhaustive_len=3, n_random=30, seed=s.seed,
                                    sample=spec.sample, accepts=lambda x, spec=spec, N=N: spec.accepts(x, N))
    total += len(inputs)
    assert (r["layers"], r["heads"], r["residual_width"], r["params"], r["inputs"]) == (
        model.num_layers, model.num_heads, model.residual_width, model.num_params, len(inputs))
    assert r["wrong"] == 0 and r["max_abs_err"] <= 1e-6
    assert (f"| {name} | {N} | {model.num_layers} | {model.num_heads} | {model.residual_width} | "
            f"{model.num_params:,} | {r['compile_s']:.2f} | {len(inputs)} | 0 | "
            f"{r['max_abs_err']:.1e} |") in report
  assert metrics["wrong"] == 0 and metrics["inputs"] == total

  t = programs.PROGRAMS["frac_prevs"].tracr
  r = rows["frac_prevs", 5]
  assert (f"| frac_prevs | {t[0]} / {r['layers']} | {t[1]} / {r['heads']} | {t[2]} / {r['residual_width']} | "
          f"{t[3]:,} / {r['params']:,} | yes | yes |") in report


def test_max_params_is_reported_as_not_compiled(tmp_path):
  s = dataclasses.replace(REGISTRY["rasp_compile"].load_config(True), programs=("reverse",),
                          max_seq_lens=(6,), n_random=5, max_params=100)
  res = exp.run(_ctx(tmp_path), s)
  assert res.metrics["inputs"] == 0
  assert "more than max_params=100" in res.tables[-1].rows[0][2]


def test_config_variants():
  e = REGISTRY["rasp_compile"]
  full, quick = (config_files.load_config(f"{e.config}{v}") for v in (":full", ":quick"))
  assert full.max_seq_lens == (5, 10, 20, 40, 80) and full.to_dict() != quick.to_dict()
  assert isinstance(e.load_config(False), exp.RaspCompileSettings)
  assert e.load_config(True, ["n_random=7"]).n_random == 7
  with pytest.raises(ValueError, match="must be 'quick', 'full' or omitted"):
    config_files.load_config(f"{e.config}:tiny")
  with pytest.raises(ValueError, match="unknown programs"):
    exp.measure(dataclasses.replace(e.load_config(True), programs=("nope",)))
