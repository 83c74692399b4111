"""rasp_compile at tiny sizes: every row exact, the tracr table filled, the figure written;
its config file and settings; the max_params refusal reported, not raised."""

import dataclasses

import pytest

from jaxmem import config_files
from jaxmem.experiments import REGISTRY, RunContext
from jaxmem.experiments.simulator import rasp_compile as exp


def _ctx(tmp_path):
  (tmp_path / "rasp_compile").mkdir()
  return RunContext(quick=True, outdir=tmp_path / "rasp_compile", report_dir=tmp_path, progress=False)


def test_rasp_compile_tiny(tmp_path):
  s = dataclasses.replace(REGISTRY["rasp_compile"].load_config(True),
                          programs=("length", "reverse", "frac_prevs", "transpose"),
                          max_seq_lens=(5, 8), exhaustive_len=3, n_random=30)
  res = exp.run(_ctx(tmp_path), s)
  assert res.metrics["wrong"] == 0 and res.metrics["inputs"] > 100
  assert res.figures == ["rasp_compile/rasp_compile.png"]
  assert (tmp_path / res.figures[0]).stat().st_size > 0
  sizes, vs_tracr, skipped = res.tables
  assert len(sizes.rows) == 7            # transpose accepts no length <= 5
  assert [r[0] for r in vs_tracr.rows] == ["length", "reverse", "frac_prevs"]
  assert all(r[5] == "yes" and r[6] == "yes" for r in vs_tracr.rows)
  assert skipped.rows == [["transpose", 5, "accepts no length <= 5"]]


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
