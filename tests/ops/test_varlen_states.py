"""``jaxmem.ops`` with ``cu_seqlens`` and a state per sequence (``initial_state`` in, final states out), every
op and form, against each sequence run alone in a float64 loop of fla's equations.

One packed row of ``T = 51`` tokens in ``CU``'s four sequences (lengths 1, 0, 21, 29: a one-token and an empty
sequence, two that span several chunks and end in a padded one: the per-sequence layout runs chunks of 4 from
``chunk_size = 8``, and of 3 in the ``[chunk 64]`` case); ``K = 6``, ``V = 5``, grouped value heads
``H = 2 → HV = 4`` where fla has them. Each case is one compiled program with ``cu_seqlens`` traced (``jit``):
outputs, the four final states, and the gradients of a random cotangent w.r.t. ``q, k, v``, the gates and the
initial states, against the float64 reference of ``test_ops.py`` (fla's recurrences token by token, fla's
options written out) run on each sequence from its own initial state. Also: a list ``cu_seqlens``, new lengths
without a new compilation, and the refusals naming ``cu_seqlens``.
"""

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmem.ops as ops
from tests.ops.test_ops import (
  A_LOG,
  CASES,
  DT_BIAS,
  K,
  V,
  effective,
  gate_args,
  heads,
  key_sum,
  reference,
  unit,
)

CU = np.array([0, 1, 1, 22, 51], np.int32)
N, T, H = len(CU) - 1, int(CU[-1]), 2
CHUNK = 8
# every case of test_ops.py, and one at the default chunk_size (64: the layout's chunk is then 3)
VARIANTS = {case: (case, CHUNK) for case in CASES}
VARIANTS["chunk_gated_delta_rule[chunk 64]"] = ("chunk_gated_delta_rule", None)


@functools.cache
def inputs(case):
  """float32 ``(q, k, v, g, beta [1, T, ...], h0 [N, HV, K, V])`` for ``case``: unit keys and values,
  β ∈ (0.1, 0.9), γ ∈ (0.5, 1); a raw gate / β logits where the case's options take them; positive q, k when
  normalised."""
  _, rule, _, opts = CASES[case]
  hv = heads(rule)
  r = np.random.default_rng(11)
  q = r.normal(size=(1, T, H, K))
  k = unit(r.normal(size=(1, T, H, K)))
  v = unit(r.normal(size=(1, T, hv, V)))
  g = np.log(r.uniform(0.5, 1.0, (1, T, hv)))
  beta = r.uniform(0.1, 0.9, (1, T, hv))
  h0 = 0.5 * r.normal(size=(N, hv, K, V))
  if opts.get("use_gate_in_kernel"):
    g = r.normal(size=g.shape)
  if opts.get("use_beta_sigmoid_in_kernel"):
    beta = r.normal(size=beta.shape)
  if opts.get("normalize"):  # positive features: the normaliser q · Σ k stays away from 0
    q, k = np.abs(q), np.abs(k)
  return tuple(np.asarray(x, np.float32) for x in (q, k, v, g, beta, h0))


def call(variant, q, k, v, g, beta, h0, cu):
  """The op of ``variant`` with ``cu_seqlens=cu`` and ``h0``; returns ``(o, finals)`` in fla's layouts (the
  normalised linear attention's finals the pair ``(h, z)``)."""
  case, chunk = VARIANTS[variant]
  fn, _, takes, opts = CASES[case]
  opts = dict(opts)
  if opts.get("state_v_first"):
    h0 = jnp.swapaxes(h0, -1, -2)
  if opts.get("normalize"):
    h0 = (h0, key_sum(h0))
  if opts.get("use_gate_in_kernel"):
    opts.update(A_log=A_LOG, dt_bias=DT_BIAS)
  if chunk is not None and "chunk_size" in fn.__code__.co_varnames:
    opts["chunk_size"] = chunk
  o, h = fn(q, k, v, **gate_args(takes, g, beta), initial_state=h0, output_final_state=True, cu_seqlens=cu,
            **opts)
  return o, (jnp.swapaxes(h, -1, -2) if opts.get("state_v_first") else h)


