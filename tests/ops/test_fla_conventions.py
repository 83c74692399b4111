"""``jaxmem.ops`` returns what fla 0.6 returns and behaves the same under ``jit`` as outside it.

* normalised linear attention returns the key sum ``z`` with or without the state: ``(o, (h, z))`` /
  ``(o, (None, z))``, and takes ``initial_state = (None, z)``;
* the final state is float32 for bfloat16 inputs and a bfloat16 ``initial_state`` (fla's kernels read the
  state into float32 and write it as float32), ``z`` in ``k``'s dtype;
* the erasing rules' stability is not checked, eagerly or under ``jit`` (fla does not check it; jaxmem raised
  outside ``jit`` only);
* Oja's ``gv [B, T, HV, V]`` (fla's form, a decay per value channel) runs eagerly and under ``jit``, against a
  float64 loop of fla's update, values, final states and gradients, varlen included.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmem.ops as ops
from jaxmem.ops import common, delta_rule, gated_delta_rule, gated_oja_rule, linear_attn, simple_gla

B, T, H, HV, K, V = 2, 11, 1, 2, 3, 4
CU = np.array([0, 4, 4, 11], np.int32)  # three sequences, one empty, the last spanning the rest


def unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


@functools.cache
def inputs(seed=0):
  """float32 ``(q, k, v, gv [B, T, HV, V], beta, h0)``: positive q, k (a normaliser away from 0), unit k and v,
  β ∈ (0.1, 0.9), per-channel decays γ ∈ (0.5, 1)."""
  r = np.random.default_rng(seed)
  q = np.abs(r.normal(size=(B, T, H, K)))
  k = unit(np.abs(r.normal(size=(B, T, H, K))))
  v = unit(r.normal(size=(B, T, HV, V)))
  gv = np.log(r.uniform(0.5, 1.0, (B, T, HV, V)))
  beta = r.uniform(0.1, 0.9, (B, T, HV))
  h0 = 0.5 * r.normal(size=(B, HV, K, V))
  return tuple(np.asarray(x, np.float32) for x in (q, k, v, gv, beta, h0))


# ----------------------------------------------------------------------------------------
# normalised linear attention: (o, (None, z))

SEGMENTS = np.array([[1, 1, 1, 2, 2, 2, 0, 2, 2, 0, 0],    # row 0: two segments, padding inside and after
                     [0, 0, 5, 5, 5, 5, 5, 5, 5, 5, 5]],   # row 1: one segment after padding (continues z0)
                    np.int32)


def key_sums_by_hand(k, z0, z0_cu):
  """float64 final key sums ``[N, 1, H, K]``: for whole rows, each sequence of ``CU`` (row 0 packed), and each
  row of ``SEGMENTS`` (row 0's last segment, tokens 3, 4, 5, 7, 8, starts empty)."""
  k, z0 = np.asarray(k, np.float64), np.asarray(z0, np.float64)
  rows = z0 + k.sum(1)[:, None]
  cu = np.stack([z0_cu[n] + k[0, CU[n]:CU[n + 1]].sum(0)[None] for n in range(3)], 0)
  seg = np.stack([k[0, [3, 4, 5, 7, 8]].sum(0)[None], z0[1] + k[1, 2:].sum(0)[None]])
  return rows, cu, seg


@pytest.mark.parametrize("op", [ops.chunk_linear_attn, ops.fused_recurrent_linear_attn])
def test_normalized_linear_attn_returns_the_key_sum_with_or_without_the_state(op):
  # fla 0.6's chunk_linear_attn / fused_recurrent_linear_attn with normalize=True return (o, (h, z)), and
  # (o, (None, z)) when output_final_state=False; jaxmem returned (o, None). z is the key sum after the last
  # token, from z0; checked for rows, cu_seqlens (an empty sequence keeps z0) and segment_ids (padding, a later
  # segment starting empty), against sums by hand and against the z of output_final_state=True
  q, k, v, _, _, h0 = inputs()
  h0 = h0[:, :H]  # no grouped value heads in linear attention
  v = v[:, :, :H]
  z0 = np.abs(h0[..., 0])[:, None]  # [B, 1, H, K]
  z0_cu = np.concatenate([z0, z0[:1]])  # N = 3 sequences
  h0_cu = np.concatenate([h0, h0[:1]])
  want_rows, want_cu, want_seg = key_sums_by_hand(k, z0, z0_cu)
  calls = {
      "rows": (dict(), z0, h0, want_rows),
      "cu_seqlens": (dict(cu_seqlens=CU), z0_cu, h0_cu, want_cu),
      "segment_ids": (dict(segment_ids=SEGMENTS), z0, h0, want_seg),
  }
  for how, (kw, z_init, h_init, want) in calls.items():
    x = (q[:1], k[:1], v[:1]) if "cu_seqlens" in kw else (q, k, v)
    o, state = op(*x, normalize=True, initial_state=(h_init, z_init), **kw)
    o_full, (h, z_full) = op(*x, normalize=True, initial_state=(h_init, z_init), output_final_state=True, **kw)
    assert isinstance(state, tuple) and len(state) == 2 and state[0] is None, f"{how}: {type(state)}"
    z = state[1]
    assert z.shape == want.shape and z.dtype == jnp.float32, (how, z.shape, z.dtype)
    # float32 sums of at most 11 unit-norm keys: |z| <= 12, rounding a few eps of that
    np.testing.assert_allclose(z, want, rtol=1e-6, atol=1e-5, err_msg=how)
    np.testing.assert_allclose(z_full, want, rtol=1e-6, atol=1e-5, err_msg=f"{how} with the state")
    np.testing.assert_array_equal(o, o_full, err_msg=f"{how}: o does not depend on output_final_state")
    # fla accepts the (None, z) it returns as the next call's initial state: the matrix state starts at 0
    o_none, (_, z_none) = op(*x, normalize=True, initial_state=(None, z_init), **kw)
    o_zero, (_, z_zero) = op(*x, normalize=True, initial_state=(0 * h_init, z_init), **kw)
    np.testing.assert_array_equal(o_none, o_zero, err_msg=f"{how}: (None, z) is (0, z)")
    np.testing.assert_array_equal(z_none, z_zero, err_msg=f"{how}: (None, z) is (0, z)")
  o, (none, z) = op(q, k, v, normalize=True)  # no initial state: z is the plain key sum
  assert none is None
  np.testing.assert_allclose(z, want_rows - z0, rtol=1e-6, atol=1e-5)


# ----------------------------------------------------------------------------------------
# dtypes: the final state float32 for bfloat16 inputs, as fla's

def bf16(x):
  return jnp.asarray(x, jnp.bfloat16)


def every_op(q, k, v, gv, beta, h0):
  """Each op with ``initial_state=h0`` and ``output_final_state=True``: ``{name: (o, state)}``."""
  g = gv[..., 0]
  kw = dict(initial_state=h0, output_final_state=True)
  one = lambda x: x[:, :, :H]  # the ops without grouped value heads in this test
  return {
      "chunk_linear_attn": ops.chunk_linear_attn(q, k, one(v), initial_state=h0[:, :H], output_final_state=True,
                                                 normalize=False),
      "chunk_linear_attn[normalize]": ops.chunk_linear_attn(q, k, one(v), initial_state=(h0[:, :H], None),
                                                            output_final_state=True),
      "fused_recurrent_linear_attn": ops.fused_recurrent_linear_attn(q, k, one(v), initial_state=h0[:, :H],
                                                                     output_final_state=True),
      "chunk_simple_gla": ops.chunk_simple_gla(q, k, v, g, **kw),
      "fused_recurrent_simple_gla": ops.fused_recurrent_simple_gla(q, k, v, g, **kw),
      "chunk_delta_rule": ops.chunk_delta_rule(q, k, v, beta, **kw),
      "fused_recurrent_delta_rule": ops.fused_recurrent_delta_rule(q, k, v, beta, **kw),
      "chunk_gated_delta_rule": ops.chunk_gated_delta_rule(q, k, v, g, beta, **kw),
      "fused_recurrent_gated_delta_rule": ops.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, **kw),
      "chunk_gated_oja_rule": ops.chunk_gated_oja_rule(q, k, v, g, beta, **kw),
      "chunk_gated_oja_rule[gv per channel]": ops.chunk_gated_oja_rule(q, k, v, gv, beta, **kw),
      "fused_recurrent_gated_oja_rule": ops.fused_recurrent_gated_oja_rule(q, k, v, g, beta, **kw),
  }


