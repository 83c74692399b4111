"""associative_memory (hebb / delta / oja / decay / gated_delta / gated_oja) vs an independent numpy loop.

Every execution form (recurrent, parallel, chunked, auto) is checked against a float64
per-token loop written from the update equations, on values, final states and gradients,
with odd lengths (T not a multiple of the chunk) and widths that are not powers of two;
gradients also against float64 finite differences.

Two canonical shapes serve the module: ``SHAPE`` (B = 2, T = 37 with chunk 16: three chunks,
the last padded; H = 3, D_k = 12 below the chunk, D_v = 5; its second row is the batch of one)
and ``WIDE`` (B = 1, T = 63, H = 2, D_k = 60 above the chunk, D_v = 7). The numpy references
are computed once per (rule, shape), and each (rule, mode) compiles one program that returns
outputs, final states and the gradients of a random cotangent (:func:`results`), shared by
every test that needs them.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.arrays import device_array
from jaxmem.kernels import assoc
from jaxmem.kernels.assoc import associative_memory, init, step
from tests.kernels.packed import runs

RULES = ["hebb", "delta", "oja", "decay", "gated_delta", "gated_oja"]
DECAYS = ("decay", "gated_delta", "gated_oja")
NAMES = ("q", "k", "v", "beta", "decay", "initial_state")


def modes_for(rule):
  return ["recurrent", "chunked", "auto"] + ([] if rule in ("oja", "gated_oja") else ["parallel"])


def numpy_assoc(q, k, v, beta, decay, S0, rule):
  """Plain per-(batch, head, token) loop in float64, straight from the equations."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  B, T, H, Dk = q.shape
  Dv = v.shape[-1]
  beta = np.ones((B, T, H)) if beta is None else np.asarray(beta, np.float64)
  decay = np.ones((B, T, H)) if decay is None else np.asarray(decay, np.float64)
  out, final = np.zeros((B, T, H, Dv)), np.zeros((B, H, Dv, Dk))
  for b in range(B):
    for h in range(H):
      S = np.zeros((Dv, Dk)) if S0 is None else np.asarray(S0[b, h], np.float64).copy()
      for t in range(T):
        kt, vt, bt, gt = k[b, t, h], v[b, t, h], beta[b, t, h], decay[b, t, h]
        if rule == "hebb":
          S = S + bt * np.outer(vt, kt)
        elif rule == "delta":
          S = S + bt * np.outer(vt - S @ kt, kt)
        elif rule == "oja":
          S = S + bt * (np.outer(vt, kt) - np.outer(vt, vt) @ S)
        elif rule == "decay":
          S = gt * S + bt * np.outer(vt, kt)
        elif rule == "gated_delta":
          S = gt * S + bt * np.outer(vt - gt * (S @ kt), kt)
        elif rule == "gated_oja":
          S = gt * S + bt * (np.outer(vt, kt) - gt * np.outer(vt, vt) @ S)
        out[b, t, h] = S @ q[b, t, h]  # read after write
      final[b, h] = S
  return out, final


def unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def make_inputs(B, T, H, Dk, Dv, seed=0, dtype=np.float32, with_state=True):
  """Stable regime: unit keys and values, β in (0.1, 1.5), γ in (0.6, 1)."""
  r = np.random.default_rng(seed)
  q = r.normal(size=(B, T, H, Dk))
  k = unit(r.normal(size=(B, T, H, Dk)))
  v = unit(r.normal(size=(B, T, H, Dv)))
  beta = r.uniform(0.1, 1.5, size=(B, T, H))
  decay = r.uniform(0.6, 1.0, size=(B, T, H))
  S0 = 0.3 * r.normal(size=(B, H, Dv, Dk)) if with_state else None
  cast = lambda x: None if x is None else device_array(x, dtype)
  return tuple(cast(x) for x in (q, k, v, beta, decay, S0))


def call(rule, mode, q, k, v, beta, decay, S0, chunk=16, **kw):
  return associative_memory(q, k, v, beta, rule=rule, mode=mode, chunk_size=chunk,
                            decay=decay if rule in DECAYS else None, initial_state=S0,
                            return_state=True, **kw)


# ----------------------------------------------------------------------------------------
# the canonical shapes, their references and their compiled programs

CHUNK = 16
SHAPE = (2, 37, 3, 12, 5)  # B, T, H, D_k, D_v
WIDE = (1, 63, 2, 60, 7)
SEEDS = {SHAPE: 1, WIDE: 21}