def alone(case, q, k, v, g, beta, h0):
  """The float64 reference on each sequence of ``CU`` from its own initial state: ``(o, finals)``."""
  _, rule, takes, opts = CASES[case]
  uses_g, uses_beta = "g" in takes.split() or "gv" in takes, "beta" in takes
  scale = opts.get("scale", K ** -0.5)
  qe, ke, ge, be = effective(opts, q, k, g, beta)
  z0 = key_sum(h0)
  outs, finals = [], []
  for n in range(N):
    s = slice(CU[n], CU[n + 1])
    if CU[n] == CU[n + 1]:
      finals.append((h0[n], z0[n]) if opts.get("normalize") else h0[n])
      continue
    gates = (ge[:, s] if uses_g else None, be[:, s] if uses_beta else None)
    o, h = reference(rule, qe[:, s], ke[:, s], v[:, s], *gates, h0[n:n + 1], scale)
    if opts.get("normalize"):
      z = z0[n:n + 1] + jnp.cumsum(ke[:, s], axis=1)  # the running key sum from z_0
      o = o / (jnp.sum(scale * qe[:, s] * z, -1, keepdims=True) + 1e-10)
      finals.append((h[0], z[0, -1:]))
    else:
      finals.append(h[0])
    outs.append(o)
  return jnp.concatenate(outs, axis=1), jax.tree.map(lambda *xs: jnp.stack(xs), *finals)


def cotangent(variant):
  case = VARIANTS[variant][0]
  hv = heads(CASES[case][1])
  r = np.random.default_rng(12)
  cot = (jnp.asarray(r.normal(size=(1, T, hv, V)), jnp.float32),
         jnp.asarray(r.normal(size=(N, hv, K, V)), jnp.float32))
  if CASES[case][3].get("normalize"):
    cot = (cot[0], (cot[1], jnp.asarray(r.normal(size=(N, 1, H, K)), jnp.float32)))
  return cot


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_state_per_sequence_equals_each_sequence_alone(variant):
  case = VARIANTS[variant][0]
  takes = CASES[case][2]
  xs, cot = inputs(case), cotangent(variant)

  @jax.jit
  def packed(cot, cu, *xs):
    out, pullback = jax.vjp(lambda *xs: call(variant, *xs, cu=cu), *xs)
    return out, pullback(cot)

  (o, h), grads = packed(cot, jnp.asarray(CU), *xs)
  with jax.enable_x64(True):
    x64 = tuple(jnp.asarray(x, jnp.float64) for x in xs)
    (ro, rh), pullback = jax.vjp(functools.partial(alone, case), *x64)
    want = pullback(jax.tree.map(lambda c: jnp.asarray(c, jnp.float64), cot))
  # float32 through at most 29 tokens of unit-norm writes: values of order 1, rounding ~1e-6 per token
  np.testing.assert_allclose(o, ro, rtol=1e-4, atol=2e-5, err_msg=f"{variant} o")
  for a, b in zip(jax.tree.leaves(h), jax.tree.leaves(rh), strict=True):
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"{variant} final states")
  uses = {"g": "g" in takes.split() or "gv" in takes, "beta": "beta" in takes}
  for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), grads, want, strict=True):
    if name in uses and not uses[name]:
      assert not np.any(a), f"{variant}: d/d{name} of an unused input"
      continue
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=5e-5, err_msg=f"{variant} d/d{name}")


def test_a_list_is_read_as_an_int_array_and_new_lengths_do_not_compile_again(caplog):
  # eager calls: cu_seqlens as a Python list gives the array's result; a second set of lengths with the same
  # number of sequences (the longest one longer) runs the compiled program again
  xs = inputs("chunk_gated_delta_rule")
  o, h = call("chunk_gated_delta_rule", *xs, cu=jnp.asarray(CU))
  o_list, h_list = call("chunk_gated_delta_rule", *xs, cu=[int(c) for c in CU])
  np.testing.assert_array_equal(o, o_list)
  np.testing.assert_array_equal(h, h_list)
  with jax.log_compiles(), caplog.at_level(logging.WARNING):
    call("chunk_gated_delta_rule", *xs, cu=[0, 2, 2, 3, T])
  assert not [r for r in caplog.records if "Compiling" in r.getMessage() and "_program" in r.getMessage()]


@pytest.mark.parametrize("cu,match", [
    ([0, 5, 18], r"`cu_seqlens` must rise from 0 to T = 51"),
    ([0.0, 51.0], r"`cu_seqlens` must hold integers"),
    ([], r"`cu_seqlens` must have shape \[N \+ 1\] with N >= 1 .*got shape \(0,\)"),
    ([0, [1, 2], 51], r"`cu_seqlens` must be a flat list of integers"),
    (np.array([0, 51], np.uint8) > 0, r"`cu_seqlens` must hold integers"),
])
def test_bad_cu_seqlens_raise_value_error_naming_it(cu, match):
  q, k, v, g, beta, h0 = inputs("chunk_gated_delta_rule")
  with pytest.raises(ValueError, match=match):
    ops.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0[:1], cu_seqlens=cu)