def test_every_op_returns_a_float32_state_for_bfloat16_inputs():
  # fla's kernels write the final state as float32 whatever the inputs' and h0's dtypes; jaxmem returned it in
  # h0's dtype. Every op on all-bfloat16 inputs (initial state included), shapes and dtypes only (eval_shape:
  # nothing compiles): o in bfloat16, the state float32; normalised linear attention's z in k's dtype
  shapes = jax.eval_shape(every_op, *(bf16(x) for x in inputs()))
  for name, (o, state) in shapes.items():
    assert o.dtype == jnp.bfloat16, (name, o.dtype)
    if name.endswith("[normalize]"):
      h, z = state
      assert h.dtype == jnp.float32 and z.dtype == jnp.bfloat16, (name, h.dtype, z.dtype)
    else:
      assert state.dtype == jnp.float32, (name, state.dtype)


def test_bfloat16_inputs_give_the_float32_state_of_their_values():
  # the state is not rounded through bfloat16 on the way: from bfloat16 inputs it equals, to float32 rounding,
  # the state of the same values held in float32 (a bfloat16 state differed by its rounding, 4e-3 relative)
  q, k, v, gv, beta, h0 = (bf16(x) for x in inputs())
  f32 = lambda x: x.astype(jnp.float32)
  for op in (ops.chunk_gated_delta_rule, ops.fused_recurrent_gated_delta_rule):
    _, h = op(q, k, v, gv[..., 0], beta=beta, initial_state=h0, output_final_state=True)
    _, want = op(*(f32(x) for x in (q, k, v, gv[..., 0])), beta=f32(beta), initial_state=f32(h0),
                 output_final_state=True)
    # the same float32 program on the same values
    np.testing.assert_allclose(np.asarray(h, np.float32), want, rtol=1e-6, atol=1e-6)
    assert h.dtype == jnp.float32


