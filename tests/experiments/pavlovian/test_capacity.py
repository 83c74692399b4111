"""assoc_capacity at tiny sizes: outputs exist and the physics holds.

The physics checks compare numbers computed by the experiment code (no constants
copied from a run): exact recall with orthogonal keys, Hebbian crosstalk
0.5 (n − 1)/d_k with random unit keys, error-free ≤ average capacity; the raw curves against a
float64 numpy memory written pair by pair. One experiment run (a module fixture) feeds every test.
"""

import jax
import numpy as np
import pytest

from jaxmem.experiments.pavlovian import capacity as exp
from jaxmem.tasks.pairs import sample_pairs
from tests.experiments.pavlovian.helpers import first_failure_n, ls_slope, quick_settings, run_capturing

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`

# 16 trials: the crosstalk-vs-theory check below averages over them
TINY_CAP = quick_settings("assoc_capacity", d_ks=(8, 16, 32), trials=16, n_max_ratio=2, points_per_dk=16)


@pytest.fixture(scope="module")
def cap_run(tmp_path_factory):
  """One tiny run of the experiment: (its result, report dir, the raw curves it measured by (rule, d_k))."""
  res, tmp_path, raw = run_capturing(tmp_path_factory, exp, "assoc_capacity", TINY_CAP, "capacity_curves")
  return res, tmp_path, {(a[0], a[1]): c for a, c in raw}


def numpy_recall(rule: str, k, v, ns):
  """Plain float64 numpy reference of ``capacity_probe``: write pairs one at a time (β = 1) with Hebb
  ``S += v kᵀ`` or delta ``S += (v − S k) kᵀ``; after n writes read every stored key. Mean / max error and
  nearest-stored-value accuracy ``[len(ns), trials]``."""
  k, v = np.asarray(k, np.float64), np.asarray(v, np.float64)
  B, N, D = k.shape
  S = np.zeros((B, D, D))
  err, max_err, acc = (np.zeros((len(ns), B)) for _ in range(3))
  p = 0
  for t in range(N):
    kt, vt = k[:, t], v[:, t]
    S += np.einsum("bv,bk->bvk", vt - (np.einsum("bvk,bk->bv", S, kt) if rule == "delta" else 0.0), kt)
    if p < len(ns) and t + 1 == ns[p]:
      n = t + 1
      reads = np.einsum("bvk,bnk->bnv", S, k[:, :n])
      e = 0.5 * np.sum((v[:, :n] - reads) ** 2, -1)
      nearest = np.argmax(np.einsum("bnv,bmv->bnm", reads, v[:, :n]), -1)
      err[p], max_err[p], acc[p] = e.mean(-1), e.max(-1), (nearest == np.arange(n)).mean(-1)
      p += 1
  return err, max_err, acc


def test_capacity_experiment_outputs(cap_run):
  res, tmp_path, curves = cap_run
  assert [len(t.rows) for t in res.tables] == [6, 3, len(exp.SCHLAG_POINTS)]
  assert res.figures == ["assoc_capacity/capacity.png"]
  assert (tmp_path / res.figures[0]).stat().st_size > 0
  for rule in TINY_CAP.rules:
    for d in TINY_CAP.d_ks:  # error-free (worst case) never exceeds the average case
      assert res.metrics[f"{rule}_nstar_acc_worst_d{d}"] <= res.metrics[f"{rule}_nstar_acc_avg_d{d}"]
      assert res.metrics[f"{rule}_nstar_fid_worst_d{d}"] <= res.metrics[f"{rule}_nstar_fid_avg_d{d}"]
    # capacity grows with width
    assert res.metrics[f"{rule}_nstar_fid_avg_d32"] > res.metrics[f"{rule}_nstar_fid_avg_d8"]
  assert np.isfinite(res.metrics["hebb_slope_fid_avg"])

  # independent of the experiment's summaries: n* and the log-log slopes recomputed from the raw per-trial
  # curves it measured, and the table's "error at n = d_k" column
  assert sorted(curves) == sorted((r, d) for r in TINY_CAP.rules for d in TINY_CAP.d_ks)
  crits = {"acc_avg": lambda c: c["acc"].mean(1) >= exp.ACC_THRESHOLD,
           "acc_worst": lambda c: c["all_ok"].all(1),
           "fid_avg": lambda c: c["err"].mean(1) <= exp.FIDELITY_EPS,
           "fid_worst": lambda c: c["max_err"].max(1) <= exp.FIDELITY_EPS}
  rows = {(r[0], r[1]): r for r in res.tables[0].rows}
  for rule in TINY_CAP.rules:
    for crit, ok_of in crits.items():
      pts = []
      for d in TINY_CAP.d_ks:
        c = curves[(rule, d)]
        nstar, censored = first_failure_n(c["n"], ok_of(c)), bool(ok_of(c).all())
        assert res.metrics[f"{rule}_nstar_{crit}_d{d}"] == nstar, (rule, crit, d)
        if nstar > 0 and not censored:
          pts.append((np.log(d), np.log(nstar)))
      slope = ls_slope(*zip(*pts, strict=True)) if len(pts) >= 2 else float("nan")
      np.testing.assert_allclose(res.metrics[f"{rule}_slope_{crit}"], slope, rtol=1e-9, err_msg=(rule, crit))
    for d in TINY_CAP.d_ks:
      c = curves[(rule, d)]
      assert float(rows[(rule, d)][-1]) == pytest.approx(c["err"][c["n"] == d][0].mean(), abs=6e-5)
  # and the raw curves themselves against a float64 numpy memory written pair by pair (d_k = 8: n = 1..16)
  d = 8
  k, v = sample_pairs(jax.random.fold_in(jax.random.key(TINY_CAP.seed), d), TINY_CAP.trials, 2 * d, d)
  for rule in TINY_CAP.rules:
    c = curves[(rule, d)]
    err, max_err, acc = numpy_recall(rule, k, v, list(c["n"]))
    np.testing.assert_allclose(c["err"], err, rtol=1e-3, atol=1e-5, err_msg=rule)
    np.testing.assert_allclose(c["max_err"], max_err, rtol=1e-3, atol=1e-5, err_msg=rule)
    np.testing.assert_allclose(c["acc"], acc, atol=1e-6, err_msg=rule)
    np.testing.assert_array_equal(c["all_ok"], acc == 1.0)


def test_orthogonal_keys_recall_exactly_random_keys_crosstalk(cap_run):
  d_k = 16
  onehot = exp.capacity_curves("delta", d_k, TINY_CAP, keys="onehot")
  small = onehot["n"] <= d_k // 4
  assert small.any()
  assert onehot["max_err"][small].max() < 1e-6
  assert onehot["acc"][small].min() == 1.0
  hebb = cap_run[2][("hebb", d_k)]    # random unit keys, same width
  i = np.flatnonzero(hebb["n"] == d_k // 4)[0]
  assert hebb["err"][i].mean() > 1e-3  # crosstalk from non-orthogonal keys


def test_hebb_crosstalk_matches_theory(cap_run):
  """Random unit keys and values: E 0.5‖v_j − S k_j‖² = 0.5 (n − 1)/d_k."""
  d_k = 32
  c = cap_run[2][("hebb", d_k)]   # 16 trials
  for n in (d_k // 2, d_k, 2 * d_k):
    measured = c["err"][np.flatnonzero(c["n"] == n)[0]].mean()
    np.testing.assert_allclose(measured, 0.5 * (n - 1) / d_k, rtol=0.25)
