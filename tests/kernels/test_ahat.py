"""ahat_attention / soft_attention vs an independent float64 numpy loop: ties, masks, exactness, the soft limit.

Proven against the loop: outputs and attention maps on integer scores with many ties (RASP-like and
binary), real scores, cross-attention, key-padding masks (fully masked rows give zeros, masked keys
cannot leak), ``tol``; float32 exactness where the averages are exact; the soft limit equals a
softmax loop and tends to AHAT as β grows; gradients (w.r.t. v: the weights' transpose times the
upstream; w.r.t. q and k: zero for AHAT, finite and nonzero for the soft form); eager == jit; bad
input raises. Every call goes through a module-level jit; at the canonical shape B, T, H, D, E =
2, 7, 3, 5, 3 all configurations (causal, tol, β, mask) are one compiled program.

KV cache (``q_offset``): on a longer cache with rows at different positions (one past the end) and a key
mask, hard and soft reads and maps match the loops over each row's visible prefix; the gradient w.r.t. v is
the weights' transpose times the upstream (zero w.r.t. q and k for AHAT); the soft form's gradients match
``jax.nn.dot_product_attention`` with the equivalent explicit mask; a query that sees no key reads zeros with
zero, finite gradients.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.ahat import ahat_attention, soft_attention


def numpy_ahat(q, k, v, causal, mask=None, tol=0.0, q_offset=None):
  """Plain per-(batch, head, query) loop, float64: the argmax set of the visible keys, averaged.

  Returns ``(out [B, T, H, E], weights [B, H, T, S])``; a query that sees no key gets zeros. With
  ``q_offset`` (causal), query ``t`` of row ``b`` sees the keys ``s <= q_offset[b] + t``."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  B, T, H, _ = q.shape
  S, E = k.shape[1], v.shape[-1]
  out, weights = np.zeros((B, T, H, E)), np.zeros((B, H, T, S))
  for b in range(B):
    for h in range(H):
      for t in range(T):
        last = t if q_offset is None else int(q_offset[b]) + t
        seen = [s for s in range(S) if (not causal or s <= last) and (mask is None or bool(mask[b][s]))]
        if not seen:
          continue
        score = {s: float(np.dot(q[b, t, h], k[b, s, h])) for s in seen}
        best = max(score.values())
        chosen = [s for s in seen if score[s] >= best - tol]
        for s in chosen:
          weights[b, h, t, s] = 1.0 / len(chosen)
        out[b, t, h] = sum(v[b, s, h] for s in chosen) / len(chosen)
  return out, weights