# ----------------------------------------------------------------------------------------
# stability: no check, eagerly or under jit (as fla)

def test_an_unstable_erasing_rule_runs_the_same_eagerly_and_under_jit():
  # β‖k‖² = 3 > 2 diverges (the erase factor 1 − 3 = −2 doubles the state along k each token). fla does not
  # check; jaxmem raised a ValueError outside jit (naming `normalize_keys`, which the ops do not have) and
  # returned |o| ~ 1e6 under jit. Now both return the recurrence's values
  q, k, v, gv, beta, h0 = inputs()
  beta3 = np.full_like(beta, 3.0)
  calls = {
      "chunk_delta_rule": lambda q, k, v, b: ops.chunk_delta_rule(q, k, v, b, chunk_size=4),
      "fused_recurrent_gated_delta_rule": lambda q, k, v, b: ops.fused_recurrent_gated_delta_rule(
          q, k, v, g=0 * gv[..., 0], beta=b),
      "chunk_gated_oja_rule": lambda q, k, v, b: ops.chunk_gated_oja_rule(q, k, v, None, b, chunk_size=4),
  }
  for name, call in calls.items():
    eager, _ = call(q, k, v, beta3)
    jitted, _ = jax.jit(call)(q, k, v, beta3)
    assert np.max(np.abs(eager)) > 10, f"{name}: the unstable rule grows (a stable one stays below 2 here)"
    # the same recurrence in float32: relative rounding of order T·eps, which the divergence does not amplify
    np.testing.assert_allclose(eager, jitted, rtol=1e-4, atol=1e-4, err_msg=name)


def test_the_ops_name_their_own_flags_in_their_stability_notes():
  # the ops' documentation names use_qk_l2norm_in_kernel (theirs), never normalize_keys (the kernel's)
  for module in (ops, common, delta_rule, gated_delta_rule, gated_oja_rule, linear_attn, simple_gla):
    assert "normalize_keys" not in (module.__doc__ or ""), module.__name__
  for module in (common, delta_rule, gated_delta_rule):
    assert "use_qk_l2norm_in_kernel=True" in module.__doc__, module.__name__


# ----------------------------------------------------------------------------------------
# Oja with a decay per value channel, gv [B, T, HV, V]

def oja_reference(q, k, v, gv, beta, h0, scale):
  """fla's fused_recurrent_gated_oja_rule update, token by token on ``h [K, V]`` (float64 ``lax.scan``):
  ``h ← h · diag(e^gv)``, ``h ← h + β (k − h v) vᵀ``, ``o = hᵀ (scale · q)``; value head j reads key head
  ``j // (HV / H)``."""
  group = v.shape[2] // q.shape[2]
  q, k = (x[:, :, np.arange(v.shape[2]) // group] for x in (q, k))

  def step(h, x):
    q_t, k_t, v_t, g_t, b_t = x
    h = h * jnp.exp(g_t)[..., None, :]
    err = k_t - jnp.einsum("bhkv,bhv->bhk", h, v_t)
    h = h + b_t[..., None, None] * err[..., :, None] * v_t[..., None, :]
    return h, jnp.einsum("bhkv,bhk->bhv", h, scale * q_t)

  h, o = jax.lax.scan(step, h0, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, gv, beta)))
  return jnp.moveaxis(o, 0, 1), h


