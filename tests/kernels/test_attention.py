"""softmax_attention vs an independent float64 numpy loop and jax.nn.dot_product_attention.

Proven: values against the numpy loop (causal, cross-attention with S > T and S < T, non-causal
self-attention, a custom scale, T = 1); values and gradients against jax.nn.dot_product_attention;
gradients (first and second order) against float64 finite differences; causality (future keys and
values cannot reach earlier outputs); bfloat16 in, bfloat16 out; huge logits stay finite; bad
input raises a ValueError naming the problem. Every kernel call is compiled once per module
(module-level jits over a few canonical awkward shapes: odd T, odd D, D != E, B > 1, H > 1).

KV cache (``q_offset``, ``kv_cache_init`` / ``kv_cache_append``): appending writes each row at its own
positions and drops (never wraps) what does not fit; reading with ``q_offset`` matches the loop over each
row's visible prefix, rows at different positions, a row past ``max_len`` included; values and gradients
match ``jax.nn.dot_product_attention`` with the equivalent explicit mask; a query that sees no key (negative
offset) averages every value, finite in values and gradients.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.attention import kv_cache_append, kv_cache_init, softmax_attention


def numpy_attention(q, k, v, causal, scale=None, q_offset=None):
  """Plain per-(batch, head, query) loop, float64: the paper's equation, nothing shared. With ``q_offset``
  (causal), query ``t`` of row ``b`` sees keys ``0 .. q_offset[b] + t`` (all ``S`` past the end); one that
  sees none averages every value uniformly (the kernel's fully masked row)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  B, T, H, D = q.shape
  S, E = k.shape[1], v.shape[-1]
  scale = D ** -0.5 if scale is None else scale
  out = np.zeros((B, T, H, E))
  for b in range(B):
    for h in range(H):
      for t in range(T):
        n = t + 1 if causal else S
        if q_offset is not None:
          n = min(int(q_offset[b]) + t + 1, S)
          if n <= 0:
            out[b, t, h] = v[b, :, h].mean(0)
            continue
        logits = np.array([scale * q[b, t, h] @ k[b, s, h] for s in range(n)])
        w = np.exp(logits - logits.max())
        w /= w.sum()
        out[b, t, h] = sum(w[s] * v[b, s, h] for s in range(n))
  return out


def rand(seed, shape, dtype=np.float32):
  """Standard normal inputs drawn in numpy (no JAX program per shape)."""
  return np.random.default_rng(seed).normal(size=shape).astype(dtype)


# The canonical shape: odd T and D, D != E, B > 1, H > 1.
B, T, H, D, E = 2, 7, 3, 5, 4

attend = jax.jit(softmax_attention, static_argnames=("causal", "scale"))


@functools.partial(jax.jit, static_argnames=("causal",))
def ours_and_jax_nn(q, k, v, cot, causal):
  """Values and (q, k, v)-cotangents of softmax_attention and of jax.nn.dot_product_attention."""
  def vjp(fn):
    out, pullback = jax.vjp(fn, q, k, v)
    return out, pullback(cot)
  return (vjp(lambda q, k, v: softmax_attention(q, k, v, causal=causal)),
          vjp(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal)))


@pytest.mark.parametrize("shape", [(B, T, H, D, E), (3, 1, 1, 3, 6)], ids=["canonical", "T1"])
def test_causal_matches_numpy_loop(shape):
  b, t, h, d, e = shape
  q, k, v = rand(0, (b, t, h, d)), rand(1, (b, t, h, d)), rand(2, (b, t, h, e))
  out = attend(q, k, v, causal=True)
  assert out.shape == (b, t, h, e) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, numpy_attention(q, k, v, True), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("S", [11, 3, T])
def test_cross_attention_matches_numpy_loop(S):
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, S, H, D)), rand(2, (B, S, H, E))
  out = attend(q, k, v, causal=False)
  np.testing.assert_allclose(out, numpy_attention(q, k, v, False), rtol=2e-5, atol=2e-6)


