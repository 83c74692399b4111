"""assoc_drift at tiny sizes: outputs exist and the drift orderings hold (Hebb's ‖S‖ unbounded vs
Oja's and decay's bounded, delta re-learns after a switch), recomputed from the raw curves."""

import numpy as np
import pytest

from jaxmem.experiments.pavlovian import drift as exp
from tests.experiments.pavlovian.helpers import capture, ls_slope, make_ctx, quick_settings

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`

TINY_DRIFT = quick_settings("assoc_drift", d_k=16, m=8, period=60, n_periods=3, trials=4, record_every=10)


def test_drift_experiment_physics(tmp_path, monkeypatch):
  raw = capture(monkeypatch, exp, "drift_curves")
  res = exp.run(make_ctx(tmp_path, "assoc_drift"), TINY_DRIFT)
  assert res.figures == ["assoc_drift/drift.png"]
  assert (tmp_path / res.figures[0]).stat().st_size > 0
  assert [len(t.rows) for t in res.tables] == [4, 4]
  m = res.metrics
  assert m["hebb_norm_end"] > 3 * m["oja_norm_end"]
  assert m["hebb_norm_end"] > 1.5 * m["hebb_norm_first"]  # grows over periods
  assert m["delta_err_before"] < m["hebb_err_before"]
  assert m["delta_err_before"] < 0.5 * m["delta_err_after"]  # re-learns after each switch
  assert m["hebb_norm_growth"] > exp.GROWTH_ALPHA > m["oja_norm_growth"]  # unbounded vs bounded
  assert m["expectations_held"] == 4
  # decay (γ < 1) forgets geometrically: ‖S‖ bounded (‖S‖ ≤ β/(1 − γ) for unit pairs) and, unlike Hebb, it
  # tracks the current map
  assert m["decay_norm_growth"] < exp.GROWTH_ALPHA and m["decay_norm_end"] < m["hebb_norm_end"] / 3
  assert m["decay_err_before_all"] < 0.1 * m["hebb_err_before_all"]

  # independent of drift_summary and the check code: the summaries and the four checks recomputed from the raw
  # per-trial curves (probe i is after step (i + 1)·record_every; the map switches after steps P·j)
  (_, curves), = raw
  ds, per = TINY_DRIFT, TINY_DRIFT.period // TINY_DRIFT.record_every
  pre = [j * per - 1 for j in range(1, ds.n_periods)]          # last probe under the old map
  ours = {}
  for rule, c in curves.items():
    np.testing.assert_array_equal(c["t"], ds.record_every * np.arange(1, ds.n_periods * per + 1))
    err, norm = c["err"].mean(axis=1), c["norm"].mean(axis=1)
    at = [j * per - 1 for j in range(2, ds.n_periods + 1)]
    ours[rule] = {"err_before": err[pre].mean(), "err_after": err[[i + 1 for i in pre]].mean(),
                  "err_before_all": err[pre + [ds.n_periods * per - 1]].mean(),
                  "norm_first": norm[per - 1], "norm_end": norm[-1],
                  "norm_growth": ls_slope(np.log(c["t"][at]), np.log(norm[at]))}
    for key, x in ours[rule].items():
      np.testing.assert_allclose(m[f"{rule}_{key}"], x, rtol=1e-6, err_msg=(rule, key))
  h, d, o = ours["hebb"], ours["delta"], ours["oja"]
  expected = [h["norm_growth"] > exp.GROWTH_ALPHA, h["err_before_all"] > 10 * d["err_before_all"],
              d["err_before"] < 0.1 * d["err_after"], o["norm_growth"] < exp.GROWTH_ALPHA]
  assert [r[-1] for r in res.tables[1].rows] == ["yes" if x else "NO" for x in expected]
  assert m["expectations_held"] == sum(expected)
  assert res.summary.startswith(f"{sum(expected)}/4 drift expectations hold")
