"""assoc_capacity / assoc_capacity_onehot / assoc_drift at tiny sizes: outputs exist and the physics holds.

The physics checks compare numbers computed by the experiment code (no constants
copied from a run): exact recall with orthogonal keys, Hebbian crosstalk
0.5 (n − 1)/d_k with random unit keys, error-free ≤ average capacity, and the drift
orderings (Hebb's ‖S‖ unbounded vs Oja's bounded, delta re-learns after a switch).
"""

import itertools
import pathlib

import jax
import jax.numpy as jnp
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


# ---------------------------------------------------------------------------------------
# assoc_capacity_onehot (Schlag et al. 2021's one-hot-value setting).

# trained keys at toy sizes: two S values in one padded, vmapped group; S = 20 hits a published point
# (sum rule, overwriting, DPFP-1), so its row, with the order-blind floor, is built
TINY_TRAINED = pv.TrainedSettings(d_key=8, groups=(("overwrite", "hebb", "DPFP-1", (4, 20), 8),),
                                  steps=20, steps_per_call=10, eval_seqs=8)
TINY_ONEHOT = pv.OneHotSettings(d_key=8, fmaps=("ELU+1", "DPFP-1"), trials=4, seg=4, n_max=24, ms=(4, 8, 12),
                                writes_per_key=3, trained=TINY_TRAINED)


def _dpfp_numpy(x, nu):
  """DPFP-ν from the paper's formula, one entry at a time: φ_{i + 2d(j−1)} = z_i z_{(i+j) mod 2d}."""
  x = np.asarray(x, np.float64)
  z = np.maximum(np.concatenate([x, -x], axis=-1), 0.0)
  two_d = z.shape[-1]
  out = np.zeros(x.shape[:-1] + (two_d * nu,))
  for j in range(1, nu + 1):
    for i in range(two_d):
      out[..., (j - 1) * two_d + i] = z[..., i] * z[..., (i + j) % two_d]
  return out


@pytest.mark.parametrize("nu", [1, 2, 3])
def test_dpfp_matches_numpy_definition(nu):
  x = np.random.default_rng(nu).normal(size=(3, 5, 7)).astype(np.float32)
  got = np.asarray(pv.dpfp(jnp.asarray(x), nu))
  assert got.shape == (3, 5, 2 * 7 * nu)
  np.testing.assert_allclose(got, _dpfp_numpy(x, nu), rtol=1e-6, atol=1e-6)
  assert pv.FEATURE_MAPS[f"DPFP-{min(nu, 2)}"][1](7) == 2 * 7 * min(nu, 2)
  # feature maps and normalisations: ELU+1 keeps the width, sum norm gives Σφ = 1, l2 gives ‖φ‖ = 1
  np.testing.assert_allclose(np.asarray(pv.elu_plus_one(jnp.asarray(x))),
                             np.where(x > 0, x + 1.0, np.exp(x)), rtol=1e-6)
  for fmap, (phi, _) in pv.FEATURE_MAPS.items():
    nonzero = np.asarray(phi(jnp.asarray(x))).sum(-1) > 0   # DPFP of a 7-wide key can vanish
    f = np.asarray(pv.feature_keys(jnp.asarray(x), fmap, "sum"))
    np.testing.assert_allclose(f.sum(-1), np.where(nonzero, 1.0, 0.0), rtol=1e-5)
    assert (f >= 0).all()
    f2 = np.asarray(pv.feature_keys(jnp.asarray(x), fmap, "l2"))
    np.testing.assert_allclose(np.linalg.norm(f2, axis=-1), np.where(nonzero, 1.0, 0.0), rtol=1e-5)


