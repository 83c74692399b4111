"""assoc_capacity / assoc_drift at tiny sizes: outputs exist and the physics holds.

The physics checks compare numbers computed by the experiment code (no constants
copied from a run): exact recall with orthogonal keys, Hebbian crosstalk
0.5 (n − 1)/d_k with random unit keys, error-free ≤ average capacity, and the drift
orderings (Hebb's ‖S‖ unbounded vs Oja's bounded, delta re-learns after a switch).
"""

import pathlib

import numpy as np
import pytest

from jaxmem.experiments import RunContext
from jaxmem.experiments import pavlovian as pv

TINY_CAP = pv.CapacitySettings(d_ks=(8, 16, 32), trials=8, n_max_ratio=2, points_per_dk=16)
TINY_DRIFT = pv.DriftSettings(d_k=16, m=8, period=60, n_periods=3, trials=4, record_every=10)


@pytest.fixture
def tiny(monkeypatch):
  monkeypatch.setattr(pv, "settings", lambda quick: pv.Settings(TINY_CAP, TINY_DRIFT))


def _ctx(tmp_path: pathlib.Path, name: str) -> RunContext:
  (tmp_path / name).mkdir()
  return RunContext(quick=True, outdir=tmp_path / name, report_dir=tmp_path, progress=False)


def test_capacity_experiment_outputs(tiny, tmp_path):
  res = pv.run_capacity(_ctx(tmp_path, "assoc_capacity"))
  assert [len(t.rows) for t in res.tables] == [6, 3, len(pv.SCHLAG_POINTS)]
  assert res.figures == ["assoc_capacity/capacity.png"]
  assert (tmp_path / res.figures[0]).stat().st_size > 0
  for rule in TINY_CAP.rules:
    for d in TINY_CAP.d_ks:  # error-free (worst case) never exceeds the average case
      assert res.metrics[f"{rule}_nstar_acc_worst_d{d}"] <= res.metrics[f"{rule}_nstar_acc_avg_d{d}"]
      assert res.metrics[f"{rule}_nstar_fid_worst_d{d}"] <= res.metrics[f"{rule}_nstar_fid_avg_d{d}"]
    # capacity grows with width
    assert res.metrics[f"{rule}_nstar_fid_avg_d32"] > res.metrics[f"{rule}_nstar_fid_avg_d8"]
  assert np.isfinite(res.metrics["hebb_slope_fid_avg"])


def test_orthogonal_keys_recall_exactly_random_keys_crosstalk():
  d_k = 16
  cs = pv.CapacitySettings(trials=4, points_per_dk=16)
  onehot = pv.capacity_curves("delta", d_k, cs, keys="onehot")
  small = onehot["n"] <= d_k // 4
  assert small.any()
  assert onehot["max_err"][small].max() < 1e-6
  assert onehot["acc"][small].min() == 1.0
  hebb = pv.capacity_curves("hebb", d_k, cs)
  i = np.flatnonzero(hebb["n"] == d_k // 4)[0]
  assert hebb["err"][i].mean() > 1e-3  # crosstalk from non-orthogonal keys


def test_hebb_crosstalk_matches_theory():
  """Random unit keys and values: E 0.5‖v_j − S k_j‖² = 0.5 (n − 1)/d_k."""
  d_k = 32
  c = pv.capacity_curves("hebb", d_k, pv.CapacitySettings(trials=16, points_per_dk=8))
  for n in (d_k // 2, d_k, 2 * d_k):
    measured = c["err"][np.flatnonzero(c["n"] == n)[0]].mean()
    np.testing.assert_allclose(measured, 0.5 * (n - 1) / d_k, rtol=0.25)


def test_drift_experiment_physics(tiny, tmp_path):
  res = pv.run_drift(_ctx(tmp_path, "assoc_drift"))
  assert res.figures == ["assoc_drift/drift.png"]
  assert (tmp_path / res.figures[0]).stat().st_size > 0
  assert [len(t.rows) for t in res.tables] == [4, 4]
  m = res.metrics
  assert m["hebb_norm_end"] > 3 * m["oja_norm_end"]
  assert m["hebb_norm_end"] > 1.5 * m["hebb_norm_first"]  # grows over periods
  assert m["delta_err_before"] < m["hebb_err_before"]
  assert m["delta_err_before"] < 0.5 * m["delta_err_after"]  # re-learns after each switch
  assert m["hebb_norm_growth"] > pv.GROWTH_ALPHA > m["oja_norm_growth"]  # unbounded vs bounded
  assert m["expectations_held"] == 4