def test_custom_scale_matches_numpy_loop():
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  out = attend(q, k, v, causal=True, scale=0.37)
  np.testing.assert_allclose(out, numpy_attention(q, k, v, True, 0.37), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("causal,S", [(True, T), (False, 11)])
def test_values_and_gradients_match_jax_nn(causal, S):
  # jax.nn.dot_product_attention needs the value width equal to the key width
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, S, H, D)), rand(2, (B, S, H, D))
  cot = rand(3, (B, T, H, D))
  (o_ours, g_ours), (o_ref, g_ref) = ours_and_jax_nn(q, k, v, cot, causal)
  np.testing.assert_allclose(o_ours, o_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.sum(np.asarray(o_ours, np.float64) * cot),
                             np.sum(np.asarray(o_ref, np.float64) * cot), rtol=1e-5)
  for name, a, b in zip("qkv", g_ours, g_ref, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")


def _causal(q, k, v):
  return softmax_attention(q, k, v, causal=True)


def _causal_vjp_at_output(q, k, v):
  """The second-order check's function: the attention's VJP applied to its own output."""
  out, pullback = jax.vjp(_causal, q, k, v)
  return pullback(out)


def directional_check(f):
  """A jitted float64 check of ``f``'s VJP: returns ``(⟨vjp(cot), u⟩, ⟨central difference along u, cot⟩)``."""
  @jax.jit
  def run(args, u, cot, eps):
    shifted = lambda sign: f(*jax.tree.map(lambda a, d: a + sign * eps * d, args, u))
    fd = jax.tree.map(lambda p, m: (p - m) / (2 * eps), shifted(1.0), shifted(-1.0))
    _, pullback = jax.vjp(f, *args)
    inner = lambda xs, ys: sum(jnp.sum(x * y) for x, y in zip(jax.tree.leaves(xs), jax.tree.leaves(ys),
                                                                  strict=True))
    return inner(pullback(cot), u), inner(fd, cot)
  return run


_first_order = directional_check(_causal)
_second_order = directional_check(_causal_vjp_at_output)


def test_gradients_match_finite_differences_float64():
  # what check_grads(order=2, modes=("rev",)) checks: the VJP of the attention, and the VJP of
  # that VJP, each against a central difference along a random direction (its float64 tolerance)
  with jax.enable_x64(True):
    shapes = ((1, 5, 2, 3), (1, 5, 2, 3), (1, 5, 2, 4))
    args = tuple(jnp.asarray(rand(i, s, np.float64)) for i, s in enumerate(shapes))
    r = np.random.default_rng(10)
    u = tuple(r.normal(size=a.shape) for a in args)
    for name, check, out_shapes in (("first order", _first_order, ((1, 5, 2, 4),)),
                                    ("second order", _second_order, tuple(a.shape for a in args))):
      cot = tuple(r.normal(size=s) for s in out_shapes)
      cot = cot[0] if len(cot) == 1 else cot
      vjp_u, fd_cot = check(args, u, cot, 1e-4)
      np.testing.assert_allclose(vjp_u, fd_cot, rtol=1e-5, atol=1e-5, err_msg=name)


def test_causal_output_ignores_future_keys_and_values():
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  k2, v2 = k.copy(), v.copy()
  k2[:, 4:], v2[:, 4:] = 100.0, -50.0
  a = attend(q, k, v, causal=True)
  b = attend(q, k2, v2, causal=True)
  np.testing.assert_array_equal(a[:, :4], b[:, :4])
  assert not np.allclose(a[:, 4:], b[:, 4:])


def test_bfloat16_inputs_give_bfloat16_close_to_float32():
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  out16 = attend(*(x.astype(jnp.bfloat16) for x in (q, k, v)), causal=True)
  assert out16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out16, np.float32), attend(q, k, v, causal=True), atol=5e-2)


def test_jit_and_large_logits_stay_finite():
  q = rand(0, (B, T, H, D)) * 1e4
  out = attend(q, q, rand(2, (B, T, H, E)), causal=True)
  assert np.isfinite(np.asarray(out)).all()


@pytest.mark.parametrize(
    "shapes,kwargs,match",
    [
        (((2, 5, 4), (2, 5, 4), (2, 5, 4)), {}, r"`q` must have rank 4"),
        (((1, 5, 2, 4), (1, 5, 4), (1, 5, 2, 4)), {}, r"`k` must have rank 4"),
        (((1, 5, 2, 4), (1, 5, 3, 4), (1, 5, 3, 4)), {}, r"`k` and `v` have 3 heads, which must divide the 2"),
        (((1, 5, 2, 4), (1, 5, 2, 4), (1, 5, 1, 4)), {}, r"numbers of heads: k=2, v=1"),
        (((1, 5, 2, 4), (1, 5, 2, 6), (1, 5, 2, 4)), {}, r"key widths: q=4, k=6"),
        (((2, 5, 2, 4), (1, 5, 2, 4), (1, 5, 2, 4)), {}, r"batch sizes"),
        (((1, 5, 2, 4), (1, 5, 2, 4), (1, 6, 2, 4)), {}, r"key/value lengths: k=5, v=6"),
        (((1, 5, 2, 4), (1, 7, 2, 4), (1, 7, 2, 4)), {}, r"causal attention needs equal"),
        (((1, 5, 2, 4), (1, 5, 2, 4), (1, 5, 2, 4)), {"scale": float("nan")}, r"`scale`"),
    ],
)
def test_bad_input_raises_value_error_naming_the_problem(shapes, kwargs, match):
  q, k, v = (np.zeros(s, np.float32) for s in shapes)
  with pytest.raises(ValueError, match=match):
    softmax_attention(q, k, v, **kwargs)


