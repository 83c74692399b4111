"""``jaxmem.ops`` (fla's op surface) against a float64 loop written from fla's equations in fla's layout.

Every op, in both forms, on one awkward shape (T = 19 with chunk 8: three chunks, the last padded; K = 6, V = 5;
grouped value heads H = 2 → HV = 4), with fla's options: values, final states and the gradients of a random
cotangent w.r.t. every input (initial state included), each op one compiled program. Varlen (``cu_seqlens``,
under ``jit`` too, and ``segment_ids``) against each sequence run alone; a transposed state is caught where its
shape differs; the peer comparison with fla-core's own references is in test_ops_vs_fla.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmem.ops as ops

B, T, H, HV, K, V = 2, 19, 2, 4, 6, 5
CHUNK = 8


def unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


@functools.cache
def inputs(heads=HV, seed=0):
  """float32 ``(q, k, v, g, beta, h0)``; unit keys (and values, for Oja), β ∈ (0.1, 0.9), γ ∈ (0.5, 1)."""
  r = np.random.default_rng(seed)
  q = r.normal(size=(B, T, H, K))
  k = unit(r.normal(size=(B, T, H, K)))
  v = unit(r.normal(size=(B, T, heads, V)))
  g = np.log(r.uniform(0.5, 1.0, (B, T, heads)))
  beta = r.uniform(0.1, 0.9, (B, T, heads))
  h0 = 0.5 * r.normal(size=(B, heads, K, V))
  return tuple(np.asarray(x, np.float32) for x in (q, k, v, g, beta, h0))


def reference(rule, q, k, v, g, beta, h0, scale):
  """fla's recurrences token by token on ``h [K, V]`` (``lax.scan`` over T, float64): ``(o, h_T)``."""
  group = v.shape[2] // q.shape[2]
  q, k = (x[:, :, np.arange(v.shape[2]) // group] for x in (q, k))  # value head j reads key head j // group
  g = jnp.zeros(v.shape[:3], v.dtype) if g is None else g
  beta = jnp.ones(v.shape[:3], v.dtype) if beta is None else beta

  def step(h, x):  # h [B, HV, K, V]
    q_t, k_t, v_t, g_t, b_t = x
    h = jnp.exp(g_t)[..., None, None] * h
    if rule in ("hebb", "decay"):
      h = h + k_t[..., :, None] * v_t[..., None, :]
    elif rule in ("delta", "gated_delta"):
      err = v_t - jnp.einsum("bhkv,bhk->bhv", h, k_t)
      h = h + b_t[..., None, None] * k_t[..., :, None] * err[..., None, :]
    else:  # oja: h + β (k − h v) vᵀ
      err = k_t - jnp.einsum("bhkv,bhv->bhk", h, v_t)
      h = h + b_t[..., None, None] * err[..., :, None] * v_t[..., None, :]
    return h, jnp.einsum("bhkv,bhk->bhv", h, scale * q_t)

  xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta))
  h, o = jax.lax.scan(step, h0, xs)
  return jnp.moveaxis(o, 0, 1), h


# (op, the reference's rule, what the op takes, options): every op and form, fla's options spread over them
CASES = {
    "chunk_linear_attn": (ops.chunk_linear_attn, "hebb", "", dict(normalize=False, scale=0.7)),
    "fused_recurrent_linear_attn": (ops.fused_recurrent_linear_attn, "hebb", "", {}),
    "chunk_linear_attn[normalize]": (ops.chunk_linear_attn, "hebb", "", dict(normalize=True)),
    "fused_recurrent_linear_attn[normalize]": (ops.fused_recurrent_linear_attn, "hebb", "",
                                               dict(normalize=True)),
    "chunk_simple_gla": (ops.chunk_simple_gla, "decay", "g", {}),
    "fused_recurrent_simple_gla": (ops.fused_recurrent_simple_gla, "decay", "g", dict(state_v_first=True)),
    "chunk_delta_rule": (ops.chunk_delta_rule, "delta", "beta", {}),
    "fused_recurrent_delta_rule": (ops.fused_recurrent_delta_rule, "delta", "beta", dict(scale=1.3)),
    "chunk_gated_delta_rule": (ops.chunk_gated_delta_rule, "gated_delta", "g beta", {}),
    "chunk_gated_delta_rule[fla gates]": (ops.chunk_gated_delta_rule, "gated_delta", "g beta",
                                          dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                               use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)),
    "fused_recurrent_gated_delta_rule": (ops.fused_recurrent_gated_delta_rule, "gated_delta", "g beta", {}),
    "chunk_gated_oja_rule": (ops.chunk_gated_oja_rule, "oja", "gv beta", {}),
    "fused_recurrent_gated_oja_rule": (ops.fused_recurrent_gated_oja_rule, "oja", "gv beta",
                                       dict(use_q_l2norm=True)),
}
GROUPED = ("delta", "gated_delta", "oja")  # the ops with grouped value heads (fla's GVA)
A_LOG = np.log(np.array([0.5, 1.0, 2.0, 4.0], np.float32))
DT_BIAS = np.array([0.3, -0.2, 0.0, 0.5], np.float32)