@pytest.mark.parametrize("op", [ops.chunk_gated_oja_rule, ops.fused_recurrent_gated_oja_rule])
def test_oja_with_a_decay_per_value_channel_runs_under_jit(op):
  # fla's only form of gv; refused under jit before. Values, final states and the gradients w.r.t. every input
  # and h0 (one jitted program) against a float64 loop; the eager call gives the same
  q, k, v, gv, beta, h0 = inputs()
  xs = (q, k, v, gv, beta, h0)
  call = lambda q, k, v, gv, beta, h0: op(q, k, v, gv, beta, initial_state=h0, output_final_state=True)
  cot = tuple(np.asarray(np.random.default_rng(5).normal(size=s), np.float32)
              for s in ((B, T, HV, V), (B, HV, K, V)))

  def run(*xs):
    out, pullback = jax.vjp(call, *xs)
    return out, pullback(cot)

  (o, h), grads = jax.jit(run)(*xs)
  eager_o, eager_h = call(*xs)
  with jax.enable_x64(True):
    xs64 = tuple(jnp.asarray(x, jnp.float64) for x in xs)
    (ro, rh), pullback = jax.vjp(lambda *a: oja_reference(*a, K ** -0.5), *xs64)
    want = pullback(tuple(jnp.asarray(c, jnp.float64) for c in cot))
  # float32 through 11 tokens of unit-norm writes: values of order 1, rounding ~1e-6 per step
  np.testing.assert_allclose(o, ro, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(h, rh, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(eager_o, o, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(eager_h, h, rtol=1e-5, atol=1e-6)
  for name, a, b in zip(("q", "k", "v", "gv", "beta", "initial_state"), grads, want, strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=5e-5, err_msg=f"d/d{name}")


def test_oja_with_a_decay_per_value_channel_varlen_equals_each_sequence_alone():
  # cu_seqlens (concrete and traced; per-sequence initial and final states, an empty sequence keeping its
  # h0) and segment_ids (padding reads 0 and writes nothing; a later segment starts empty; the row's state is
  # its last segment's), against the op on each sequence alone
  q, k, v, gv, beta, h0 = inputs()
  h0_cu = np.concatenate([h0, h0[:1]])  # N = 3
  op = ops.fused_recurrent_gated_oja_rule

  def packed(cu):
    return op(q[:1], k[:1], v[:1], gv[:1], beta[:1], initial_state=h0_cu, output_final_state=True,
              cu_seqlens=cu)

  def alone(b, s, init):
    return op(q[b:b + 1, s], k[b:b + 1, s], v[b:b + 1, s], gv[b:b + 1, s], beta[b:b + 1, s], initial_state=init,
              output_final_state=True)

  seqs = [alone(0, slice(CU[n], CU[n + 1]), h0_cu[n:n + 1]) for n in (0, 2)]
  want_o = jnp.concatenate([seqs[0][0], seqs[1][0]], axis=1)
  want_h = np.concatenate([seqs[0][1], h0_cu[1:2], seqs[1][1]])
  for how, (o, h) in (("concrete", packed(CU)), ("jit", jax.jit(packed)(jnp.asarray(CU)))):
    np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-6, err_msg=f"{how} o")
    np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-6, err_msg=f"{how} final states")

  o, h = op(q, k, v, gv, beta, initial_state=h0, output_final_state=True, segment_ids=SEGMENTS)
  first, _ = alone(0, slice(0, 3), h0[:1])
  last_o, last_h = alone(0, np.array([3, 4, 5, 7, 8]), 0 * h0[:1])
  np.testing.assert_allclose(o[0, :3], first[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(o[0, [3, 4, 5, 7, 8]], last_o[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(h[0], last_h[0], rtol=1e-5, atol=1e-6)
  row1_o, row1_h = alone(1, slice(2, T), h0[1:])
  np.testing.assert_allclose(o[1, 2:], row1_o[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(h[1], row1_h[0], rtol=1e-5, atol=1e-6)
  assert not np.any(o[0, [6, 9, 10]]) and not np.any(o[1, :2]), "padding reads 0"


def test_oja_per_channel_decay_with_equal_channels_equals_the_per_head_decay():
  # gv [B, T, HV, V] with equal channels (the scan) and gv[..., 0] [B, T, HV] (the chunked kernel) agree
  q, k, v, gv, beta, h0 = inputs()
  per_head = np.repeat(gv[..., :1], V, axis=-1)
  o, h = ops.chunk_gated_oja_rule(q, k, v, per_head, beta, initial_state=h0, output_final_state=True)
  o2, h2 = ops.chunk_gated_oja_rule(q, k, v, gv[..., 0], beta, initial_state=h0, output_final_state=True,
                                    chunk_size=4)
  np.testing.assert_allclose(o, o2, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(h, h2, rtol=1e-5, atol=1e-6)