def rows(xs, start):
  """The batch rows ``start:`` of each array (a batch of one from a batch of two), as numpy arrays."""
  return tuple(None if x is None else np.asarray(x)[start:] for x in xs)


@functools.cache
def inputs(shape=SHAPE):
  return make_inputs(*shape, seed=SEEDS[shape])


@functools.cache
def cotangents(shape=SHAPE):
  """Random cotangents of ``(o [B, T, H, D_v], S_T [B, H, D_v, D_k])``."""
  B, T, H, Dk, Dv = shape
  r = np.random.default_rng(SEEDS[shape] + 100)
  return (jnp.asarray(r.normal(size=(B, T, H, Dv)), jnp.float32),
          jnp.asarray(r.normal(size=(B, H, Dv, Dk)), jnp.float32))


@functools.cache
def reference(rule, shape=SHAPE):
  """The float64 numpy loop on ``inputs(shape)``: ``(o, S_T)``."""
  q, k, v, beta, decay, S0 = inputs(shape)
  return numpy_assoc(q, k, v, beta, decay if rule in DECAYS else None, S0, rule)


@functools.cache
def value_and_grads(rule, mode, chunk=CHUNK):
  """One jitted program: ``(o, S_T, pullback of (cot_o, cot_S) to q, k, v, beta, decay, S_0)``."""
  def run(cot_o, cot_S, *xs):
    (o, S), pullback = jax.vjp(lambda *xs: call(rule, mode, *xs, chunk=chunk), *xs)
    return o, S, pullback((cot_o, cot_S))
  return jax.jit(run)


@functools.cache
def results(rule, mode, shape=SHAPE, start=0):
  """``value_and_grads`` on the canonical inputs (batch rows ``start:``), as numpy arrays."""
  xs, cot = rows(inputs(shape), start), rows(cotangents(shape), start)
  return jax.device_get(value_and_grads(rule, mode)(*cot, *xs))


def assert_grads_close(got, want, rule, msg, rtol=2e-4, atol=2e-5):
  for name, a, b in zip(NAMES, got, want, strict=True):
    if name == "decay" and rule not in DECAYS:
      assert not np.any(a) and not np.any(b), f"{msg}: d/ddecay of a rule without decay"
      continue
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{msg} d/d{name}")


@functools.cache
def directional_derivatives(f):
  """check_grads' reverse-mode test as one jitted program: for a tangent t and a cotangent c,
  ``(<c, (f(x + εt) − f(x − εt)) / 2ε>, <vjp_x(c), t>)``; the three points run as one batch."""
  def run(args, tangent, cotangent, eps):
    def at(s):
      out, pullback = jax.vjp(f, *(a + s * eps * t for a, t in zip(args, tangent, strict=True)))
      return out, pullback(cotangent)
    outs, grads = jax.vmap(at)(jnp.asarray([0.0, 1.0, -1.0], eps.dtype))
    inner = lambda xs, ys: sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(xs), jax.tree.leaves(ys),
                                                              strict=True))
    diff = jax.tree.map(lambda o: (o[1] - o[2]) / (2 * eps), outs)
    return inner(cotangent, diff), inner(jax.tree.map(lambda g: g[0], grads), tangent)
  return jax.jit(run)


def check_vjp_float64(f, args, eps, seed=0):
  """``check_grads(f, args, order=1, modes=("rev",), eps=eps)`` on float64 inputs as one compiled
  program: one random direction, check_grads' float64 tolerances (atol = rtol = 1e-5)."""
  r = np.random.default_rng(seed)
  tangent = tuple(jnp.asarray(r.normal(size=a.shape), jnp.float64) for a in args)
  cotangent = jax.tree.map(lambda o: jnp.asarray(r.normal(size=o.shape), jnp.float64),
                           jax.eval_shape(f, *args))
  numeric, analytic = directional_derivatives(f)(tuple(args), tangent, cotangent, jnp.float64(eps))
  np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-5)


@functools.cache
def float64_kernel(rule, mode, chunk=3):
  """``(q, k, v, beta, S_0[, decay]) -> (o, S_T)`` for the finite-difference checks."""
  def f(q, k, v, beta, S0, decay=None):
    return associative_memory(q, k, v, beta, rule=rule, mode=mode, chunk_size=chunk, decay=decay,
                              initial_state=S0, return_state=True)
  return f


# ----------------------------------------------------------------------------------------
# values