def heads(rule):
  return HV if rule in GROUPED else H


def gate_args(takes, g, beta):
  """The op's keyword gates: ``g`` / ``gv`` and ``beta``."""
  out = {}
  if "gv" in takes:
    out["gv"] = g
  elif "g" in takes.split():
    out["g"] = g
  if "beta" in takes:
    out["beta"] = beta
  return out


def effective(opts, q, k, g, beta):
  """What fla's options make of the raw inputs, written out for the reference: L2 norms, the GDN gate, β."""
  l2 = lambda x: x / jnp.sqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-6)
  if opts.get("use_qk_l2norm_in_kernel") or opts.get("use_q_l2norm"):
    q = l2(q)
  if opts.get("use_qk_l2norm_in_kernel"):
    k = l2(k)
  if opts.get("use_gate_in_kernel"):
    a_log, dt_bias = (jnp.asarray(x, g.dtype)[None, None] for x in (A_LOG, DT_BIAS))
    g = -jnp.exp(a_log) * jnp.log1p(jnp.exp(g + dt_bias))
  if opts.get("use_beta_sigmoid_in_kernel"):
    beta = (2.0 if opts.get("allow_neg_eigval") else 1.0) / (1.0 + jnp.exp(-beta))
  return q, k, g, beta


def key_sum(h0):
  """The normalised linear attention's initial key sum ``z [N, 1, H, K]``, positive, made from ``h0``."""
  return jnp.abs(h0[..., 0])[:, None]


def op_call(case, q, k, v, g, beta, h0, **extra):
  fn, rule, takes, opts = CASES[case]
  opts = dict(opts)
  if opts.get("state_v_first"):
    h0 = jnp.swapaxes(h0, -1, -2)
  if opts.get("normalize"):
    h0 = (h0, key_sum(h0))
  if opts.get("use_gate_in_kernel"):
    opts.update(A_log=A_LOG, dt_bias=DT_BIAS)
  if "chunk_size" in fn.__code__.co_varnames:
    opts["chunk_size"] = CHUNK
  o, h = fn(q, k, v, **gate_args(takes, g, beta), initial_state=h0, output_final_state=True, **opts, **extra)
  return o, (jnp.swapaxes(h, -1, -2) if opts.get("state_v_first") else h)


@functools.cache
def compiled(case):
  """``(o, h_T, pullback of (cot_o, cot_h) to q, k, v, g, beta, h0)`` of the op, one jitted program."""
  def run(cot, *xs):
    out, pullback = jax.vjp(lambda *xs: op_call(case, *xs), *xs)
    return out, pullback(cot)
  return jax.jit(run)


