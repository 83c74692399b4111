"""assoc_error_propagation at tiny sizes: outputs exist and the physics holds.

The physics checks compare numbers computed by the experiment code (no constants copied
from a run): exact multi-hop recall with orthogonal keys, head-averaged crosstalk
0.5 (n − 1)/(d_k H), error growing with depth at fixed H, and more heads lowering the
error at fixed depth and n/d_k.
"""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.experiments import RunContext
from jaxmem.experiments import pavlovian_depth as pd

TINY = pd.PropagationSettings(d_k=16, ratios=(2.0, 4.0), heads=(1, 2, 4), depth=4, trials=8)


@pytest.fixture
def tiny(monkeypatch):
  monkeypatch.setattr(pd, "settings", lambda quick: pd.Settings(TINY))


def _ctx(tmp_path: pathlib.Path, name: str) -> RunContext:
  (tmp_path / name).mkdir()
  return RunContext(quick=True, outdir=tmp_path / name, report_dir=tmp_path, progress=False)


def test_error_propagation_outputs_and_physics(tiny, tmp_path):
  res = pd.run_error_propagation(_ctx(tmp_path, "assoc_error_propagation"))
  cells = len(TINY.ratios) * len(TINY.heads)
  assert [len(t.rows) for t in res.tables] == [2 * cells, 2 * cells, 2 * 2 * len(TINY.ratios), cells, 5]
  assert len(res.tables[0].headers) == 4 + TINY.depth + 2
  assert res.figures == ["assoc_error_propagation/error_propagation.png"]
  assert (tmp_path / res.figures[0]).stat().st_size > 0
  m, L = res.metrics, TINY.depth
  for comb in pd.COMBINES:
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


def test_orthogonal_keys_recall_every_hop_exactly():
  d_k, n = 16, 12
  U, K = pd.sample_chain(jax.random.key(1), 3, n, d_k, 5, 2)
  K = jnp.broadcast_to(jnp.eye(n, d_k), K.shape)
  out = pd.chain_recall(U, K)
  assert out["err"].shape == (5, 2)
  np.testing.assert_array_equal(np.asarray(out["err"]), 0.0)
  np.testing.assert_allclose(np.asarray(out["mse"]), 0.0, atol=1e-10)


def test_head_averaged_crosstalk_matches_theory():
  """Random unit keys: E 0.5‖u − r̄‖² = 0.5 (n − 1)/(d_k H) at the first hop."""
  d_k, n = 32, 64
  U, K = pd.sample_chain(jax.random.key(2), 16, n, d_k, 1, 4)
  for H in (1, 2, 4):
    mse = float(pd.chain_recall(U, K[:, :, :H])["mse"][0, 0])
    np.testing.assert_allclose(mse, 0.5 * (n - 1) / (d_k * H), rtol=0.1)


def test_fit_helpers():
  a, b, r2 = pd.linear_fit([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
  np.testing.assert_allclose((a, b, r2), (0.1, 0.0, 1.0), atol=1e-9)
  s, r2, used = pd.log_slope_vs_heads((1, 2, 4), (0.5, 0.25, 0.0625))
  np.testing.assert_allclose((s, r2), (np.log(0.5), 1.0), atol=1e-9)
  assert used == 3
  assert np.isnan(pd.log_slope_vs_heads((1, 2, 4), (0.5, 0.0, 0.0))[0])