def numpy_soft(q, k, v, beta, causal, mask=None, q_offset=None):
  """The same loop with softmax(beta * score) over the visible keys (zeros where none is visible)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  B, T, H, _ = q.shape
  S, E = k.shape[1], v.shape[-1]
  out = np.zeros((B, T, H, E))
  for b in range(B):
    for h in range(H):
      for t in range(T):
        last = (t if q_offset is None else int(q_offset[b]) + t) if causal else S - 1
        seen = [s for s in range(min(last + 1, S)) if mask is None or bool(mask[b][s])]
        if not seen:
          continue
        logits = np.array([beta * q[b, t, h] @ k[b, s, h] for s in seen])
        w = np.exp(logits - logits.max())
        w /= w.sum()
        out[b, t, h] = sum(wi * v[b, s, h] for wi, s in zip(w, seen, strict=True))
  return out


def rand(seed, shape):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def binary(seed, shape):
  """Entries in {0, 1}: integer scores 0..D with many ties."""
  return np.random.default_rng(seed).integers(0, 2, size=shape).astype(np.float32)


def small_ints(seed, shape):
  return np.random.default_rng(seed).integers(-3, 4, size=shape).astype(np.float32)


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
  return q.astype(np.float32), k.astype(np.float32)


B, T, H, D, E = 2, 7, 3, 5, 3

# The configurations the tests use at the canonical shape: (kind, causal, tol or β, masked).
CANONICAL = (
    [("ahat", c, 0.0, m) for c in (True, False) for m in (False, True)]
    + [("ahat", True, 0.25, False), ("ahat", False, 0.25, False), ("ahat", True, 1.0, False)]
    + [("ahat_out", c, 0.0, False) for c in (True, False)]  # return_weights=False
    + [("soft", c, beta, False) for c in (True, False) for beta in (0.3, 1.0, 4.0, 1e4)]
    + [("soft", True, 10.0, False), ("soft", True, 100.0, False)]
    + [("soft", c, 1.0, True) for c in (True, False)]
)


@jax.jit
def _canonical(q, k, v, mask):
  """Every configuration in CANONICAL as one compiled program (compiling each separately costs
  far more): ``{(kind, causal, tol or β, masked): output}``."""
  return {(kind, causal, param, masked): _one(q, k, v, mask if masked else None, kind, causal, param)
          for kind, causal, param, masked in CANONICAL}


def _one(q, k, v, mask, kind, causal, param):
  if kind == "soft":
    return soft_attention(q, k, v, beta=param, causal=causal, mask_BS=mask, return_weights=True)
  return ahat_attention(q, k, v, causal=causal, mask_BS=mask, tol=param, return_weights=kind == "ahat")


_single = jax.jit(_one, static_argnames=("kind", "causal", "param"))


def _run(kind, q, k, v, causal, param, mask_BS):
  """The kernel through a module-level jit: the shared program at the canonical shape, else one
  program per shape and configuration."""
  key = (kind, causal, param, mask_BS is not None)
  canonical = (np.shape(q) == np.shape(k) == (B, T, H, D) and np.shape(v) == (B, T, H, E)
               and np.asarray(v).dtype == np.float32 and key in CANONICAL)
  if canonical:
    mask = np.ones((B, T), bool) if mask_BS is None else mask_BS
    return _canonical(q, k, v, mask)[key]
  return _single(q, k, v, mask_BS, kind=kind, causal=causal, param=param)


def ahat(q, k, v, *, causal, tol=0.0, mask_BS=None):
  """``ahat_attention(..., return_weights=True)``: ``(out, weights)``."""
  return _run("ahat", q, k, v, causal, tol, mask_BS)


def ahat_out(q, k, v, *, causal):
  """``ahat_attention(..., return_weights=False)``."""
  return _run("ahat_out", q, k, v, causal, 0.0, None)


def soft(q, k, v, *, causal, beta, mask_BS=None):
  """``soft_attention(..., return_weights=True)``: ``(out, weights)``."""
  return _run("soft", q, k, v, causal, beta, mask_BS)


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
  out, w = ahat(q, k, v, causal=causal)
  want, want_w = numpy_ahat(q, k, v, causal)
  assert out.shape == (B, T, H, E) and out.dtype == jnp.float32 and w.shape == (B, H, T, T)
  assert (np.count_nonzero(want_w, axis=-1) > 1).mean() > 0.3  # the case is mostly ties
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
  np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-7)
  # return_weights=False: the same arithmetic for the output, so bitwise equal by construction
  np.testing.assert_array_equal(ahat_out(q, k, v, causal=causal), out)


def test_rasp_like_scores_read_bos_when_nothing_is_selected():
  q, k, v = _integer_case("rasp", seed=3)
  _, w = numpy_ahat(q, k, v, causal=True)
  out, _ = ahat(q, k, v, causal=True)
  bos_only = w[..., 0] == 1.0  # [B, H, T]: queries whose selection is empty
  assert bos_only.any() and (~bos_only).any()
  b, h, t = np.nonzero(bos_only)
  np.testing.assert_array_equal(np.asarray(out)[b, t, h], np.asarray(v)[b, 0, h])


@pytest.mark.parametrize("causal", [True, False])
def test_real_valued_scores_match_numpy_loop(causal):
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  np.testing.assert_allclose(ahat(q, k, v, causal=causal)[0], numpy_ahat(q, k, v, causal)[0],
                             rtol=0, atol=1e-6)


@pytest.mark.parametrize("make", [binary, rand])
@pytest.mark.parametrize("T_,S_", [(7, 5), (3, 9)])
def test_cross_attention_matches_numpy_loop(make, T_, S_):
  q, k, v = make(0, (B, T_, H, D)), make(1, (B, S_, H, D)), small_ints(2, (B, S_, H, E))
  out, w = ahat(q, k, v, causal=False)
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
  out, w = ahat(q, k, v, causal=False)
  want, want_w = numpy_ahat(q, k, v, False)
  assert out.dtype == jnp.float32
  assert np.all(np.asarray(out, np.float64) == want)
  assert np.all(np.asarray(w, np.float64) == want_w)
  assert sorted(np.count_nonzero(want_w, axis=-1).ravel()) == [1, 1, 2, 2, 4, 4, 8, 8]


def test_float32_is_exact_on_causal_all_ties_with_power_of_two_prefixes():
  """q = 0: every visible key ties, query t averages v_0..v_t; for t + 1 in {1, 2, 4, 8} exact."""
  q = np.zeros((1, 8, 1, 2), np.float32)
  k = binary(1, (1, 8, 1, 2))
  v = small_ints(2, (1, 8, 1, 3))
  out = np.asarray(ahat(q, k, v, causal=True)[0], np.float64)
  want, _ = numpy_ahat(q, k, v, True)
  rows = [0, 1, 3, 7]
  assert np.all(out[:, rows] == want[:, rows])
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)


def test_rasp_like_outputs_are_exact_where_tie_counts_are_powers_of_two():
  q, k, v = _integer_case("rasp", seed=7)
  out = np.asarray(ahat(q, k, v, causal=True)[0], np.float64)
  want, w = numpy_ahat(q, k, v, True)
  counts = np.count_nonzero(w, axis=-1).transpose(0, 2, 1)  # [B, T, H]
  pow2 = (counts & (counts - 1)) == 0
  assert pow2.sum() > 10
  assert np.all(out[pow2] == want[pow2])


def test_integer_values_average_to_float32_not_truncated():
  q = np.ones((1, 4, 1, 1), np.float32)
  v = np.arange(4, dtype=np.int32).reshape(1, 4, 1, 1)
  out, _ = ahat(q, q, v, causal=True)
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
  out, w = ahat(q, k, v, causal=causal, mask_BS=mask)
  want, want_w = numpy_ahat(q, k, v, causal, mask)
  assert np.isfinite(np.asarray(out)).all() and np.isfinite(np.asarray(w)).all()
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
  np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-7)
  assert np.all(np.asarray(out)[1] == 0.0) and np.all(np.asarray(w)[1] == 0.0)
  if causal:
    assert np.all(np.asarray(out)[0, 0] == 0.0)
  np.testing.assert_array_equal(np.asarray(w)[0][..., ~mask[0]], 0.0)
  # masked keys' values and keys cannot leak
  v2 = np.where(mask[:, :, None, None], v, np.float32(1e6))
  k2 = np.where(mask[:, :, None, None], k, np.float32(50.0))
  np.testing.assert_array_equal(ahat(q, k2, v2, causal=causal, mask_BS=mask)[0], out)


def test_nan_scores_propagate_and_very_negative_scores_outrank_hidden_keys():
  # row 0: the visible keys score -3e38 (below any finite mask value) and -inf, the hidden one 7: the -3e38 key
  # is the argmax (it used to lose to the hidden key, giving 0, or all the soft weight going to the hidden
  # key). Row 1, causal: key 2 scores NaN, so query 2's output is NaN (it used to be a silent 0) and queries
  # 0 and 1, which do not see key 2, are exact. Hard and soft.
  q = np.ones((2, 3, 1, 1), np.float32)
  k = np.array([[-3e38, -np.inf, 7.0], [1.0, 2.0, np.nan]], np.float32).reshape(2, 3, 1, 1)
  v = np.array([[10.0, 20.0, 30.0], [1.0, 2.0, 3.0]], np.float32).reshape(2, 3, 1, 1)
  mask = np.array([[True, True, False], [True, True, True]])
  for attend in (ahat_attention, functools.partial(soft_attention, beta=1.0)):
    out, w = (np.asarray(x) for x in attend(q, k, v, causal=True, mask_BS=mask, return_weights=True))
    np.testing.assert_array_equal(out[0, 1:, 0, 0], [10.0, 10.0])   # query 0 sees only key 0
    np.testing.assert_array_equal(w[0, 0, 1:, 2], [0.0, 0.0])
    np.testing.assert_allclose(out[1, :2, 0, 0], [1.0, 2.0 if attend is ahat_attention else
                                                  (1.0 + 2.0 * np.e) / (1.0 + np.e)], rtol=1e-6)
    assert np.isnan(out[1, 2, 0, 0]) and np.isnan(w[1, 0, 2]).all(), attend
    assert np.isfinite(out[0]).all() and np.isfinite(out[1, :2]).all()


@pytest.mark.parametrize("causal", [True, False])
def test_weights_rows_sum_to_one_or_zero(causal):
  q, k, v = _integer_case("binary", seed=4)
  mask = np.array([[False, True, True, True, True, False, True], [False] * T])
  for mask_BS in (None, mask):
    m = np.ones((B, T), bool) if mask_BS is None else mask
    sees = np.array([[any(m[b, s] for s in range(T) if not causal or s <= t) for t in range(T)]
                     for b in range(B)], np.float64)  # [B, T]: does query t see any key
    expected = np.broadcast_to(sees[:, None, :], (B, H, T))
    for kw in ({}, {"beta": 1.0}):
      fn = soft if kw else ahat
      _, w = fn(q, k, v, causal=causal, mask_BS=mask_BS, **kw)
      w = np.asarray(w, np.float64)
      assert np.all(w >= 0) and np.isfinite(w).all()
      np.testing.assert_allclose(w.sum(-1), expected, rtol=0, atol=1e-6)
    assert (sees == 0).any() == (mask_BS is not None)


def test_tol_groups_near_ties():
  assert np.float32(1.0 + 1e-7) != np.float32(1.0)  # distinct in float32
  q = np.ones((1, 1, 1, 1), np.float32)
  k = np.asarray([1.0, 1.0 + 1e-7], np.float32).reshape(1, 2, 1, 1)
  v = np.asarray([0.0, 2.0], np.float32).reshape(1, 2, 1, 1)
  strict, w0 = ahat(q, k, v, causal=False, tol=0.0)
  loose, w1 = ahat(q, k, v, causal=False, tol=1e-6)
  assert float(strict[0, 0, 0, 0]) == 2.0 and float(loose[0, 0, 0, 0]) == 1.0
  np.testing.assert_array_equal(w0[0, 0, 0], [0.0, 1.0])
  np.testing.assert_array_equal(w1[0, 0, 0], [0.5, 0.5])
  for tol, got in ((0.0, strict), (1e-6, loose)):
    np.testing.assert_array_equal(got, numpy_ahat(q, k, v, False, tol=tol)[0])


def test_tol_matches_numpy_loop_on_real_scores():
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  out, _ = ahat(q, k, v, causal=True, tol=1.0)
  want, w = numpy_ahat(q, k, v, True, tol=1.0)
  assert (np.count_nonzero(w, axis=-1) > 1).any()  # tol=1 groups some keys
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)


# --- the soft limit ---------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_soft_attention_matches_numpy_softmax_loop(causal):
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  for beta in (0.3, 1.0, 4.0):
    np.testing.assert_allclose(soft(q, k, v, beta=beta, causal=causal)[0],
                               numpy_soft(q, k, v, beta, causal), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["rasp", "binary"])
def test_soft_attention_with_large_beta_is_ahat_on_integer_scores(kind, causal):
  q, k, v = _integer_case(kind)
  want = numpy_ahat(q, k, v, causal)[0]
  np.testing.assert_allclose(soft(q, k, v, beta=1e4, causal=causal)[0], want, rtol=0, atol=1e-5)


def test_soft_attention_error_decreases_with_beta():
  q, k, v = _integer_case("rasp", seed=1)  # score gaps of at least 1/2
  want = numpy_ahat(q, k, v, True)[0]
  errors = [float(np.abs(np.asarray(soft(q, k, v, beta=beta, causal=True)[0]) - want).max())
            for beta in (1.0, 10.0, 100.0)]
  assert errors[0] > errors[1] > errors[2], errors
  assert errors[0] > 0.1 and errors[2] < 1e-6, errors


# --- gradients --------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("causal",))
def ahat_grads(q, k, v, cot, mask, causal):
  return jax.grad(lambda q, k, v: jnp.sum(ahat_attention(q, k, v, causal=causal, mask_BS=mask) * cot),
                  argnums=(0, 1, 2))(q, k, v)


@jax.jit
def soft_grads(q, k, v, mask):
  return jax.grad(lambda q, k: jnp.sum(soft_attention(q, k, v, beta=1.0, causal=True, mask_BS=mask) ** 2),
                  argnums=(0, 1))(q, k)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["rasp", "real"])
def test_gradient_wrt_v_is_weights_transpose_times_upstream(kind, causal):
  if kind == "real":
    q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  else:
    q, k, v = _integer_case("rasp")
  cot = rand(3, (B, T, H, E))
  mask = np.asarray([[True] * T, [False, True, True, False, True, True, True]])
  gq, gk, gv = ahat_grads(q, k, v, cot, mask, causal)
  _, w = numpy_ahat(q, k, v, causal, mask)
  want = np.einsum("bhts,bthe->bshe", w, np.asarray(cot, np.float64))
  np.testing.assert_allclose(gv, want, rtol=0, atol=1e-6)
  assert np.all(np.asarray(gq) == 0.0) and np.all(np.asarray(gk) == 0.0)


def test_soft_attention_gradients_wrt_q_and_k_are_finite_and_nonzero():
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  mask = np.asarray([[True] * T, [False] * T])  # a fully masked batch element: no NaN from it
  gq, gk = soft_grads(q, k, v, mask)
  for g in (gq, gk):
    g = np.asarray(g)
    assert np.isfinite(g).all() and np.abs(g[0]).sum() > 0 and np.all(g[1] == 0.0)


# --- eager and jit, bad input ------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_works_under_jit_and_eagerly(causal):
  # every other test calls the module-level jits; here the eager calls are compared with them
  q, k, v = _integer_case("rasp")
  mask = np.asarray([[True] * T, [False, True, True, True, False, True, True]])
  # integer scores, sums of small integers and one division: bitwise equal by construction
  out_eager, w_eager = ahat_attention(q, k, v, causal=causal, mask_BS=mask, return_weights=True)
  out, w = ahat(q, k, v, causal=causal, mask_BS=mask)
  np.testing.assert_array_equal(out, out_eager)
  np.testing.assert_array_equal(w, w_eager)
  out, w = ahat(q, k, v, causal=causal, tol=0.25)
  want, want_w = numpy_ahat(q, k, v, causal, tol=0.25)
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
  np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-7)
  np.testing.assert_allclose(soft(q, k, v, causal=causal, beta=1.0, mask_BS=mask)[0],
                             soft_attention(q, k, v, causal=causal, beta=1.0, mask_BS=mask),
                             rtol=1e-6, atol=1e-7)


# --- KV cache: q_offset -------------------------------------------------------------------------------

# an awkward cache: odd sizes, three rows at different positions (row 2's queries at 7 .. 10 of 9 slots),
# key 0 of row 0 masked, so row 0's first query sees nothing
CB, CT, CS, BETA = 3, 4, 9, 1.5
OFFSETS = np.array([0, 3, 7], np.int32)
CACHE_MASK = np.ones((CB, CS), bool)
CACHE_MASK[0, 0] = CACHE_MASK[1, 2] = False


@jax.jit
def cached_reads(q, k, v, mask, offsets, cot):
  """Hard and soft reads with ``q_offset`` (outputs and maps), AHAT's (q, k, v)-gradients of ⟨out, cot⟩, and
  the soft form's values and (q, k, v)-gradients next to jax.nn.dot_product_attention's with the explicit mask
  ``s <= offset + t`` and the key mask (scale β; v as wide as k)."""
  T, S = q.shape[1], k.shape[1]
  hard = ahat_attention(q, k, v, causal=True, mask_BS=mask, q_offset=offsets, return_weights=True)
  soft_ = soft_attention(q, k, v, beta=BETA, causal=True, mask_BS=mask, q_offset=offsets, return_weights=True)
  hard_read = lambda q, k, v: ahat_attention(q, k, v, causal=True, mask_BS=mask, q_offset=offsets)
  hard_grads = jax.grad(lambda q, k, v: jnp.sum(hard_read(q, k, v) * cot), argnums=(0, 1, 2))(q, k, v)
  position_T = offsets[:, None, None, None] + jnp.arange(T)[None, None, :, None]
  full = (jnp.arange(S)[None, None, None, :] <= position_T) & mask[:, None, None, :]
  vk = k[..., ::-1] * 0.5 + 1.0   # values as wide as the keys, for jax.nn
  cot_k = cot[..., :1] * jnp.ones_like(q)
  def vjp(fn):
    out, pullback = jax.vjp(fn, q, k, vk)
    return out, pullback(cot_k)
  ours = vjp(lambda q, k, v: soft_attention(q, k, v, beta=BETA, causal=True, mask_BS=mask, q_offset=offsets))
  ref = vjp(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=full, scale=BETA))
  return hard, soft_, hard_grads, ours, ref


@pytest.mark.parametrize("kind", ["binary", "real"])
def test_q_offset_reads_each_rows_prefix_hard_and_soft(kind):
  make = binary if kind == "binary" else rand
  q, k, v = make(0, (CB, CT, H, D)), make(1, (CB, CS, H, D)), small_ints(2, (CB, CS, H, E))
  cot = rand(3, (CB, CT, H, E))
  cot[0, 0] = 0.0   # the query that sees nothing (jax.nn averages its row; ours reads zeros)
  (out, w), (sout, sw), (gq, gk, gv), (o, g), (o_ref, g_ref) = cached_reads(q, k, v, CACHE_MASK, OFFSETS, cot)
  want, want_w = numpy_ahat(q, k, v, True, CACHE_MASK, q_offset=OFFSETS)
  assert out.shape == (CB, CT, H, E) and w.shape == (CB, H, CT, CS)
  if kind == "binary":
    assert (np.count_nonzero(want_w, axis=-1) > 1).mean() > 0.3   # mostly ties
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
  np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-7)
  np.testing.assert_allclose(sout, numpy_soft(q, k, v, BETA, True, CACHE_MASK, OFFSETS), rtol=1e-5, atol=1e-6)
  # nothing visible: zeros, maps of zeros
  assert np.all(np.asarray(out)[0, 0] == 0) and np.all(np.asarray(sout)[0, 0] == 0)
  assert np.all(np.asarray(w)[0, :, 0] == 0) and np.all(np.asarray(sw)[0, :, 0] == 0)
  np.testing.assert_allclose(np.asarray(sw).sum(-1)[:, :, 1:], 1.0, rtol=1e-6)
  # gradients: AHAT's w.r.t. v is the maps' transpose times the upstream, zero w.r.t. q and k
  np.testing.assert_allclose(gv, np.einsum("bhts,bthe->bshe", want_w, np.asarray(cot, np.float64)),
                             rtol=0, atol=1e-6)
  assert np.all(np.asarray(gq) == 0.0) and np.all(np.asarray(gk) == 0.0)
  # the soft form against jax.nn with the explicit mask, values (where a key is visible) and gradients
  sees = np.ones((CB, CT), bool)
  sees[0, 0] = False
  np.testing.assert_allclose(np.asarray(o)[sees], np.asarray(o_ref)[sees], rtol=1e-5, atol=1e-6)
  for name, a, b in zip("qkv", g, g_ref, strict=True):
    assert np.isfinite(np.asarray(a)).all()
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")


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
        (_QKV, {"q_offset": np.zeros(1, np.int32)}, r"needs causal=True"),
        (_QKV, {"causal": True, "q_offset": np.zeros(2, np.int32)}, r"`q_offset` must have shape"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(shapes, kwargs, match):
  q, k, v = (np.zeros(s, np.float32) for s in shapes)
  with pytest.raises(ValueError, match=match):
    ahat_attention(q, k, v, **kwargs)
  if "tol" not in kwargs:
    with pytest.raises(ValueError, match=match):
      soft_attention(q, k, v, beta=1.0, **kwargs)


@pytest.mark.parametrize("beta", [0.0, -1.0, float("nan"), float("inf"), None])
def test_soft_attention_rejects_bad_beta(beta):
  q, k, v = (np.zeros(s, np.float32) for s in _QKV)
  with pytest.raises(ValueError, match=r"`beta` must be"):
    soft_attention(q, k, v, beta=beta)


@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_packed_sequences_equal_each_document_alone(kind):
  # segment_ids: the argmax set (or the soft weights) is taken over the query's own document; integer-valued
  # scores make ties, so the hard case checks tie sets across documents; values and gradients
  from tests.kernels.packed import PACKED, check_packed_equals_alone
  r = np.random.default_rng(47)
  xs = tuple(r.integers(-2, 3, PACKED.shape + (2, w)).astype(np.float32) for w in (3, 3, 4))
  call = ahat_attention if kind == "hard" else functools.partial(soft_attention, beta=2.0)
  fn = lambda q, k, v, segment_ids=None: call(q, k, v, causal=True, segment_ids=segment_ids)
  check_packed_equals_alone(fn, xs, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"`segment_ids` must have shape \[B, T\]"):
    fn(*xs, segment_ids=PACKED[:1])


def test_sublayer_refuses_weights_that_do_not_fit():
  # ahat_sublayer (the fixed-weight sublayer of the RASP models and the simulator): shapes named in the message
  from jaxmem.kernels.ahat import ahat_sublayer
  x = np.zeros((1, 3, 4), np.float32)
  wq, wv, wo = np.zeros((2, 4, 5), np.float32), np.zeros((2, 4, 6), np.float32), np.zeros((2, 6, 4), np.float32)
  with pytest.raises(ValueError, match="`x_BTD` must have rank 3"):
    ahat_sublayer(x[0], wq, wq, wv, wo)
  with pytest.raises(ValueError, match=r"`wk_HDK` has shape \(2, 3, 5\)"):
    ahat_sublayer(x, wq, wq[:, :3], wv, wo)
  with pytest.raises(ValueError, match="`wo_HVD` the value width 6"):
    ahat_sublayer(x, wq, wq, wv, wo[:, :5])
