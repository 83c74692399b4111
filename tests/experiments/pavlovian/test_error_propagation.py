"""assoc_error_propagation at tiny sizes: outputs exist and the physics holds.

The physics checks compare numbers computed by the experiment code (no constants copied
from a run): exact multi-hop recall with orthogonal keys, head-averaged crosstalk
0.5 (n − 1)/(d_k H), error growing with depth at fixed H, and more heads lowering the
error at fixed depth and n/d_k; the raw curves against a float64 numpy chain. One experiment run (a module
fixture) feeds the physics tests, so each (n, H) program compiles once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.experiments.pavlovian import error_propagation as exp
from jaxmem.experiments.pavlovian.common import linear_fit, log_slope_vs_heads
from jaxmem.tasks.pairs import sample_chain, unit
from tests.experiments.pavlovian.helpers import quick_settings, run_capturing

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`

# 16 trials: the crosstalk-vs-theory check below averages over them
TINY = quick_settings("assoc_error_propagation", d_k=16, ratios=(2.0, 4.0), heads=(1, 2, 4), depth=4, trials=16)


@pytest.fixture(scope="module")
def prop_run(tmp_path_factory):
  """One tiny run of the experiment: (its result, report dir, the raw (ratio, H) grid it measured)."""
  res, tmp_path, raw = run_capturing(tmp_path_factory, exp, "assoc_error_propagation", TINY, "propagation_grid")
  (_, grid), = raw
  return res, tmp_path, grid


def numpy_mean_chain_err(U, K):
  """Plain float64 numpy reference of the mean-combine chain: Hebbian S_{h,ℓ} = Σ_i u_{ℓ+1,i} k_{h,ℓ,i}ᵀ,
  read with the current item's keys, heads averaged, cleaned up to the nearest next-layer item.
  Returns error rate and head-averaged read MSE after each hop, ``[L]``."""
  U, K = np.asarray(U, np.float64), np.asarray(K, np.float64)
  B, L, H, N, _ = K.shape
  S = np.einsum("blnv,blhnk->blhvk", U[:, 1:], K)
  idx = np.broadcast_to(np.arange(N), (B, N))
  err, mse = np.zeros(L), np.zeros(L)
  for ell in range(L):
    q = np.take_along_axis(K[:, ell], idx[:, None, :, None], axis=2)              # [B, H, N, K]
    r = np.einsum("bhvk,bhnk->bnv", S[:, ell], q) / H
    mse[ell] = np.mean(0.5 * np.sum((U[:, ell + 1] - r) ** 2, -1))
    idx = np.argmax(np.einsum("bnv,bmv->bnm", r, U[:, ell + 1]), -1)
    err[ell] = np.mean(idx != np.arange(N))
  return err, mse


def test_error_propagation_outputs_and_physics(prop_run):
  res, tmp_path, grid = prop_run
  cells = len(TINY.ratios) * len(TINY.heads)
  assert [len(t.rows) for t in res.tables] == [2 * cells, 2 * cells, 2 * 2 * len(TINY.ratios), cells, 5]
  assert len(res.tables[0].headers) == 4 + TINY.depth + 2
  assert res.figures == ["assoc_error_propagation/error_propagation.png"]
  assert (tmp_path / res.figures[0]).stat().st_size > 0
  m, L = res.metrics, TINY.depth
  for comb in exp.COMBINES:
    # error grows with depth at fixed H (cleanup errors are absorbing)
    for r, H in (("2", 1), ("4", 2)):
      errs = [m[f"{comb}_err_r{r}_H{H}_L{ell}"] for ell in range(1, L + 1)]
      assert errs[0] > 0 and errs[-1] > 1.5 * errs[0]
      assert np.all(np.diff(errs) >= -0.02)
    # more heads reduce error at fixed depth and n/d_k
    for r in ("2", "4"):
      assert m[f"{comb}_err_r{r}_H4_L1"] < 0.7 * m[f"{comb}_err_r{r}_H1_L1"]
      assert m[f"{comb}_err_r{r}_H4_L{L}"] < m[f"{comb}_err_r{r}_H2_L{L}"] < m[f"{comb}_err_r{r}_H1_L{L}"]
  # averaging suppresses more than voting needs to (mean is the primary, stronger combine)
  assert m["mean_err_r4_H4_L1"] <= m["vote_err_r4_H4_L1"]
  # denser memories err more
  assert m["mean_err_r4_H1_L1"] > m["mean_err_r2_H1_L1"]
  assert m["mse_max_rel_dev"] < 0.2
  assert m["heads_ok"] == m["heads_cells"] > 0

  # independent of the experiment's check code: the cell counts and the five expectations recomputed from the
  # raw per-cell error curves it measured
  n_of = {r: max(2, round(r * TINY.d_k)) for r in TINY.ratios}
  Ls, cnt = np.arange(1, L + 1), {k: [0, 0] for k in ("grow", "lin", "heads", "exp")}   # [ok, cells]

  def tally(name, ok):
    cnt[name][0] += bool(ok)
    cnt[name][1] += 1

  for c, comb in enumerate(exp.COMBINES):
    for r in TINY.ratios:
      chain = 1.0 / (TINY.trials * n_of[r])
      for H in TINY.heads:
        e = grid[(r, H)]["err"][:, c]
        np.testing.assert_array_equal([m[f"{comb}_err_r{r:g}_H{H}_L{ell}"] for ell in Ls], e)
        if 0 < e[-1] <= 1 - exp.MIN_WRONG * chain:
          slack = [2 * np.sqrt(e[i] * (1 - e[i]) * chain) + chain for i in range(L)]
          tally("grow", e[-1] > e[0] and all(e[i] - e[i - 1] >= -slack[i] for i in range(1, L)))
        if exp.MIN_WRONG * chain <= e[-1] <= exp.SATURATED:
          tally("lin", np.ptp(e) == 0 or np.corrcoef(Ls, e)[0, 1] ** 2 >= exp.LINEAR_R2)
      for ell in (1, L):
        errs = np.array([grid[(r, H)]["err"][ell - 1, c] for H in TINY.heads])
        if errs[0] > 0:
          tally("heads", np.all(errs[1:] <= errs[:-1]) and errs[-1] < errs[0])
        pos = errs > 0
        if ell == 1 and pos.sum() >= 3:
          tally("exp", np.corrcoef(np.asarray(TINY.heads)[pos], np.log(errs[pos]))[0, 1] ** 2 >= 0.9)
  for name, (ok, cells) in cnt.items():
    assert (m[f"{name}_ok"], m[f"{name}_cells"]) == (ok, cells), name
  expected = [cells > 0 and ok == cells for ok, cells in cnt.values()] + [False]
  assert [row[-1] for row in res.tables[4].rows] == ["yes" if x else "NO" for x in expected]
  assert m["expectations_held"] == sum(expected)
  assert res.summary.startswith(f"{sum(expected)}/5 shape expectations hold")
  mse_dev = max(abs(grid[(r, H)]["mse"][0, 0] / (0.5 * (n_of[r] - 1) / (TINY.d_k * H)) - 1)
                for r in TINY.ratios for H in TINY.heads)
  np.testing.assert_allclose(m["mse_max_rel_dev"], mse_dev, rtol=1e-6)
  # and the raw mean-combine curves against a float64 numpy chain on the same samples (one wrong chain slack)
  for j, r in enumerate(TINY.ratios):
    U, K = sample_chain(jax.random.fold_in(jax.random.key(TINY.seed), j), TINY.trials, n_of[r], TINY.d_k, L,
                           max(TINY.heads))
    for H in TINY.heads:
      err, mse = numpy_mean_chain_err(U, K[:, :, :H])
      np.testing.assert_allclose(grid[(r, H)]["err"][:, 0], err, atol=1.01 / (TINY.trials * n_of[r]),
                                 err_msg=(r, H))
      np.testing.assert_allclose(grid[(r, H)]["mse"][:, 0], mse, rtol=1e-3, err_msg=(r, H))


def test_orthogonal_keys_recall_every_hop_exactly():
  d_k, n = 16, 12
  # random unit item codes (drawn flat: one cheap sampler program), one-hot keys shared by the 2 heads
  U = unit(jax.random.normal(jax.random.key(1), (3 * 6 * n * d_k,)).reshape(3, 6, n, d_k))
  K = jnp.broadcast_to(jnp.eye(n, d_k), (3, 5, 2, n, d_k))
  out = exp.chain_recall(U, K)
  assert out["err"].shape == (5, 2)
  np.testing.assert_array_equal(np.asarray(out["err"]), 0.0)
  np.testing.assert_allclose(np.asarray(out["mse"]), 0.0, atol=1e-10)


def test_head_averaged_crosstalk_matches_theory(prop_run):
  """Random unit keys: E 0.5‖u − r̄‖² = 0.5 (n − 1)/(d_k H) at the first hop. The experiment's n = 64 cells
  (16 trials × 64 reads); the estimate's relative spread over samples is ≈ 0.025 (H = 1) at this size, so
  rtol 0.1 is four of them."""
  d_k, n, grid = TINY.d_k, 64, prop_run[2]
  for H in (1, 2, 4):
    mse = float(grid[(n / d_k, H)]["mse"][0, 0])
    np.testing.assert_allclose(mse, 0.5 * (n - 1) / (d_k * H), rtol=0.1)


def test_fit_helpers():
  a, b, r2 = linear_fit([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
  np.testing.assert_allclose((a, b, r2), (0.1, 0.0, 1.0), atol=1e-9)
  s, r2, used = log_slope_vs_heads((1, 2, 4), (0.5, 0.25, 0.0625))
  np.testing.assert_allclose((s, r2), (np.log(0.5), 1.0), atol=1e-9)
  assert used == 3
  assert np.isnan(log_slope_vs_heads((1, 2, 4), (0.5, 0.0, 0.0))[0])