@pytest.mark.parametrize("rule", RULES)
def test_every_mode_matches_numpy_loop_with_initial_state(rule):
  # SHAPE: T = 37 with chunk 16 (3 chunks, the last padded), D_k = 12, D_v = 5. auto is
  # called forward only (the recurrent form on CPU); its differentiated program, the chunked
  # form's JVP: test_auto_runs_the_fast_forward_and_differentiates_the_chunked_form and
  # test_assoc_numerics.py::test_decay_and_beta_grid_finite_and_exact_under_jit
  ref_o, ref_S = reference(rule)
  outs = {mode: results(rule, mode)[:2] for mode in modes_for(rule) if mode != "auto"}
  outs["auto"] = call(rule, "auto", *inputs())
  for mode, (o, S) in outs.items():
    assert o.shape == (2, 37, 3, 5) and o.dtype == jnp.float32, mode
    assert S.shape == (2, 3, 5, 12) and S.dtype == jnp.float32, mode
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5, err_msg=f"{rule} {mode} o")
    np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5, err_msg=f"{rule} {mode} S")


@pytest.mark.parametrize("rule", RULES)
def test_chunked_matches_numpy_loop_without_state_or_beta(rule):
  # WIDE: B = 1, D_k = 60, T = 63 with chunk 16; beta=None means 1 (unit keys: β‖k‖² = 1 is
  # stable), initial_state=None means zeros
  q, k, v, _, decay, _ = inputs(WIDE)
  ref_o, ref_S = numpy_assoc(q, k, v, None, decay if rule in DECAYS else None, None, rule)
  o, S = call(rule, "chunked", q, k, v, None, decay, None)
  np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5)


_chunked = jax.jit(assoc.chunked_scan, static_argnames=("rule", "chunk_size", "group"))


def chunked_row_1(rule, chunk, group):
  """``assoc.chunked_scan`` on SHAPE's second row (B = 1, T = 37, with its initial state)."""
  q, k, v, beta, decay, S0 = rows(inputs(), 1)
  lg = np.log(decay) if rule in DECAYS else None
  return _chunked(q, k, v, beta, lg, S0, rule=rule, chunk_size=chunk, group=group)