# --- KV cache: q_offset ----------------------------------------------------------------------------------

# an awkward cache: odd sizes, D != E, three rows at different positions, the last one past max_len
CB, CT, CS = 3, 4, 11
OFFSETS = np.array([0, 5, 9], np.int32)   # row 2: queries at 9 .. 12 of a cache of 11


def _masked_reference(q, k, v, offsets):
  """jax.nn.dot_product_attention with the explicit [B, 1, T, S] mask ``s <= offset + t``."""
  T, S = q.shape[1], k.shape[1]
  mask = np.arange(S)[None, None, None, :] <= offsets[:, None, None, None] + np.arange(T)[None, None, :, None]
  return jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask))


@jax.jit
def cached_and_masked(q, k, v, offsets, cot):
  """Values and (q, k, v)-cotangents of softmax_attention(q_offset=offsets) and of the masked reference."""
  def vjp(fn):
    out, pullback = jax.vjp(fn, q, k, v)
    return out, pullback(cot)
  return (vjp(lambda q, k, v: softmax_attention(q, k, v, causal=True, q_offset=offsets)),
          vjp(lambda q, k, v: _masked_reference(q, k, v, offsets)))


def test_q_offset_reads_each_rows_prefix_values_and_gradients():
  q, k, v = rand(0, (CB, CT, H, D)), rand(1, (CB, CS, H, D)), rand(2, (CB, CS, H, E))
  out = attend(q, k, v, causal=True, q_offset=OFFSETS)
  assert out.shape == (CB, CT, H, E)
  np.testing.assert_allclose(out, numpy_attention(q, k, v, True, q_offset=OFFSETS), rtol=2e-5, atol=2e-6)
  # keys after a query's position cannot reach it
  k2, v2 = k.copy(), v.copy()
  later = np.arange(CS)[None, :] > OFFSETS[:, None]   # after each row's first query
  k2[later], v2[later] = 100.0, -50.0
  np.testing.assert_array_equal(attend(q, k2, v2, causal=True, q_offset=OFFSETS)[:, 0], out[:, 0])
  # values and gradients against jax.nn with the explicit mask (it needs E == D)
  vD, cot = rand(3, (CB, CS, H, D)), rand(4, (CB, CT, H, D))
  (o, g), (o_ref, g_ref) = cached_and_masked(q, k, vD, OFFSETS, cot)
  np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-6)
  for name, a, b in zip("qkv", g, g_ref, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")
  assert np.abs(np.asarray(g[1])[later & (np.arange(CS)[None, :] > OFFSETS[:, None] + CT - 1)]).max() == 0


def test_q_offset_query_that_sees_no_key_averages_every_value_finite():
  """A negative offset (never produced by a cache; possible under jit) masks every key of the first queries:
  the documented fully masked row, uniform weights, finite values and gradients."""
  q, k, v = rand(0, (CB, CT, H, D)), rand(1, (CB, CS, H, D)), rand(2, (CB, CS, H, D))
  offsets = np.array([-2, 0, -9], np.int32)   # row 0: queries 0, 1 see nothing; row 2: none sees anything
  (o, g), (o_ref, g_ref) = cached_and_masked(q, k, v, offsets, rand(4, (CB, CT, H, D)))
  np.testing.assert_allclose(o, numpy_attention(q, k, v, True, q_offset=offsets), rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(o)[2], np.broadcast_to(v[2].mean(0), (CT, H, D)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-6)
  for a in g:
    assert np.isfinite(np.asarray(a)).all()


@jax.jit
def _append_twice(k1, v1, k2, v2, length):
  cache = kv_cache_init(CB, CS, H, D, E)
  cache = {**cache, "length": length}
  cache = kv_cache_append(cache, k1, v1)
  return cache, kv_cache_append(cache, k2, v2)


def test_kv_cache_append_writes_each_row_at_its_length_and_drops_past_the_end():
  k1, v1 = rand(0, (CB, CT, H, D)), rand(1, (CB, CT, H, E))
  k2, v2 = rand(2, (CB, 2, H, D)), rand(3, (CB, 2, H, E))
  start = np.array([0, 3, 6], np.int32)
  once, twice = _append_twice(k1, v1, k2, v2, start)
  np.testing.assert_array_equal(once["length"], start + CT)
  np.testing.assert_array_equal(twice["length"], start + CT + 2)   # row 2: 12 > max_len, the host sees it
  want_k = np.zeros((CB, CS, H, D), np.float32)
  for b in range(CB):
    for i, pos in enumerate(range(start[b], start[b] + CT + 2)):
      if pos < CS:   # positions past max_len are dropped, never wrapped onto earlier ones
        want_k[b, pos] = k1[b, i] if i < CT else k2[b, i - CT]
  np.testing.assert_array_equal(twice["k"], want_k)
  assert twice["k"].dtype == jnp.float32 and twice["v"].shape == (CB, CS, H, E)
  np.testing.assert_array_equal(twice["v"][2, 6:10], v1[2])
  np.testing.assert_array_equal(twice["v"][2, 10], v2[2, 0])


def test_q_offset_and_cache_bad_input_raise():
  q, k = np.zeros((2, 3, 2, 4), np.float32), np.zeros((2, 7, 2, 4), np.float32)
  with pytest.raises(ValueError, match="needs causal=True"):
    softmax_attention(q, k, k, causal=False, q_offset=np.zeros(2, np.int32))
  with pytest.raises(ValueError, match="must hold integers"):
    softmax_attention(q, k, k, q_offset=np.zeros(2, np.float32))
  with pytest.raises(ValueError, match=r"shape \(B,\)"):
    softmax_attention(q, k, k, q_offset=np.zeros(3, np.int32))
  cache = kv_cache_init(2, 7, 2, 4)
  with pytest.raises(ValueError, match="cache key widths"):
    kv_cache_append(cache, np.zeros((2, 3, 2, 5), np.float32), q)
  with pytest.raises(ValueError, match="cache batch sizes"):
    kv_cache_append(cache, q[:1], q[:1])


def test_grouped_query_attention_equals_repeated_key_value_heads():
  # H = 4 query heads over H_kv = 2 key/value heads (query head h reads kv head h // 2): the values and the
  # (q, k, v) gradients equal attention with each kv head repeated, whose kv gradients are the group's sums
  q, k, v = rand(40, (B, T, 4, D)), rand(41, (B, T, 2, D)), rand(42, (B, T, 2, E))
  cot = rand(43, (B, T, 4, E))
  rep = lambda x: jnp.repeat(x, 2, axis=2)
  loss = lambda f: lambda q, k, v: jnp.vdot(cot, f(q, k, v))
  grouped = jax.jit(jax.value_and_grad(loss(lambda q, k, v: softmax_attention(q, k, v)), (0, 1, 2)))(q, k, v)
  repeated = lambda q, k, v: softmax_attention(q, rep(k), rep(v))
  full = jax.jit(jax.value_and_grad(loss(repeated), (0, 1, 2)))(q, k, v)
  np.testing.assert_allclose(grouped[0], full[0], rtol=1e-5)
  for a, b in zip(grouped[1], full[1], strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"`k` and `v` have 3 heads, which must divide the 4 heads of `q`"):
    softmax_attention(q, rand(0, (B, T, 3, D)), rand(0, (B, T, 3, E)))


def test_packed_sequences_equal_each_document_alone():
  # segment_ids: a query attends to its own document only (grouped heads too); values and gradients
  from tests.kernels.packed import PACKED, check_packed_equals_alone
  xs = (rand(44, PACKED.shape + (4, D)), rand(45, PACKED.shape + (2, D)), rand(46, PACKED.shape + (2, E)))
  fn = lambda q, k, v, segment_ids=None: softmax_attention(q, k, v, segment_ids=segment_ids)
  check_packed_equals_alone(fn, xs, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"`segment_ids` must hold integers"):
    softmax_attention(*xs, segment_ids=PACKED.astype(np.float32))
  with pytest.raises(ValueError, match=r"does not combine with `q_offset`"):
    softmax_attention(*xs, segment_ids=PACKED, q_offset=np.zeros(2, np.int32))