def test_onehot_exact_cases():
  """Orthonormal keys: sum rule recalls distinct pairs exactly; under overwriting delta returns the latest
  value exactly and the sum rule does not."""
  B, N, K = 2, 8, 12
  k = jnp.broadcast_to(jnp.eye(N, K), (B, N, K))   # one-hot keys = identity feature, Σ = ‖·‖ = 1
  y = jax.nn.one_hot(jnp.stack([jnp.arange(N), jnp.arange(N)[::-1]]), N)
  yr, rr = pv.distinct_stats(k, y, seg=2)
  for a, b in zip(np.asarray(yr), np.asarray(rr), strict=True):
    raw, best, g = pv.onehot_losses(a, b)
    assert abs(raw) < 1e-6 and abs(best) < 1e-6 and abs(g - 1) < 1e-6

  M, T = 4, 11
  pool = jnp.broadcast_to(jnp.eye(M, K), (1, M, K))
  ids = np.array([0, 1, 2, 3, 0, 1, 2, 0, 3, 1, 2])
  rounds = np.array([0, 0, 0, 0, 1, 1, 1, 2, 1, 2, 2])
  vals = (ids + rounds) % M                     # every rewrite of a key changes its value
  beta = np.ones(T, np.float32)
  beta[-2:] = 0.0                               # padding steps: not written
  last = {int(i): int(v) for i, v, b in zip(ids, vals, beta, strict=True) if b > 0}
  target = jax.nn.one_hot(jnp.asarray([[last[i] for i in range(M)]]), M)
  k_seq = pool[:, ids]
  v_seq = jax.nn.one_hot(jnp.asarray(vals)[None], M)
  loss = {}
  for rule in ("hebb", "delta"):
    yr, rr = pv.overwrite_stats(k_seq, v_seq, jnp.asarray(beta)[None], pool, target, jnp.ones((1, M), bool),
                                rule=rule)
    loss[rule] = pv.onehot_losses(np.asarray(yr), np.asarray(rr))
  assert loss["delta"][0] < 1e-6 and loss["delta"][1] < 1e-6
  # hebb reads v_latest + the stale values: exact independent value from the counts
  hebb_reads = np.zeros((M, M))
  for i, v, b in zip(ids, vals, beta, strict=True):
    hebb_reads[i, v] += b
  expect = np.mean(0.5 * np.sum((np.asarray(target[0]) - hebb_reads) ** 2, axis=-1))
  np.testing.assert_allclose(loss["hebb"][0], expect, rtol=1e-5)
  assert loss["hebb"][0] > 0.5


def test_sample_overwrite_targets_are_latest_values():
  oh = pv.OneHotSettings(d_key=4, trials=2, ms=(3, 5), writes_per_key=2)
  pool, ids, v, beta, target, written = (np.asarray(x) for x in pv.sample_overwrite(jax.random.key(1), oh))
  M, L = 5, 10
  assert pool.shape == (4, M, 4) and ids.shape == (4, L) and v.shape == (4, L, M) and target.shape == (4, M, M)
  for b, m in enumerate(np.repeat(oh.ms, oh.trials)):
    active = beta[b] > 0
    assert active.sum() == 2 * m and ids[b, active].max() < m and v[b, active].argmax(-1).max() < m
    for j in range(M):
      steps = np.flatnonzero(active & (ids[b] == j))
      assert written[b, j] == bool(steps.size)
      if steps.size:
        np.testing.assert_array_equal(target[b, j], v[b, steps[-1]])


def test_capacity_onehot_experiment(monkeypatch, tmp_path):
  monkeypatch.setattr(pv, "onehot_settings", lambda quick: TINY_ONEHOT)
  res = pv.run_capacity_onehot(_ctx(tmp_path, "assoc_capacity_onehot"))
  assert res.figures == ["assoc_capacity_onehot/capacity_onehot.png",
                         "assoc_capacity_onehot/capacity_onehot_trained.png"]
  for fig in res.figures:
    assert (tmp_path / fig).stat().st_size > 0
  n_curves = len(pv.NORMS) * len(TINY_ONEHOT.fmaps) * (1 + len(TINY_ONEHOT.overwrite_rules))
  n_anchors = sum(f in TINY_ONEHOT.fmaps for _, _, f, *_ in pv.SCHLAG_ONEHOT)
  # trained-keys table: a published point gets a row when its group trained an S at n (≤ n for "up to n")
  groups = {g[:3]: g[3] for g in TINY_TRAINED.groups}
  n_trained = sum(any(S <= n if up_to else S == n for S in groups[(st, r, f)])
                  for st, r, f, n, _, up_to in pv.SCHLAG_ONEHOT if (st, r, f) in groups)
  n_runs = sum(len(g[3]) for g in TINY_TRAINED.groups)
  assert n_trained >= 1
  assert [len(t.rows) for t in res.tables] == [n_anchors, n_curves, 3 * len(pv.NORMS), len(TINY_ONEHOT.fmaps),
                                               n_trained, n_runs]
  assert all(len(r) == len(t.headers) for t in res.tables[4:] for r in t.rows)
  assert res.metrics["trained_runs"] == n_runs and np.isfinite(res.metrics["trained_seconds"])
  for st, r, f, ns, _ in TINY_TRAINED.groups:  # 20 Adam steps at lr 1e-2 already cut the loss
    for S in ns:
      init, final = (res.metrics[f"trained_{st}_{r}_{f}_S{S}_{x}"] for x in ("init_loss", "loss"))
      assert 0 <= final < init, (st, r, f, S, init, final)
      assert 0 < res.metrics[f"trained_{st}_{r}_{f}_S{S}_floor"] < 0.5
  row = next(r for r in res.tables[4].rows if r[:4] == ["overwrite", "hebb", "DPFP-1 (16)", "20"])
  floor_short, floor_long = (float(x) for x in row[11].split(" / "))
  assert 0 < floor_short < floor_long < 0.5
  # random non-negative features overlap (a common component); DPFP is sparser than ELU+1
  assert 0 < res.metrics["DPFP-1_mean_cos"] < res.metrics["ELU+1_mean_cos"] < 1
  assert res.metrics["checks_held"] >= 0 and np.isfinite(res.metrics["seconds"])
  assert all(len(r) == len(res.tables[0].headers) for r in res.tables[0].rows)

  curves = pv.onehot_curves(TINY_ONEHOT)
  for (setting, norm, fmap, _), c in curves.items():
    assert np.all(c["best"] <= c["raw"] + 1e-6)        # the fitted gain never hurts
    assert np.all(c["best"] >= -1e-6) and np.all(c["best"] <= 0.5 + 1e-6)
    if setting == "distinct":                          # sum rule: loss non-decreasing in n (trial mean)
      assert np.all(np.diff(c["best"]) >= -0.01), (norm, fmap, c["best"])
      assert c["best"][-1] > c["best"][0]
  for fmap in TINY_ONEHOT.fmaps:                       # overwriting: delta erases, the sum rule cannot
    assert np.all(curves[("overwrite", "l2", fmap, "delta")]["best"]
                  < curves[("overwrite", "l2", fmap, "hebb")]["best"])