@pytest.mark.parametrize("rule,chunk,group", [
    ("delta", 8, 2), ("delta", 1, 4), ("oja", 64, None), ("gated_delta", 64, None),
])
def test_chunked_grouping_and_chunk_sizes(rule, chunk, group):
  # B = 1, T = 37: chunk 8 gives 5 chunks, groups of 2 leave a tail group of one chunk (sliced
  # without a batch axis when B = 1); chunk 1 is the recurrence itself; chunk 64 > T is one
  # chunk of T (its inverse padded from 37 to 40). Every rule at chunk 5 in groups:
  # test_chunked_with_initial_state_equals_recurrent.
  o, S = chunked_row_1(rule, chunk, group)
  ref_o, ref_S = reference(rule)
  np.testing.assert_allclose(o, ref_o[1:], rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, ref_S[1:], rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("rule", ["delta", "gated_delta", "oja", "decay"])
def test_chunked_batch_of_one_equals_its_row_of_a_batch(rule):
  # B = 1 groups the sequence by a reshape alone (no batch axis), B > 1 by a transpose: SHAPE's
  # second row alone gives the numpy loop's values and final states, and the gradients of
  # that row in the batch of two, chunked and recurrent. (B = 1 at D_k = 60:
  # test_chunked_matches_numpy_loop_without_state_or_beta.)
  ref_o, ref_S = reference(rule)
  o1, S1, g1 = results(rule, "chunked", start=1)
  np.testing.assert_allclose(o1, ref_o[1:], rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S1, ref_S[1:], rtol=1e-4, atol=2e-5)
  assert_grads_close(g1, rows(results(rule, "recurrent")[2], 1), rule, "B=1 vs recurrent")
  assert_grads_close(g1, rows(results(rule, "chunked")[2], 1), rule, "B=1 vs B=2")


def test_hebb_parallel_is_causal_linear_attention():
  # o_t = Σ_{s≤t} (q_t·k_s) v_s in float64 against (hebb, parallel) with β = 1 and S_0 = 0
  q, k, v, beta, decay, S0 = inputs()
  o = value_and_grads("hebb", "parallel")(*cotangents(), q, k, v, jnp.ones_like(beta), decay,
                                          jnp.zeros_like(S0))[0]
  q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
  mask = np.tril(np.ones((37, 37), bool))[None, None]
  scores = np.where(mask, np.einsum("bthd,bshd->bhts", q64, k64), 0.0)
  linear_attention = np.einsum("bhts,bshe->bthe", scores, v64)
  np.testing.assert_allclose(o, linear_attention, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule,group", [
    ("hebb", None), ("delta", 3), ("oja", 3), ("decay", 1), ("gated_delta", 3), ("gated_oja", 3),
])
def test_chunked_with_initial_state_equals_recurrent(rule, group):
  # chunk 5: odd, below the inverse's block size 8; T = 37 is 8 chunks, the last padded by 3,
  # in groups of 3 (a tail group of 2), of 1, or all in one; B = 1 (SHAPE's second row)
  o, S = chunked_row_1(rule, 5, group)
  o_r, S_r = rows(results(rule, "recurrent")[:2], 1)
  ref_o, ref_S = reference(rule)
  np.testing.assert_allclose(o, o_r, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, S_r, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(o, ref_o[1:], rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, ref_S[1:], rtol=1e-4, atol=2e-5)


def test_splitting_a_sequence_carries_the_state():
  # gated_delta, chunk 16: tokens 0..20 (two chunks, the second padded by 11 tokens that must
  # leave the carried state as it is), then 21..36 from that state, equal the whole sequence
  q, k, v, beta, decay, S0 = (np.asarray(x) for x in inputs())
  o, S = results("gated_delta", "chunked")[:2]
  o1, S1 = call("gated_delta", "chunked", *(x[:, :21] for x in (q, k, v, beta, decay)), S0)
  o2, S2 = call("gated_delta", "chunked", *(x[:, 21:] for x in (q, k, v, beta, decay)), S1)
  np.testing.assert_allclose(np.concatenate([o1, o2], axis=1), o, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S2, S, rtol=1e-4, atol=2e-5)


# ----------------------------------------------------------------------------------------
# packed sequences (segment_ids) and grouped value heads

# SHAPE's rows as packed documents: row 0 is three segments (the second interrupted by padding, which it
# continues across) and trailing padding; row 1 starts with padding, then two segments
SEGMENTS = np.array([[1] * 5 + [2] * 14 + [0] * 2 + [2] * 3 + [3] * 9 + [0] * 4,
                     [0] * 2 + [4] * 17 + [1] * 18], np.int32)


def per_segment(run_one, q, k, v, beta, decay, S0):
  """``(o, S_T)`` of a packed batch from separate runs of ``run_one(q, k, v, beta, decay, S0) -> (o, S)`` on
  each segment (``[1, T_seg, ...]`` slices): a row's first segment from its initial state, later ones from
  zeros, padding 0, the final state the row's last segment's."""
  outs, finals = [], []
  for b, ids in enumerate(SEGMENTS):
    o_b, S = [None] * len(ids), S0[b:b + 1]
    for i, r in enumerate(runs(ids)):
      o, S = run_one(*(x[b:b + 1, r] for x in (q, k, v, beta, decay)), S if i == 0 else 0 * S)
      for j, t in enumerate(r):
        o_b[t] = o[0, j]
    zero = jnp.zeros_like(o[0, 0])
    outs.append(jnp.stack([zero if x is None else x for x in o_b]))
    finals.append(S[0])
  return jnp.stack(outs), jnp.stack(finals)


@functools.cache
def segmented(rule, mode):
  """One jitted program: the packed call's ``(o, S_T)`` and its pullback of ``cotangents()``."""
  def run(cot_o, cot_S, *xs):
    (o, S), pullback = jax.vjp(lambda *xs: call(rule, mode, *xs, segment_ids=SEGMENTS), *xs)
    return o, S, pullback((cot_o, cot_S))
  return jax.jit(run)


@functools.cache
def segmented_reference(rule):
  """The same from separate recurrent runs of each segment (no segment_ids), as one jitted program."""
  def run(cot_o, cot_S, *xs):
    one = lambda *a: call(rule, "recurrent", *a)
    (o, S), pullback = jax.vjp(lambda *xs: per_segment(one, *xs), *xs)
    return o, S, pullback((cot_o, cot_S))
  return jax.jit(run)


@pytest.mark.parametrize("rule", RULES)
def test_packed_sequences_equal_each_segment_alone(rule):
  # every form: values and final states against the float64 numpy loop run on each segment alone; gradients
  # (w.r.t. q, k, v, beta, decay, initial_state) against separate recurrent runs of the segments
  q, k, v, beta, decay, S0 = inputs()
  numpy_one = lambda q, k, v, b, d, S: numpy_assoc(q, k, v, b, d if rule in DECAYS else None, S, rule)
  ref_o, ref_S = per_segment(numpy_one,
                             *(np.asarray(x, np.float64) for x in (q, k, v, beta, decay, S0)))
  want = segmented_reference(rule)(*cotangents(), q, k, v, beta, decay, S0)
  np.testing.assert_allclose(want[0], ref_o, rtol=1e-4, atol=2e-5)
  for mode in [m for m in modes_for(rule) if m != "auto"]:
    o, S, grads = segmented(rule, mode)(*cotangents(), q, k, v, beta, decay, S0)
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5, err_msg=f"{rule} {mode} o")
    np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5, err_msg=f"{rule} {mode} S")
    assert not np.any(o[SEGMENTS == 0]), "padding reads 0"
    assert_grads_close(grads, want[2], rule, f"{rule} {mode} packed")


