"""Key/value pair streams (:mod:`jaxmem.tasks.pairs`) checked against their specification with plain loops.

The samplers are plain (un-jitted) functions; every one of them is drawn, at one awkward canonical
size, inside a single jitted program (module-scoped), and the samplers' argument errors are raised
while tracing (``jax.eval_shape``: nothing compiled). :func:`order_blind_loss` is checked by hand and
against a float64 plain-Python mean-of-written-values reader; :func:`order_blind_floor` against exact
enumeration.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.tasks import pairs

S_R, P_SYM, B_SYM = (3, 5), 5, 4            # sample_symbol_streams: runs of 3 and 5 symbols, padded to 5
DRIFT = dict(trials=2, m=3, d_k=4, period=5, n_periods=3)
OVERWRITE = dict(trials=2, ms=(3, 5), d_key=4, writes_per_key=2)

# By hand: one stream, P = 2 keys, V = 2 values: key 0 written with values 0 then 1, key 1 with 1, a
# padding (inactive) write of key 1 with value 0.
HAND = dict(ids=[[0, 0, 1, 1]], vals=[[0, 1, 1, 0]], active=[[1.0, 1.0, 1.0, 0.0]],
            y=[[[0.0, 1.0], [0.0, 1.0]]])


@jax.jit
def _draw_all(key):
  """Every sampler once, at its canonical size, in one program."""
  ks = jax.random.split(key, 8)
  S_R_arr = jnp.asarray(S_R)
  sym_distinct = pairs.sample_symbol_streams(ks[5], S_R_arr, P_SYM, "distinct", B_SYM)
  sym_overwrite = pairs.sample_symbol_streams(ks[6], S_R_arr, P_SYM, "overwrite", B_SYM)
  return dict(
      pairs_random=pairs.sample_pairs(ks[0], 3, 5, 8),
      pairs_onehot=pairs.sample_pairs(ks[0], 3, 5, 8, keys="onehot"),
      chain=pairs.sample_chain(ks[1], 2, 6, 8, 3, 4),
      drift=pairs.sample_drift(ks[2], *DRIFT.values()),
      distinct=pairs.sample_distinct(ks[3], 3, 7, 4),
      overwrite=pairs.sample_overwrite(ks[4], *OVERWRITE.values()),
      sym_distinct=sym_distinct,
      sym_overwrite=sym_overwrite,
      # the order-blind loss of each run of the overwrite streams, and of the hand-made stream
      blind=[pairs.order_blind_loss(*(x[r] for x in sym_overwrite)) for r in range(len(S_R))],
      hand=pairs.order_blind_loss(*(jnp.asarray(HAND[k]) for k in ("ids", "vals", "active", "y")),
                                  jnp.ones((1, 2), bool)),
  )


@pytest.fixture(scope="module")
def drawn():
  return jax.tree.map(np.asarray, _draw_all(jax.random.key(0)))


def raises_while_tracing(fn, match):
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(fn, jax.random.key(0))


def test_sample_pairs_shapes_units_and_onehot_keys(drawn):
  k, v = drawn["pairs_random"]
  assert k.shape == v.shape == (3, 5, 8)
  np.testing.assert_allclose(np.linalg.norm(k, axis=-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(v, axis=-1), 1.0, rtol=1e-6)
  assert not np.allclose(k[0], k[1])                      # trials differ
  k1, v1 = drawn["pairs_onehot"]
  np.testing.assert_array_equal(k1, np.broadcast_to(np.eye(5, 8), (3, 5, 8)))
  # the values do not depend on the key kind: the same float32 ops on the same draws (one program; a
  # different fusion could only change the rounding of the 8-term norm, |err| ≤ ~10·2⁻²⁴ ≈ 6e-7)
  np.testing.assert_allclose(v1, v, rtol=1e-6, atol=1e-7)
  raises_while_tracing(lambda key: pairs.sample_pairs(key, 1, 9, 8, keys="onehot"), "n <= d_k")
  raises_while_tracing(lambda key: pairs.sample_pairs(key, 1, 2, 8, keys="orthogonal"), "keys must be")


def test_sample_chain_shapes_and_units(drawn):
  U, K = drawn["chain"]
  assert U.shape == (2, 4, 6, 8) and K.shape == (2, 3, 4, 6, 8)
  np.testing.assert_allclose(np.linalg.norm(U, axis=-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(K, axis=-1), 1.0, rtol=1e-6)


def test_sample_drift_writes_the_current_map(drawn):
  """Step t writes one of the m keys with that key's value of period t // P."""
  B, m, d, P, n_periods = DRIFT.values()
  keys, vals, k, v = drawn["drift"]
  assert keys.shape == (B, m, d) and vals.shape == (B, n_periods, m, d)
  assert k.shape == v.shape == (B, P * n_periods, d)
  np.testing.assert_allclose(np.linalg.norm(vals, axis=-1), 1.0, rtol=1e-6)
  # the stream's keys and values are gathered from the same normalised draws, but not bitwise: XLA may
  # recompute the normalisation inside each fusion that reads it (a few float32 ulp of entries ≤ 1 apart), and
  # two different random unit keys are never within 1e-6 of each other
  written = set()
  for b in range(B):
    for t in range(P * n_periods):
      i = np.flatnonzero(np.max(np.abs(k[b, t] - keys[b]), axis=-1) <= 1e-6)
      assert len(i) == 1, (b, t)
      np.testing.assert_allclose(v[b, t], vals[b, t // P, i[0]], rtol=0, atol=1e-6)
      written.add(int(i[0]))
  assert written == set(range(m))                         # the drawn key varies


def test_sample_distinct_values_are_a_permutation(drawn):
  k, y = drawn["distinct"]
  assert k.shape == (3, 7, 4) and y.shape == (3, 7, 7)
  for b in range(3):
    np.testing.assert_array_equal(y[b].sum(0), np.ones(7))   # every value used once
    np.testing.assert_array_equal(y[b].sum(1), np.ones(7))   # one-hot


def test_sample_overwrite_targets_are_latest_values(drawn):
  trials, ms = OVERWRITE["trials"], OVERWRITE["ms"]
  pool, ids, v, beta, target, written = drawn["overwrite"]
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


def test_sample_symbol_streams(drawn):
  """Distinct: the first S steps write a permutation of the S keys, each with its own value; overwrite:
  2S writes of keys < S, the target of a key is its latest value; padding is never written or queried."""
  P, B = P_SYM, B_SYM
  ids, vals, act, y, queried = drawn["sym_distinct"]
  assert ids.shape == vals.shape == act.shape == (2, B, P) and y.shape == (2, B, P, P)
  for r, S in enumerate(S_R):
    for b in range(B):
      np.testing.assert_array_equal(np.sort(ids[r, b, :S]), np.arange(S))
      np.testing.assert_array_equal(np.sort(vals[r, b, :S]), np.arange(S))
      np.testing.assert_array_equal(act[r, b], np.arange(P) < S)
      np.testing.assert_array_equal(queried[r, b], np.arange(P) < S)
      for t in range(S):
        np.testing.assert_array_equal(y[r, b, ids[r, b, t]], np.eye(P)[vals[r, b, t]])
  ids, vals, act, y, queried = drawn["sym_overwrite"]
  assert ids.shape == (2, B, 2 * P)
  for r, S in enumerate(S_R):
    for b in range(B):
      live = act[r, b] > 0
      assert live.sum() == 2 * S and ids[r, b, live].max() < S and vals[r, b, live].max() < S
      for j in range(P):
        steps = np.flatnonzero(live & (ids[r, b] == j))
        assert queried[r, b, j] == bool(steps.size)
        if steps.size:
          np.testing.assert_array_equal(y[r, b, j], np.eye(P)[vals[r, b, steps[-1]]])
  raises_while_tracing(lambda key: pairs.sample_symbol_streams(key, jnp.asarray(S_R), P, "shuffle", B),
                       "setting must be")


def test_order_blind_loss_by_hand(drawn):
  """The hand-made stream: key 0 written with values 0 then 1 (mean (½, ½), latest e_1: loss 0.5·(¼ + ¼) =
  0.25), key 1 written once (loss 0); the padding write is ignored; mean 0.125."""
  np.testing.assert_allclose(float(drawn["hand"]), 0.125)


def test_order_blind_loss_is_the_mean_of_written_values_reader(drawn):
  """On the sampled overwrite streams: a plain-Python float64 reader that answers each queried key with the
  mean of the one-hot values written to it; loss 0.5‖y − mean‖² averaged over the queried keys."""
  ids, vals, act, y, queried = drawn["sym_overwrite"]
  for r in range(len(S_R)):
    total, count = 0.0, 0
    for b in range(B_SYM):
      for j in range(P_SYM):
        written = [vals[r, b, t] for t in range(ids.shape[-1]) if act[r, b, t] > 0 and ids[r, b, t] == j]
        if not queried[r, b, j]:
          continue
        mean = np.mean(np.eye(P_SYM)[written], axis=0)
        total += 0.5 * np.sum((y[r, b, j].astype(np.float64) - mean) ** 2)
        count += 1
    # float32 sums of ≤ B·P = 20 non-negative terms: relative error ≤ ~20·2⁻²⁴ ≈ 1.2e-6, plus the
    # rounding of each term's mean and square
    np.testing.assert_allclose(drawn["blind"][r], total / count, rtol=3e-6)
  assert drawn["blind"][1] > 0.0                            # some key is rewritten with another value


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