def cotangent(o_shape, h_shape):
  r = np.random.default_rng(5)
  return jnp.asarray(r.normal(size=o_shape), jnp.float32), jnp.asarray(r.normal(size=h_shape), jnp.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_a_float64_loop_of_fla_equations(case):
  _, rule, takes, opts = CASES[case]
  hv = heads(rule)
  q, k, v, g, beta, h0 = inputs(hv)
  if opts.get("use_gate_in_kernel"):
    g = np.asarray(np.random.default_rng(9).normal(size=g.shape), np.float32)  # a raw gate
  if opts.get("use_beta_sigmoid_in_kernel"):
    beta = np.asarray(np.random.default_rng(10).normal(size=beta.shape), np.float32)  # logits
  normalize = opts.get("normalize", False)
  if normalize:  # positive features: the normaliser q · Σ k stays away from 0
    q, k = np.abs(q), np.abs(k)
  cot = cotangent((B, T, hv, V), (B, hv, K, V))
  if normalize:
    cot = (cot[0], (cot[1], jnp.ones((B, 1, H, K), jnp.float32)))
  (o, h), grads = compiled(case)(cot, q, k, v, g, beta, h0)
  assert o.shape == (B, T, hv, V) and o.dtype == jnp.float32 and jax.tree.leaves(h)[0].shape == (B, hv, K, V)

  uses = {"g": "g" in takes.split() or "gv" in takes, "beta": "beta" in takes}
  scale = opts.get("scale", K ** -0.5)
  with jax.enable_x64(True):
    def ref(q, k, v, g, beta, h0):
      qe, ke, ge, be = effective(opts, q, k, g, beta)
      o, h = reference(rule, qe, ke, v, ge if uses["g"] else None, be if uses["beta"] else None, h0, scale)
      if not normalize:
        return o, h
      z = key_sum(h0) + jnp.cumsum(ke, axis=1)  # [B, T, H, K]: the running key sum from z_0
      return o / (jnp.sum(scale * qe * z, -1, keepdims=True) + 1e-10), (h, z[:, -1:])
    xs = tuple(jnp.asarray(x, jnp.float64) for x in (q, k, v, g, beta, h0))
    (ro, rh), pullback = jax.vjp(ref, *xs)
    want = pullback(jax.tree.map(lambda c: jnp.asarray(c, jnp.float64), cot))
  # float32 through 19 tokens of unit-norm writes: values of order 1, rounding ~1e-6 per step
  np.testing.assert_allclose(o, ro, rtol=1e-4, atol=2e-5, err_msg=f"{case} o")
  for a, b in zip(jax.tree.leaves(h), jax.tree.leaves(rh), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"{case} final state")
  for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), grads, want, strict=True):
    if name in uses and not uses[name]:
      assert not np.any(a), f"{case}: d/d{name} of an unused input"
      continue
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=5e-5, err_msg=f"{case} d/d{name}")


# ----------------------------------------------------------------------------------------
# varlen: cu_seqlens (fla's form) and segment_ids, against each sequence alone

CU = np.array([0, 4, 4, 11, 19], np.int32)  # four sequences, one of them empty; the last two span chunks
VARLEN = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_linear_attn[normalize]",
          "chunk_gated_oja_rule")


def varlen_inputs(case):
  """One packed row ``[1, T, ...]`` and the four sequences' initial states ``[N, HV, K, V]``."""
  _, rule, _, opts = CASES[case]
  q, k, v, g, beta, h0 = inputs(heads(rule))
  if opts.get("normalize"):
    q, k = np.abs(q), np.abs(k)
  h0 = np.concatenate([h0, h0[::-1]])  # N = 4
  return tuple(x[:1] for x in (q, k, v, g, beta)) + (h0,)


def normalized_state(case, h0):
  """The normalised linear attention's state is the pair (h, z), z [N, 1, H, K] the key sum."""
  return (h0, key_sum(h0)) if CASES[case][3].get("normalize") else h0


def alone(case, q, k, v, g, beta, h0):
  """Each sequence of ``CU`` through the op by itself (B = 1, no varlen): ``(o [1, T, ...], final states)``."""
  fn, _, takes, opts = CASES[case]
  outs, finals = [], []
  for n in range(len(CU) - 1):
    s = slice(CU[n], CU[n + 1])
    init = jax.tree.map(lambda x: x[n:n + 1], normalized_state(case, h0))
    if CU[n] == CU[n + 1]:
      finals.append(init)
      continue
    o, h = fn(q[:, s], k[:, s], v[:, s], **gate_args(takes, g[:, s], beta[:, s]), initial_state=init,
              output_final_state=True, **opts)
    outs.append(o)
    finals.append(h)
  return jnp.concatenate(outs, axis=1), jax.tree.map(lambda *xs: jnp.concatenate(xs), *finals)