def test_grouped_value_heads_equal_repeated_key_heads():
  # H = 3 value heads served by one key head: equal to repeating q and k three times; gradients of the key
  # head are the sums over its group
  q, k, v, beta, decay, S0 = inputs()
  f = lambda q, k: call("gated_delta", "chunked", q, k, v, beta, decay, S0)
  loss = lambda o_S: sum(jnp.vdot(c, x) for c, x in zip(cotangents(), o_S, strict=True))
  grouped = jax.jit(jax.value_and_grad(lambda q, k: loss(f(q, k)), argnums=(0, 1)))(q[:, :, :1], k[:, :, :1])
  rep = lambda x: jnp.repeat(x[:, :, :1], 3, axis=2)
  full = jax.jit(jax.value_and_grad(lambda q, k: loss(f(rep(q), rep(k))), argnums=(0, 1)))(q, k)
  np.testing.assert_allclose(grouped[0], full[0], rtol=1e-5)
  for a, b in zip(grouped[1], full[1], strict=True):
    np.testing.assert_allclose(a, b[:, :, :1], rtol=1e-4, atol=1e-5)


@functools.partial(jax.jit, static_argnames=("rule",))
def _step_over_sequence(S0, q, k, v, beta, decay, *, rule):
  def body(S, x):
    q_t, k_t, v_t, b_t, g_t = x
    return step(S, q_t, k_t, v_t, b_t, g_t if rule in DECAYS else None, rule=rule)
  S, o = jax.lax.scan(body, S0, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, beta, decay)))
  return jnp.moveaxis(o, 0, 1), S


@pytest.mark.parametrize("rule", RULES)
def test_step_over_a_sequence_equals_the_sequence_form(rule):
  q, k, v, beta, decay, S0 = inputs()
  o, S = _step_over_sequence(S0, q, k, v, beta, decay, rule=rule)
  o_seq, S_seq = results(rule, "chunked")[:2]
  np.testing.assert_allclose(o, o_seq, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, S_seq, rtol=1e-4, atol=2e-5)


_step = jax.jit(step, static_argnames=("rule",))


def test_init_and_step_from_empty_memory():
  S = init(2, 3, 5, 4)
  assert S.shape == (2, 3, 4, 5) and S.dtype == jnp.float32 and not S.any()
  q = k = np.ones((2, 3, 5), np.float32) / np.sqrt(5)
  v = np.ones((2, 3, 4), np.float32)
  S, o = _step(S, q, k, v, rule="delta")  # β = 1, unit key: stores v exactly
  np.testing.assert_allclose(o, v, rtol=1e-6)
  S, o = _step(S, q, k, 2 * v, 0.5, 0.9, rule="gated_delta")
  np.testing.assert_allclose(o, 0.9 * v + 0.5 * (2 * v - 0.9 * v), rtol=1e-6)


