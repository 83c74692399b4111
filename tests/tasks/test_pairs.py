"""Key/value pair streams (:mod:`jaxmem.tasks.pairs`) checked against their specification with plain loops."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.tasks import pairs


def test_sample_pairs_shapes_units_and_onehot_keys():
  k, v = (np.asarray(x) for x in pairs.sample_pairs(jax.random.key(0), 3, 5, 8))
  assert k.shape == v.shape == (3, 5, 8)
  np.testing.assert_allclose(np.linalg.norm(k, axis=-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(v, axis=-1), 1.0, rtol=1e-6)
  assert not np.allclose(k[0], k[1])                      # trials differ
  k1, v1 = (np.asarray(x) for x in pairs.sample_pairs(jax.random.key(0), 3, 5, 8, keys="onehot"))
  np.testing.assert_array_equal(k1, np.broadcast_to(np.eye(5, 8), (3, 5, 8)))
  np.testing.assert_array_equal(v1, v)                    # the values do not depend on the key kind
  with pytest.raises(ValueError, match="n <= d_k"):
    pairs.sample_pairs(jax.random.key(0), 1, 9, 8, keys="onehot")
  with pytest.raises(ValueError, match="keys must be"):
    pairs.sample_pairs(jax.random.key(0), 1, 2, 8, keys="orthogonal")


def test_sample_chain_shapes_and_units():
  U, K = (np.asarray(x) for x in pairs.sample_chain(jax.random.key(0), 2, 6, 8, 3, 4))
  assert U.shape == (2, 4, 6, 8) and K.shape == (2, 3, 4, 6, 8)
  np.testing.assert_allclose(np.linalg.norm(U, axis=-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(K, axis=-1), 1.0, rtol=1e-6)


def test_sample_drift_writes_the_current_map():
  """Step t writes one of the m keys with that key's value of period t // P."""
  B, m, d, P, n_periods = 2, 3, 4, 5, 3
  keys, vals, k, v = (np.asarray(x) for x in pairs.sample_drift(jax.random.key(0), B, m, d, P, n_periods))
  assert keys.shape == (B, m, d) and vals.shape == (B, n_periods, m, d)
  assert k.shape == v.shape == (B, P * n_periods, d)
  np.testing.assert_allclose(np.linalg.norm(vals, axis=-1), 1.0, rtol=1e-6)
  for b in range(B):
    for t in range(P * n_periods):
      i = [j for j in range(m) if np.array_equal(k[b, t], keys[b, j])]
      assert len(i) == 1, (b, t)
      np.testing.assert_array_equal(v[b, t], vals[b, t // P, i[0]])


def test_sample_distinct_values_are_a_permutation():
  k, y = (np.asarray(x) for x in pairs.sample_distinct(jax.random.key(0), 3, 7, 4))
  assert k.shape == (3, 7, 4) and y.shape == (3, 7, 7)
  for b in range(3):
    np.testing.assert_array_equal(y[b].sum(0), np.ones(7))   # every value used once
    np.testing.assert_array_equal(y[b].sum(1), np.ones(7))   # one-hot


def test_sample_overwrite_targets_are_latest_values():
  trials, ms, d_key, writes_per_key = 2, (3, 5), 4, 2
  pool, ids, v, beta, target, written = (np.asarray(x) for x in pairs.sample_overwrite(
      jax.random.key(1), trials, ms, d_key, writes_per_key))
  M, L = 5, 10
  assert pool.shape == (4, M, 4) and ids.shape == (4, L) and v.shape == (4, L, M) and target.shape == (4, M, M)
  for b, m in enumerate(np.repeat(ms, trials)):
    active = beta[b] > 0
    assert active.sum() == 2 * m and ids[b, active].max() < m and v[b, active].argmax(-1).max() < m
    for j in range(M):
      steps = np.flatnonzero(active & (ids[b] == j))
      assert written[b, j] == bool(steps.size)
      if steps.size:
        np.testing.assert_array_equal(target[b, j], v[b, steps[-1]])


def test_sample_symbol_streams():
  """Distinct: the first S steps write a permutation of the S keys, each with its own value; overwrite:
  2S writes of keys < S, the target of a key is its latest value; padding is never written or queried."""
  S_R, P, B = jnp.asarray([3, 5]), 5, 4
  sample = lambda seed, setting: map(np.asarray, pairs.sample_symbol_streams(jax.random.key(seed), S_R, P,
                                                                             setting, B))
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
  with pytest.raises(ValueError, match="setting must be"):
    pairs.sample_symbol_streams(jax.random.key(0), S_R, P, "shuffle", B)


def test_order_blind_loss_by_hand():
  """One stream, P = 2 keys, V = 2 values: key 0 written with values 0 then 1 (mean (½, ½), latest e_1: loss
  0.5·(¼ + ¼) = 0.25), key 1 written once (loss 0); padding (inactive) writes are ignored; mean 0.125."""
  ids = jnp.asarray([[0, 0, 1, 1]])
  vals = jnp.asarray([[0, 1, 1, 0]])
  active = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])
  y = jnp.asarray([[[0.0, 1.0], [0.0, 1.0]]])
  np.testing.assert_allclose(float(pairs.order_blind_loss(ids, vals, active, y, jnp.ones((1, 2), bool))), 0.125)


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
  sampled = pairs.order_blind_floor(jax.random.key(0), 2, 8192, writes=1)
  np.testing.assert_allclose(sampled, loss / count, atol=0.006)   # ≈ 5 standard errors
  assert pairs.order_blind_floor(jax.random.key(0), 1, 64) == 0.0   # one key, one value: nothing to confuse
  f1, f2 = (pairs.order_blind_floor(jax.random.key(0), 20, 256, writes=w) for w in (1, 2))
  assert 0.0 < f1 < f2 < 0.5 * (1 - 1 / 20)   # below reading the mean of all S values
