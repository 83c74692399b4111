"""ahat_attention / soft_attention vs an independent numpy loop: ties, masks, exactness, the soft limit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.ahat import ahat_attention, soft_attention


def numpy_ahat(q, k, v, causal, mask=None, tol=0.0):
  """Plain per-(batch, head, query) loop, float64: the argmax set of the visible keys, averaged.

  Returns ``(out [B, T, H, E], weights [B, H, T, S])``; a query that sees no key gets zeros."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  B, T, H, _ = q.shape
  S, E = k.shape[1], v.shape[-1]
  out, weights = np.zeros((B, T, H, E)), np.zeros((B, H, T, S))
  for b in range(B):
    for h in range(H):
      for t in range(T):
        seen = [s for s in range(S) if (not causal or s <= t) and (mask is None or bool(mask[b][s]))]
        if not seen:
          continue
        score = {s: float(np.dot(q[b, t, h], k[b, s, h])) for s in seen}
        best = max(score.values())
        chosen = [s for s in seen if score[s] >= best - tol]
        for s in chosen:
          weights[b, h, t, s] = 1.0 / len(chosen)
        out[b, t, h] = sum(v[b, s, h] for s in chosen) / len(chosen)
  return out, weights


def numpy_soft(q, k, v, beta, causal):
  """The same loop with softmax(beta * score) over the visible keys."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  B, T, H, _ = q.shape
  S, E = k.shape[1], v.shape[-1]
  out = np.zeros((B, T, H, E))
  for b in range(B):
    for h in range(H):
      for t in range(T):
        n = t + 1 if causal else S
        logits = np.array([beta * q[b, t, h] @ k[b, s, h] for s in range(n)])
        w = np.exp(logits - logits.max())
        w /= w.sum()
        out[b, t, h] = sum(w[s] * v[b, s, h] for s in range(n))
  return out


def rand(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def binary(seed, shape):
  """Entries in {0, 1}: integer scores 0..D with many ties."""
  return jnp.asarray(np.random.default_rng(seed).integers(0, 2, size=shape), jnp.float32)


def small_ints(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).integers(-3, 4, size=shape), jnp.float32)


def rasp_like(seed, B, T, H, vocab=4):
  """The RASP compiler's scores: q_t = onehot(a_t) + onehot(b_t) (+ 1/2 on a BOS feature),
  k_s = onehot(c_s) and k_0 = the BOS feature; scores are 0, 1 or 2, and 1/2 on BOS, so a
  query whose selection is empty reads BOS. Returns ``q, k [B, T, H, vocab + 1]``."""
  rng = np.random.default_rng(seed)
  eye = np.eye(vocab + 1)
  a, b2, c = (rng.integers(0, vocab, size=(B, T, H)) for _ in range(3))
  q = eye[a] + eye[b2]
  q[..., vocab] = 0.5
  k = eye[c]
  k[:, 0] = eye[vocab]
  return jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32)


B, T, H, D, E = 2, 7, 3, 5, 3


def _integer_case(kind, seed=0):
  if kind == "rasp":
    q, k = rasp_like(seed, B, T, H, vocab=D - 1)
  else:
    q, k = binary(seed, (B, T, H, D)), binary(seed + 1, (B, T, H, D))
  return q, k, small_ints(seed + 2, (B, T, H, E))


# --- equivalence with the numpy loop ----------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["rasp", "binary"])
def test_integer_scores_with_ties_match_numpy_loop(kind, causal):
  q, k, v = _integer_case(kind)
  out, w = ahat_attention(q, k, v, causal=causal, return_weights=True)
  want, want_w = numpy_ahat(q, k, v, causal)
  assert out.shape == (B, T, H, E) and out.dtype == jnp.float32 and w.shape == (B, H, T, T)
  assert (np.count_nonzero(want_w, axis=-1) > 1).mean() > 0.3  # the case is mostly ties
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
  np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-7)
  np.testing.assert_array_equal(ahat_attention(q, k, v, causal=causal), out)


def test_rasp_like_scores_read_bos_when_nothing_is_selected():
  q, k, v = _integer_case("rasp", seed=3)
  _, w = numpy_ahat(q, k, v, causal=True)
  out = ahat_attention(q, k, v, causal=True)
  bos_only = w[..., 0] == 1.0  # [B, H, T]: queries whose selection is empty
  assert bos_only.any() and (~bos_only).any()
  b, h, t = np.nonzero(bos_only)
  np.testing.assert_array_equal(np.asarray(out)[b, t, h], np.asarray(v)[b, 0, h])


@pytest.mark.parametrize("causal", [True, False])
def test_real_valued_scores_match_numpy_loop(causal):
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  np.testing.assert_allclose(ahat_attention(q, k, v, causal=causal), numpy_ahat(q, k, v, causal)[0],
                             rtol=0, atol=1e-6)


@pytest.mark.parametrize("make", [binary, rand])
@pytest.mark.parametrize("T_,S_", [(7, 5), (3, 9)])
def test_cross_attention_matches_numpy_loop(make, T_, S_):
  q, k, v = make(0, (B, T_, H, D)), make(1, (B, S_, H, D)), small_ints(2, (B, S_, H, E))
  out, w = ahat_attention(q, k, v, causal=False, return_weights=True)
  want, want_w = numpy_ahat(q, k, v, False)
  assert out.shape == (B, T_, H, E) and w.shape == (B, H, T_, S_)
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
  np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-7)


# --- float32 exactness ------------------------------------------------------------------------


def test_float32_is_exact_for_integer_values_and_power_of_two_ties():
  """Query i selects a set of 1, 2, 4 or 8 of the 8 keys (head 1: other sets): scores are 0/1,
  values small integers, so sum / count is exact in float32 and must equal the float64 loop."""
  S_ = 8
  sets = [[(3,), (0, 5), (1, 2, 6, 7), tuple(range(8))],
          [tuple(range(8)), (7,), (0, 2, 4, 6), (4, 5)]]
  q = np.zeros((1, 4, 2, 4), np.float32)
  k = np.zeros((1, S_, 2, 4), np.float32)
  for h, per_query in enumerate(sets):
    for i, chosen in enumerate(per_query):
      q[0, i, h, i] = 1.0
      k[0, list(chosen), h, i] = 1.0
  v = small_ints(5, (1, S_, 2, 3))
  out, w = ahat_attention(jnp.asarray(q), jnp.asarray(k), v, return_weights=True)
  want, want_w = numpy_ahat(q, k, v, False)
  assert out.dtype == jnp.float32
  assert np.all(np.asarray(out, np.float64) == want)
  assert np.all(np.asarray(w, np.float64) == want_w)
  assert sorted(np.count_nonzero(want_w, axis=-1).ravel()) == [1, 1, 2, 2, 4, 4, 8, 8]


def test_float32_is_exact_on_causal_all_ties_with_power_of_two_prefixes():
  """q = 0: every visible key ties, query t averages v_0..v_t; for t + 1 in {1, 2, 4, 8} exact."""
  q = jnp.zeros((1, 8, 1, 2))
  k = binary(1, (1, 8, 1, 2))
  v = small_ints(2, (1, 8, 1, 3))
  out = np.asarray(ahat_attention(q, k, v, causal=True), np.float64)
  want, _ = numpy_ahat(q, k, v, True)
  rows = [0, 1, 3, 7]
  assert np.all(out[:, rows] == want[:, rows])
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)


def test_rasp_like_outputs_are_exact_where_tie_counts_are_powers_of_two():
  q, k, v = _integer_case("rasp", seed=7)
  out = np.asarray(ahat_attention(q, k, v, causal=True), np.float64)
  want, w = numpy_ahat(q, k, v, True)
  counts = np.count_nonzero(w, axis=-1).transpose(0, 2, 1)  # [B, T, H]
  pow2 = (counts & (counts - 1)) == 0
  assert pow2.sum() > 10
  assert np.all(out[pow2] == want[pow2])


def test_integer_values_average_to_float32_not_truncated():
  q = jnp.ones((1, 4, 1, 1))
  v = jnp.arange(4, dtype=jnp.int32).reshape(1, 4, 1, 1)
  out = ahat_attention(q, q, v, causal=True)
  assert out.dtype == jnp.float32
  np.testing.assert_array_equal(out[0, :, 0, 0], [0.0, 0.5, 1.0, 1.5])


# --- masks and weights ------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_key_padding_mask_matches_numpy_loop_and_fully_masked_rows_are_zero(causal):
  Bm, S_ = 3, 6
  q, k, v = binary(0, (Bm, S_, H, D)), binary(1, (Bm, S_, H, D)), small_ints(2, (Bm, S_, H, E))
  mask = np.array([[False, True, True, False, True, True],  # key 0 masked: causal query 0 sees nothing
                   [False] * S_,  # a fully masked row
                   [True] * S_])
  out, w = ahat_attention(q, k, v, causal=causal, mask_BS=jnp.asarray(mask), return_weights=True)
  want, want_w = numpy_ahat(q, k, v, causal, mask)
  assert np.isfinite(np.asarray(out)).all() and np.isfinite(np.asarray(w)).all()
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
  np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-7)
  assert np.all(np.asarray(out)[1] == 0.0) and np.all(np.asarray(w)[1] == 0.0)
  if causal:
    assert np.all(np.asarray(out)[0, 0] == 0.0)
  np.testing.assert_array_equal(np.asarray(w)[0][..., ~mask[0]], 0.0)
  # masked keys' values and keys cannot leak
  v2 = jnp.where(jnp.asarray(mask)[:, :, None, None], v, 1e6)
  k2 = jnp.where(jnp.asarray(mask)[:, :, None, None], k, 50.0)
  np.testing.assert_array_equal(ahat_attention(q, k2, v2, causal=causal, mask_BS=jnp.asarray(mask)), out)


@pytest.mark.parametrize("causal", [True, False])
def test_weights_rows_sum_to_one_or_zero(causal):
  q, k, v = _integer_case("binary", seed=4)
  mask = np.array([[False, True, True, True, True, False, True], [False] * T])
  for mask_BS in (None, mask):
    m = np.ones((B, T), bool) if mask_BS is None else mask
    sees = np.array([[any(m[b, s] for s in range(T) if not causal or s <= t) for t in range(T)]
                     for b in range(B)], np.float64)  # [B, T]: does query t see any key
    expected = np.broadcast_to(sees[:, None, :], (B, H, T))
    for kw in ({}, {"beta": 2.0}):
      fn = soft_attention if kw else ahat_attention
      _, w = fn(q, k, v, causal=causal, mask_BS=None if mask_BS is None else jnp.asarray(mask_BS),
                return_weights=True, **kw)
      w = np.asarray(w, np.float64)
      assert np.all(w >= 0) and np.isfinite(w).all()
      np.testing.assert_allclose(w.sum(-1), expected, rtol=0, atol=1e-6)
    assert (sees == 0).any() == (mask_BS is not None)


def test_tol_groups_near_ties():
  assert np.float32(1.0 + 1e-7) != np.float32(1.0)  # distinct in float32
  q = jnp.ones((1, 1, 1, 1))
  k = jnp.asarray([1.0, 1.0 + 1e-7], jnp.float32).reshape(1, 2, 1, 1)
  v = jnp.asarray([0.0, 2.0]).reshape(1, 2, 1, 1)
  strict, w0 = ahat_attention(q, k, v, tol=0.0, return_weights=True)
  loose, w1 = ahat_attention(q, k, v, tol=1e-6, return_weights=True)
  assert float(strict[0, 0, 0, 0]) == 2.0 and float(loose[0, 0, 0, 0]) == 1.0
  np.testing.assert_array_equal(w0[0, 0, 0], [0.0, 1.0])
  np.testing.assert_array_equal(w1[0, 0, 0], [0.5, 0.5])
  for tol, got in ((0.0, strict), (1e-6, loose)):
    np.testing.assert_array_equal(got, numpy_ahat(q, k, v, False, tol=tol)[0])


def test_tol_matches_numpy_loop_on_real_scores():
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  out = ahat_attention(q, k, v, causal=True, tol=1.0)
  want, w = numpy_ahat(q, k, v, True, tol=1.0)
  assert (np.count_nonzero(w, axis=-1) > 1).any()  # tol=1 groups some keys
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)


# --- the soft limit ---------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_soft_attention_matches_numpy_softmax_loop(causal):
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  for beta in (0.3, 1.0, 4.0):
    np.testing.assert_allclose(soft_attention(q, k, v, beta=beta, causal=causal),
                               numpy_soft(q, k, v, beta, causal), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["rasp", "binary"])
def test_soft_attention_with_large_beta_is_ahat_on_integer_scores(kind, causal):
  q, k, v = _integer_case(kind)
  want = numpy_ahat(q, k, v, causal)[0]
  np.testing.assert_allclose(soft_attention(q, k, v, beta=1e4, causal=causal), want, rtol=0, atol=1e-5)


def test_soft_attention_error_decreases_with_beta():
  q, k, v = _integer_case("rasp", seed=1)  # score gaps of at least 1/2
  want = numpy_ahat(q, k, v, True)[0]
  errors = [float(np.abs(np.asarray(soft_attention(q, k, v, beta=beta, causal=True)) - want).max())
            for beta in (1.0, 10.0, 100.0)]
  assert errors[0] > errors[1] > errors[2], errors
  assert errors[0] > 0.1 and errors[2] < 1e-6, errors


# --- gradients --------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["rasp", "real"])
def test_gradient_wrt_v_is_weights_transpose_times_upstream(kind, causal):
  if kind == "real":
    q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  else:
    q, k, v = _integer_case("rasp")
  cot = rand(3, (B, T, H, E))
  mask = jnp.asarray([[True] * T, [False, True, True, False, True, True, True]])
  f = lambda q, k, v: jnp.sum(ahat_attention(q, k, v, causal=causal, mask_BS=mask) * cot)
  gq, gk, gv = jax.grad(f, argnums=(0, 1, 2))(q, k, v)
  _, w = numpy_ahat(q, k, v, causal, np.asarray(mask))
  want = np.einsum("bhts,bthe->bshe", w, np.asarray(cot, np.float64))
  np.testing.assert_allclose(gv, want, rtol=0, atol=1e-6)
  assert np.all(np.asarray(gq) == 0.0) and np.all(np.asarray(gk) == 0.0)


def test_soft_attention_gradients_wrt_q_and_k_are_finite_and_nonzero():
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  mask = jnp.asarray([[True] * T, [False] * T])  # a fully masked batch element: no NaN from it
  f = lambda q, k: jnp.sum(soft_attention(q, k, v, beta=1.0, causal=True, mask_BS=mask) ** 2)
  gq, gk = jax.grad(f, argnums=(0, 1))(q, k)
  for g in (gq, gk):
    g = np.asarray(g)
    assert np.isfinite(g).all() and np.abs(g[0]).sum() > 0 and np.all(g[1] == 0.0)


# --- jit and bad input ------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_works_under_jit(causal):
  q, k, v = _integer_case("rasp")
  mask = jnp.asarray([[True] * T, [False, True, True, True, False, True, True]])
  hard = jax.jit(ahat_attention, static_argnames=("causal", "tol", "return_weights"))
  soft = jax.jit(soft_attention, static_argnames=("causal", "beta"))
  np.testing.assert_array_equal(hard(q, k, v, causal=causal, mask_BS=mask),
                                ahat_attention(q, k, v, causal=causal, mask_BS=mask))
  out, w = hard(q, k, v, causal=causal, tol=0.25, return_weights=True)
  want, want_w = numpy_ahat(q, k, v, causal, tol=0.25)
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
  np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-7)
  np.testing.assert_allclose(soft(q, k, v, causal=causal, beta=3.0, mask_BS=mask),
                             soft_attention(q, k, v, causal=causal, beta=3.0, mask_BS=mask),
                             rtol=1e-6, atol=1e-7)


_QKV = ((1, 5, 2, 4), (1, 5, 2, 4), (1, 5, 2, 3))


@pytest.mark.parametrize(
    "shapes,kwargs,match",
    [
        (((5, 2, 4), (1, 5, 2, 4), (1, 5, 2, 3)), {}, r"`q` must have rank 4"),
        (((1, 5, 2, 4), (1, 5, 4), (1, 5, 2, 3)), {}, r"`k` must have rank 4"),
        (((1, 5, 2, 4), (1, 5, 2, 4), (1, 5, 3)), {}, r"`v` must have rank 4"),
        (((1, 5, 2, 4), (1, 5, 3, 4), (1, 5, 3, 3)), {}, r"numbers of heads: q=2, k=3, v=3"),
        (((1, 5, 2, 4), (1, 5, 2, 6), (1, 5, 2, 3)), {}, r"key widths: q=4, k=6"),
        (((2, 5, 2, 4), (1, 5, 2, 4), (1, 5, 2, 3)), {}, r"batch sizes"),
        (((1, 5, 2, 4), (1, 5, 2, 4), (1, 6, 2, 3)), {}, r"key/value lengths: k=5, v=6"),
        (((1, 5, 2, 4), (1, 7, 2, 4), (1, 7, 2, 3)), {"causal": True}, r"causal AHAT needs"),
        (_QKV, {"mask_BS": np.ones((1, 6), bool)}, r"`mask_BS` must have shape \(B, S\)"),
        (_QKV, {"mask_BS": np.ones((5,), bool)}, r"`mask_BS` must have rank 2"),
        (_QKV, {"tol": -1e-3}, r"tol must be >= 0"),
        (_QKV, {"tol": float("nan")}, r"`tol` must be a finite number"),
        (_QKV, {"tol": "loose"}, r"`tol` must be a number"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(shapes, kwargs, match):
  q, k, v = (jnp.zeros(s) for s in shapes)
  with pytest.raises(ValueError, match=match):
    ahat_attention(q, k, v, **kwargs)
  if "tol" not in kwargs:
    with pytest.raises(ValueError, match=match):
      soft_attention(q, k, v, beta=1.0, **kwargs)


@pytest.mark.parametrize("beta", [0.0, -1.0, float("nan"), float("inf"), None])
def test_soft_attention_rejects_bad_beta(beta):
  q, k, v = (jnp.zeros(s) for s in _QKV)
  with pytest.raises(ValueError, match=r"`beta` must be"):
    soft_attention(q, k, v, beta=beta)