def test_normalize_keys_equals_passing_unit_keys():
  q, k, v, beta, _, S0 = inputs()
  a = call("delta", "auto", q, 3.0 * k, v, beta, None, S0, normalize_keys=True)
  b = call("delta", "auto", q, k, v, beta, None, S0)
  for x, y in zip(a, b, strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@jax.jit
def _auto_delta_directional_derivative(q, k, v, beta, S0, cot_o, cot_S, t_q):
  """Forward mode through auto: d/dε of <cot, (o, S_T)> at q + ε t_q."""
  def loss(q):
    o, S = call("delta", "auto", q, k, v, beta, None, S0)
    return jnp.sum(o * cot_o) + jnp.sum(S * cot_S)
  return jax.jvp(loss, (q,), (t_q,))[1]


def test_auto_runs_the_fast_forward_and_differentiates_the_chunked_form():
  fwd = assoc.auto_forward_mode()
  assert fwd == ("recurrent" if jax.default_backend() == "cpu" else "chunked")
  q, k, v, beta, decay, S0 = xs = inputs()
  for a, b in zip(call("delta", "auto", *xs), call("delta", fwd, *xs), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  g_auto = results("delta", "auto")[2]
  assert_grads_close(g_auto, results("delta", "chunked")[2], "delta", "auto vs chunked", rtol=1e-5, atol=1e-6)
  # forward mode goes through the chunked JVP too: <∇_q L, t> = d/dε L(q + ε t)
  t = jnp.asarray(np.random.default_rng(0).normal(size=q.shape), jnp.float32)
  dL = _auto_delta_directional_derivative(q, k, v, beta, S0, *cotangents(), t)
  np.testing.assert_allclose(dL, np.sum(g_auto[0] * np.asarray(t)), rtol=1e-4)


@jax.jit
def _delta_chunked_over_a_leading_axis(q, k, v, beta, S0):
  return jax.vmap(lambda q, k, v: call("delta", "chunked", q, k, v, beta, None, S0)[0])(q, k, v)


def test_vmap_over_an_extra_axis_and_bfloat16():
  q, k, v, beta, decay, S0 = inputs()
  stack = lambda x: jnp.stack([x, 0.5 * x])
  batched = _delta_chunked_over_a_leading_axis(stack(q), stack(k), stack(v), beta, S0)
  program = value_and_grads("delta", "chunked")
  half = program(*cotangents(), 0.5 * q, 0.5 * k, 0.5 * v, beta, decay, S0)[0]
  np.testing.assert_allclose(batched[0], results("delta", "chunked")[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(batched[1], half, rtol=1e-5, atol=1e-6)
  o16 = call("delta", "chunked", *(x.astype(jnp.bfloat16) for x in (q, k, v)), beta, None, None)[0]
  assert o16.dtype == jnp.bfloat16
  o32 = program(*cotangents(), q, k, v, beta, decay, jnp.zeros_like(S0))[0]
  np.testing.assert_allclose(o16.astype(jnp.float32), o32, atol=5e-2)


# ----------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("rule", RULES)
def test_gradients_agree_between_modes(rule):
  # SHAPE; gradients of <cot_o, o> + <cot_S, S_T> w.r.t. q, k, v, beta, decay (for the decay
  # rules) and the initial state; auto's (the chunked form's JVP):
  # test_auto_runs_the_fast_forward_and_differentiates_the_chunked_form
  ref = results(rule, "recurrent")[2]
  for mode in modes_for(rule):
    if mode not in ("recurrent", "auto"):
      assert_grads_close(results(rule, mode)[2], ref, rule, f"{rule} {mode}")


@pytest.mark.parametrize("rule", RULES)
def test_gradients_match_finite_differences_float64(rule):
  # T = 7 with chunk 3 (3 chunks, the last padded), float64, w.r.t. every input
  with jax.enable_x64(True):
    q, k, v, beta, decay, S0 = make_inputs(1, 7, 2, 3, 2, seed=13, dtype=np.float64)
    beta = 0.5 * beta  # keep β‖a‖² < 2 under the finite-difference perturbations
    args = (q, k, v, beta, S0) + ((decay,) if rule in DECAYS else ())
    check_vjp_float64(float64_kernel(rule, "chunked"), args, eps=1e-5)


_unit_lower_inverse = jax.jit(assoc.unit_lower_inverse)


def test_unit_lower_inverse_matches_numpy():
  r = np.random.default_rng(14)
  # 5: one forward-substitution block; 64: three block levels; 37 and 100: padded to 40 = 5·2³
  # and 112 = 7·2⁴ (m·2^L with m ≤ 8), not to a power of two
  for C in (5, 64, 37, 100):
    A = np.tril(r.normal(size=(3, C, C)) * (0.3 if C <= 64 else 0.1), -1).astype(np.float32)  # |T| = O(1)
    T = _unit_lower_inverse(jnp.asarray(A))
    np.testing.assert_allclose(T, np.linalg.inv(np.eye(C) + A.astype(np.float64)), atol=1e-5)


# ----------------------------------------------------------------------------------------
# stability


@pytest.mark.parametrize("rule", RULES)
def test_long_sequence_stays_finite(rule):
  T, d = 16384, 4
  r = np.random.default_rng(15)
  q = jnp.asarray(r.normal(size=(1, T, 1, d)), jnp.float32)
  k = jnp.asarray(unit(r.normal(size=(1, T, 1, d))), jnp.float32)
  v = jnp.asarray(unit(r.normal(size=(1, T, 1, d))), jnp.float32)  # unit: oja's β‖v‖² < 2
  beta = jnp.asarray(r.uniform(0.0, 1.9, size=(1, T, 1)), jnp.float32)
  decay = 0.99 if rule in DECAYS else None
  outs = []
  for mode in ("recurrent", "chunked"):
    o, S = associative_memory(q, k, v, beta, rule=rule, mode=mode, decay=decay,
                              return_state=True)
    o, S = np.asarray(o), np.asarray(S)
    assert np.isfinite(o).all() and np.isfinite(S).all(), mode
    outs.append(o)
  scale = 1.0 + np.abs(outs[0]).max()  # hebb grows like T
  np.testing.assert_allclose(outs[1], outs[0], atol=1e-3 * scale)


def test_unstable_delta_is_rejected_with_concrete_values():
  q, k, v, _, _, S0 = inputs()
  big_k = 2.0 * k  # ‖k‖² = 4: β = 1 gives β‖k‖² = 4 > 2
  with pytest.raises(ValueError, match=r"beta_t·‖k_t‖² <= 2.*normalize_keys=True"):
    associative_memory(q, big_k, v, rule="delta")
  with pytest.raises(ValueError, match=r"beta_t·‖k_t‖²"):
    associative_memory(q, k, v, -0.5 * jnp.ones((2, 37, 3)), rule="gated_delta", decay=0.9)
  with pytest.raises(ValueError, match=r"‖v_t‖²"):
    associative_memory(q, k, 2.0 * v, rule="oja")
  with pytest.raises(ValueError, match=r"beta_t·‖k_t‖²"):
    step(init(2, 3, 12, 5), q[:, 0], big_k[:, 0], v[:, 0], rule="delta")
  # the guard's way out, and rules without an erase term, are accepted (they run the programs
  # of the tests above: the same shapes, mode auto, chunk 16)
  call("delta", "auto", q, big_k, v, None, None, S0, normalize_keys=True)
  call("hebb", "auto", q, big_k, v, None, None, S0)
  call("delta", "auto", q, k, v, 2.0 * jnp.ones((2, 37, 3)), None, S0)  # β‖k‖² = 2 exactly


# ----------------------------------------------------------------------------------------
# errors


def _qkv(B=1, T=5, H=2, Dk=4, Dv=3):
  return jnp.zeros((B, T, H, Dk)), jnp.zeros((B, T, H, Dk)), jnp.zeros((B, T, H, Dv))


@pytest.mark.parametrize(
    "change,kwargs,match",
    [
        ({"q": (5, 2, 4)}, {}, r"`q` must have rank 4 \[B, T, H, D_k\], got shape \(5, 2, 4\)"),
        ({"k": (1, 5, 2, 4, 1)}, {}, r"`k` must have rank 4"),
        ({"v": (1, 5, 3)}, {}, r"`v` must have rank 4"),
        ({"k": (1, 5, 3, 4)}, {}, r"numbers of heads: q=2, k=3"),
        ({"q": (1, 5, 3, 4), "k": (1, 5, 3, 4)}, {}, r"`v` has 2 heads, which the 3 heads of `q` and `k` must"),
        ({"v": (2, 5, 2, 3)}, {}, r"batch sizes: q=1, k=1, v=2"),
        ({"k": (1, 6, 2, 4)}, {}, r"lengths: q=5, k=6, v=5"),
        ({"k": (1, 5, 2, 7)}, {}, r"key widths: q=4, k=7"),
        ({}, {"rule": "hebbian"}, r"`rule` must be one of"),
        ({}, {"mode": "fast"}, r"`mode` must be one of"),
        ({}, {"chunk_size": 0}, r"`chunk_size` must be a positive integer, got 0"),
        ({}, {"chunk_size": -4}, r"`chunk_size` must be a positive integer"),
        ({}, {"chunk_size": 2.5}, r"`chunk_size` must be a positive integer"),
        ({}, {"rule": "oja", "mode": "parallel"}, r"mode='parallel' is not available for rule='oja'"),
        ({}, {"decay": 0.9}, r"`decay` is only used by rules .* rule 'delta'"),
        ({}, {"rule": "hebb", "decay": jnp.ones((1, 5, 2))}, r"`decay` is only used"),
        ({}, {"rule": "decay"}, r"rule 'decay' needs `decay`"),
        ({}, {"rule": "gated_delta", "decay": -1e-3}, r"`decay` must lie in \[0, 1\]"),
        ({}, {"rule": "gated_delta", "log_decay": 0.1}, r"`log_decay` must be <= 0"),
        ({}, {"rule": "decay", "log_decay": float("nan")}, r"`log_decay` must be <= 0"),
        ({}, {"rule": "decay", "decay": 0.5, "log_decay": -0.5}, r"pass `decay` or `log_decay`, not both"),
        ({}, {"log_decay": -0.5}, r"`log_decay` is only used by rules"),
        ({}, {"beta": [1.0, 1.0]},
         r"`beta` must be a scalar or have shape \[B, T, H\] = \(1, 5, 2\), got \(2,\)"),
        ({}, {"beta": float("nan")}, r"`beta` must be finite"),
        ({}, {"rule": "decay", "decay": [0.5, 0.5]}, r"`decay` must be a scalar or have shape"),
        ({}, {"precision": "fp8"}, r"`precision` must be one of"),
        ({}, {"rule": "decay", "decay": 1.5}, r"`decay` must lie in \[0, 1\]"),
        ({}, {"rule": "decay", "decay": float("nan")}, r"`decay` must lie in \[0, 1\]"),
        ({}, {"rule": "decay", "decay": -jnp.ones((1, 5, 2))}, r"`decay` must lie in \[0, 1\]"),
        ({}, {"rule": "decay", "decay": jnp.ones((1, 5))},
         r"`decay` must be a scalar or have shape \[B, T, H\] = \(1, 5, 2\), got \(1, 5\)"),
        ({}, {"beta": jnp.ones((1, 2, 5))}, r"`beta` must be a scalar or have shape \[B, T, H\]"),
        ({}, {"initial_state": jnp.zeros((1, 2, 4, 3))},
         r"`initial_state` must have shape \[B, H, D_v, D_k\] = \(1, 2, 3, 4\), got \(1, 2, 4, 3\)"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(change, kwargs, match):
  q, k, v = _qkv()
  q, k, v = (jnp.zeros(change[n]) if n in change else x for n, x in zip("qkv", (q, k, v), strict=True))
  kwargs = {"rule": "delta", **kwargs}
  beta = kwargs.pop("beta", None)
  with pytest.raises(ValueError, match=match):
    associative_memory(q, k, v, beta, **kwargs)


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        (((2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2, 3)), {}, r"`state` must have rank 4"),
        (((1, 2, 3, 4), (2, 4), (1, 2, 4), (1, 2, 3)), {}, r"`q_t` must have rank 3"),
        (((1, 2, 3, 4), (1, 3, 4), (1, 2, 4), (1, 2, 3)), {}, r"numbers of heads"),
        (((1, 2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2, 5)), {}, r"value widths: state=3, v_t=5"),
        (((1, 2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2, 3)), {"rule": "gated_delta"},
         r"needs `decay_t`"),
        (((1, 2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2, 3)), {"decay_t": 0.5}, r"`decay_t` is only used"),
        (((1, 2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2, 3)), {"rule": "decay", "decay_t": 2.0},
         r"`decay_t` must lie in \[0, 1\]"),
        (((1, 2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2, 3)), {"rule": "decay", "log_decay_t": 0.5},
         r"`log_decay_t` must be <= 0"),
        (((1, 2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2, 3)), {"beta_t": [1.0, 1.0, 1.0]},
         r"`beta_t` must be a scalar or have shape \[B, H\] = \(1, 2\), got \(3,\)"),
        (((1, 2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2, 3)), {"beta_t": jnp.ones((2, 1))},
         r"`beta_t` must be a scalar or have shape \[B, H\]"),
        (((1, 2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2, 3)), {"rule": "sum"}, r"`rule` must be one of"),
    ],
)
def test_step_bad_input_raises(args, kwargs, match):
  kwargs = {"rule": "delta", **kwargs}
  with pytest.raises(ValueError, match=match):
    step(*(jnp.zeros(s) for s in args), **kwargs)


def test_init_rejects_bad_sizes():
  with pytest.raises(ValueError, match=r"`d_k` must be a positive integer"):
    init(1, 2, 0, 3)