def test_distinct_stats_match_numpy():
  """The kernel-written, segment-probed readouts equal a direct numpy sum rule ``S = Σ_{i<n} y_i k_iᵀ``."""
  B, N, seg = 2, 12, 4
  raw = jax.random.normal(jax.random.key(3), (B, N, 6))
  k = pv.feature_keys(raw, "DPFP-1", "sum")
  y = jax.nn.one_hot(jnp.stack([jnp.arange(N), (jnp.arange(N) * 5) % N]), N)
  yr, rr = (np.asarray(x) for x in pv.distinct_stats(k, y, seg=seg))
  kn, yn = np.asarray(k, np.float64), np.asarray(y, np.float64)
  for p, n in enumerate(range(seg, N + 1, seg)):
    reads = np.einsum("bnv,bnk,bmk->bmv", yn[:, :n], kn[:, :n], kn[:, :n])
    np.testing.assert_allclose(yr[p], np.mean(np.sum(yn[:, :n] * reads, -1), -1), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(rr[p], np.mean(np.sum(reads * reads, -1), -1), rtol=1e-4, atol=1e-9)


def test_trained_keys_reach_near_perfect_recall():
  """Distinct keys, sum rule, DPFP-1 of 16-wide keys (feature width 32) and S = 8 ≤ 32 symbols: non-negative
  features with disjoint supports exist (and DPFP reaches them: two adjacent positive key entries give a
  one-hot φ), so zero loss is attainable. Before training every read mixes the S values (loss ≈ 0.4-0.6);
  a read that still confused even one pair of keys half-and-half would cost 2 · 0.25 / S ≈ 0.06 on average,
  so a trained loss < 0.02 means every key is retrieved almost cleanly, and < init/10 that training did it
  (3 seeds reached ≤ 1e-4 when this was written)."""
  ts = pv.TrainedSettings(d_key=16, groups=(("distinct", "hebb", "DPFP-1", (8,), 16),), steps=300,
                          steps_per_call=100, eval_seqs=16)
  c = pv.trained_curves(ts)[("distinct", "hebb", "DPFP-1")]
  assert c["hist"].shape == (300, 1)
  assert c["init_loss"][0] > 0.3
  assert c["loss"][0] < 0.02 and c["loss"][0] < c["init_loss"][0] / 10, (c["init_loss"], c["loss"])
  assert c["acc"][0] == 1.0


def test_trained_delta_overwrites_below_order_blind_floor():
  """Overwriting keys (2S writes, latest value wanted), S = 6, delta rule with learned β: it can erase, so
  training takes it far below the order-blind floor (≈ 0.18 here), the best any order-blind memory — the sum
  rule — can reach. Threshold floor/4: well clear of the floor, loose enough for optimisation noise (6 seeds
  reached ≤ 1e-4 in 600 steps when this was written)."""
  ts = pv.TrainedSettings(d_key=16, groups=(("overwrite", "delta", "DPFP-1", (6,), 16),), steps=600,
                          steps_per_call=100, eval_seqs=32)
  c = pv.trained_curves(ts)[("overwrite", "delta", "DPFP-1")]
  floor = pv.order_blind_floor(jax.random.key(0), 6, 256)
  assert c["init_loss"][0] > floor
  assert c["loss"][0] < floor / 4 and c["loss_short"][0] < floor / 4, (floor, c["loss"], c["loss_short"])


def test_trained_sum_rule_read_is_order_blind():
  """The premise of the order-blind floor: with the sum rule the read depends only on the multiset of
  written (key, value) pairs — reversing the stream changes nothing — while the delta rule's read does
  change (it keeps the latest value)."""
  S, P, B = 6, 6, 3
  params, colmask = pv.init_trained(jax.random.key(0), S, P, 8)
  ids, vals, act, _, _ = pv.sample_trained(jax.random.key(1), jnp.asarray([S]), P, "overwrite", B)
  ids, vals, act = ids[0], vals[0], act[0]
  for rule in ("hebb", "delta"):
    fwd, rev = (pv.trained_readout(params, colmask, i, v, a, rule=rule, fmap="DPFP-1")
                for i, v, a in ((ids, vals, act), (ids[:, ::-1], vals[:, ::-1], act[:, ::-1])))
    if rule == "hebb":
      np.testing.assert_allclose(np.asarray(fwd), np.asarray(rev), rtol=1e-4, atol=1e-6)
    else:
      assert np.max(np.abs(np.asarray(fwd) - np.asarray(rev))) > 1e-3


def test_sample_trained_streams():
  """Distinct: the first S steps write a permutation of the S keys, each with its own value; overwrite:
  2S writes of keys < S, the target of a key is its latest value; padding is never written or queried."""
  S_R, P, B = jnp.asarray([3, 5]), 5, 4
  sample = lambda seed, setting: map(np.asarray, pv.sample_trained(jax.random.key(seed), S_R, P, setting, B))
  ids, vals, act, y, queried = sample(0, "distinct")
  assert ids.shape == vals.shape == act.shape == (2, B, P) and y.shape == (2, B, P, P)
  for r, S in enumerate([3, 5]):
    for b in range(B):
      np.testing.assert_array_equal(np.sort(ids[r, b, :S]), np.arange(S))
      np.testing.assert_array_equal(np.sort(vals[r, b, :S]), np.arange(S))
      np.testing.assert_array_equal(act[r, b], np.arange(P) < S)
      np.testing.assert_array_equal(queried[r, b], np.arange(P) < S)
      for t in range(S):
        np.testing.assert_array_equal(y[r, b, ids[r, b, t]], np.eye(P)[vals[r, b, t]])
  ids, vals, act, y, queried = sample(1, "overwrite")
  assert ids.shape == (2, B, 2 * P)
  for r, S in enumerate([3, 5]):
    for b in range(B):
      live = act[r, b] > 0
      assert live.sum() == 2 * S and ids[r, b, live].max() < S and vals[r, b, live].max() < S
      for j in range(P):
        steps = np.flatnonzero(live & (ids[r, b] == j))
        assert queried[r, b, j] == bool(steps.size)
        if steps.size:
          np.testing.assert_array_equal(y[r, b, j], np.eye(P)[vals[r, b, steps[-1]]])


def test_order_blind_floor_matches_enumeration():
  """S = 2 keys and values, length-2 streams (writes = 1): all 16 equally likely streams enumerated; a key
  written twice with two different values costs 0.5‖e_last − mean‖² = 0.25, anything else 0; pooled over
  written keys the floor is 1/24. The sampled floor agrees; more rewrites (writes = 2) raise it."""
  loss = count = 0.0
  for k1, v1, k2, v2 in itertools.product(range(2), repeat=4):
    for key in {k1, k2}:
      vs = [v for k, v in ((k1, v1), (k2, v2)) if k == key]
      loss += 0.5 * np.sum((np.eye(2)[vs[-1]] - np.mean(np.eye(2)[vs], axis=0)) ** 2)
      count += 1
  np.testing.assert_allclose(loss / count, 1 / 24)
  sampled = pv.order_blind_floor(jax.random.key(0), 2, 8192, writes=1)
  np.testing.assert_allclose(sampled, loss / count, atol=0.006)   # ≈ 5 standard errors
  assert pv.order_blind_floor(jax.random.key(0), 1, 64) == 0.0   # one key, one value: nothing to confuse
  f1, f2 = (pv.order_blind_floor(jax.random.key(0), 20, 256, writes=w) for w in (1, 2))
  assert 0.0 < f1 < f2 < 0.5 * (1 - 1 / 20)   # below reading the mean of all S values