def packed(case, q, k, v, g, beta, h0, cu=CU, states=True):
  fn, _, takes, opts = CASES[case]
  kw = dict(initial_state=normalized_state(case, h0), output_final_state=True) if states else {}
  return fn(q, k, v, **gate_args(takes, g, beta), cu_seqlens=cu, **kw, **opts)


@pytest.mark.parametrize("case", VARLEN)
def test_cu_seqlens_equals_each_sequence_alone(case):
  # with states (the sequences laid out as rows), without (one packed row with a segment per sequence), and
  # with cu_seqlens traced under jit (rows of length T): outputs and every sequence's final state
  xs = varlen_inputs(case)
  want_o, want_h = alone(case, *xs)
  o, h = packed(case, *xs)
  o_nostate, none = packed(case, *xs, states=False)
  o_jit, h_jit = jax.jit(functools.partial(packed, case))(*xs, cu=jnp.asarray(CU))
  for got_o, got_h, how in ((o, h, "concrete"), (o_jit, h_jit, "jit")):
    np.testing.assert_allclose(got_o, want_o, rtol=1e-4, atol=2e-5, err_msg=f"{case} {how} o")
    for a, b in zip(jax.tree.leaves(got_h), jax.tree.leaves(want_h), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"{case} {how} final states")
  want_zero, want_zero_h = alone(case, *xs[:5], 0 * xs[5])  # from empty states: the packed row without states
  np.testing.assert_allclose(o_nostate, want_zero, rtol=1e-4, atol=2e-5, err_msg=f"{case} without states")
  if CASES[case][3].get("normalize"):  # fla's (None, z): the key sum comes back without the state
    assert none[0] is None
    np.testing.assert_allclose(none[1], want_zero_h[1], rtol=1e-4, atol=2e-5, err_msg=f"{case} z")
  else:
    assert none is None


def test_cu_seqlens_gradients_equal_each_sequence_alone():
  # chunk_gated_delta_rule: gradients w.r.t. every input and the four initial states, the packed call against
  # the separate calls, each one jitted program
  case = "chunk_gated_delta_rule"
  xs = varlen_inputs(case)
  cot = cotangent((1, T, HV, V), (4, HV, K, V))
  loss = lambda f: lambda *xs: sum(jnp.vdot(c, x) for c, x in zip(cot, f(case, *xs), strict=True))
  got = jax.jit(jax.grad(loss(packed), argnums=tuple(range(6))))(*xs)
  want = jax.jit(jax.grad(loss(alone), argnums=tuple(range(6))))(*xs)
  for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), got, want, strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg=f"d/d{name}")


