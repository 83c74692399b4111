"""simulator_u at tiny sizes: within the bound, tables and figure written, config variants."""

import dataclasses

import pytest

from jaxmem import config_files
from jaxmem.experiments import REGISTRY, RunContext
from jaxmem.experiments.simulator import simulator_u as exp


def test_simulator_u_tiny(tmp_path):
  (tmp_path / "simulator_u").mkdir()
  ctx = RunContext(quick=True, outdir=tmp_path / "simulator_u", report_dir=tmp_path, progress=False)
  s = dataclasses.replace(REGISTRY["simulator_u"].load_config(True), max_len=4, heads=(1, 2),
                          n_values=(1, 3, 4), trials=2, d_model=3, head_dim=2, ffn_dim=3)
  res = exp.run(ctx, s)
  assert res.metrics["held"] and res.metrics["worst_rel_err"] <= exp.BOUND
  errors, sizes, cons = res.tables
  assert len(errors.rows) == 6 and len(sizes.rows) == 4 and len(cons.rows) == 9
  assert all(float(r[2]) <= 1e-5 for r in cons.rows)
  assert (tmp_path / res.figures[0]).stat().st_size > 0


def test_config_variants():
  e = REGISTRY["simulator_u"]
  full, quick = (config_files.load_config(f"{e.config}{v}") for v in (":full", ":quick"))
  assert full.to_dict() != quick.to_dict()
  assert isinstance(e.load_config(False), exp.SimulatorSettings)
  with pytest.raises(ValueError, match="must be 'quick', 'full' or omitted"):
    config_files.load_config(f"{e.config}:tiny")