def test_segment_ids_equal_each_row_segment_alone():
  # segment_ids [B = 2, T]: row 0 packs CU's sequences (ids 1, 3, 4), row 1 is one sequence after padding; the
  # initial state is each row's (its first segment's), the final state each row's last segment's
  case = "chunk_gated_delta_rule"
  q, k, v, g, beta, h0 = inputs(HV)
  ids = np.stack([np.repeat(np.arange(1, 5), np.diff(CU)), np.r_[np.zeros(3), np.full(T - 3,
                                                                                      7)]]).astype(np.int32)
  fn, _, takes, opts = CASES[case]
  o, h = fn(q, k, v, **gate_args(takes, g, beta), initial_state=h0, output_final_state=True, segment_ids=ids)
  starts = [h0[:1], 0 * h0[:1], 0 * h0[:1], 0 * h0[:1]]
  want_o0, want_h0 = alone(case, q[:1], k[:1], v[:1], g[:1], beta[:1], np.concatenate(starts))
  np.testing.assert_allclose(o[:1], want_o0, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(h[0], want_h0[-1], rtol=1e-4, atol=2e-5)
  want_o1, want_h1 = fn(q[1:, 3:], k[1:, 3:], v[1:, 3:], **gate_args(takes, g[1:, 3:], beta[1:, 3:]),
                        initial_state=h0[1:], output_final_state=True)
  np.testing.assert_allclose(o[1:, 3:], want_o1, rtol=1e-4, atol=2e-5)
  assert not np.any(o[1, :3]), "padding reads 0"
  np.testing.assert_allclose(h[1:], want_h1, rtol=1e-4, atol=2e-5)


def test_state_v_first_is_the_transposed_state_and_a_transposed_state_is_caught():
  # K != V: a state in the other layout has the wrong shape and is refused; state_v_first takes it. (K == V
  # cannot be told apart from its transpose: docs/porting_from_fla.md says which layout each API uses.)
  q, k, v, g, beta, h0 = inputs(HV)
  kw = dict(g=g, beta=beta, output_final_state=True)
  o, h = ops.fused_recurrent_gated_delta_rule(q, k, v, initial_state=h0, **kw)
  o2, h2 = ops.fused_recurrent_gated_delta_rule(q, k, v, initial_state=np.swapaxes(h0, -1, -2),
                                                state_v_first=True,
                                                **kw)
  np.testing.assert_array_equal(o, o2)
  np.testing.assert_array_equal(h, np.swapaxes(h2, -1, -2))
  with pytest.raises(ValueError, match=r"`initial_state` must have shape \[N, HV, K, V\] = \(2, 4, 6, 5\)"):
    ops.fused_recurrent_gated_delta_rule(q, k, v, initial_state=np.swapaxes(h0, -1, -2), **kw)


# ----------------------------------------------------------------------------------------
# bad input


def _args():
  q, k, v, g, beta, h0 = inputs(HV)
  return dict(q=q, k=k, v=v, g=g, beta=beta)


@pytest.mark.parametrize("change,match", [
    (dict(v=np.zeros((B, T, 3, V), np.float32)),
     r"`v` has 3 heads, which the 2 heads of `q` and `k` must divide"),
    (dict(g=np.zeros((B, T, H), np.float32)), r"`g` must have shape \[B, T, HV\] = \(2, 19, 4\)"),
    (dict(beta=None), r"`beta` \[B, T, HV\] is required"),
    (dict(q=np.zeros((B, T, H, K), np.int32)), r"`q` must be floating"),
    (dict(cu_seqlens=CU), r"with `cu_seqlens` the batch size must be 1"),
    (dict(segment_ids=np.ones((B, T), np.float32)), r"`segment_ids` must hold integers"),
    (dict(segment_ids=np.ones((B, T), np.int32), cu_seqlens=CU), r"pass `cu_seqlens` .* or `segment_ids`"),
    (dict(allow_neg_eigval=True), r"allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
    (dict(use_gate_in_kernel=True), r"use_gate_in_kernel=True needs `A_log`"),
    (dict(A_log=A_LOG), r"`A_log` / `dt_bias` are only used with use_gate_in_kernel=True"),
    (dict(use_gate_in_kernel=True, A_log=A_LOG[:2]), r"`A_log` must have shape \[HV\] = \(4,\)"),
    (dict(initial_state=np.zeros((B, HV, V, K), np.float32)), r"`initial_state` must have shape"),
])
def test_bad_input_raises_value_error_naming_the_argument(change, match):
  with pytest.raises(ValueError, match=match):
    ops.chunk_gated_delta_rule(**{**_args(), **change})


@pytest.mark.parametrize("call,match", [
    (lambda a: ops.chunk_gated_delta_rule(**{name: x[:1] for name, x in a.items()},
                                          cu_seqlens=np.array([0, 5, 18])),
     r"`cu_seqlens` must rise from 0 to T = 19"),
    (lambda a: ops.fused_recurrent_gated_delta_rule(**a, gk=a["v"]), r"`gk` / `gv` are not supported"),
    (lambda a: ops.chunk_gated_oja_rule(a["q"], a["k"], a["v"], a["g"][..., :2], a["beta"]),
     r"`gv` must have shape \[B, T, HV\] = \(2, 19, 4\) \(a decay per head\) or \[B, T, HV, V\]"),
    (lambda a: ops.chunk_simple_gla(a["q"], a["k"], a["v"][:, :, :H], g=a["g"][..., :H], g_gamma=A_LOG[:H]),
     r"pass `g` \[B, T, H\] or `g_gamma` \[H\], not both"),
    (lambda a: ops.chunk_linear_attn(a["q"], a["k"], a["v"]), r"the same number of heads"),
    (lambda a: ops.fused_recurrent_linear_attn(a["q"], a["k"], a["v"][:, :, :H], reverse=True),
     r"reverse=True is not supported"),
])
def test_other_ops_refuse_what_they_do_not_support(call, match):
  with pytest.raises(ValueError, match=match):
    call(_args())
