"""associative_memory (hebb / delta / oja / decay / gated_delta) vs an independent numpy loop.

Every execution form (recurrent, parallel, chunked, auto) is checked against a float64
per-token loop written from the update equations, on values, final states and gradients,
with odd lengths (T not a multiple of the chunk) and widths that are not powers of two.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxmem.kernels import assoc
from jaxmem.kernels.assoc import associative_memory, init, step

RULES = ["hebb", "delta", "oja", "decay", "gated_delta"]
DECAYS = ("decay", "gated_delta")


def modes_for(rule):
  return ["recurrent", "chunked", "auto"] + ([] if rule == "oja" else ["parallel"])


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
  cast = lambda x: None if x is None else jnp.asarray(x, dtype)
  return tuple(cast(x) for x in (q, k, v, beta, decay, S0))


def call(rule, mode, q, k, v, beta, decay, S0, chunk=16, **kw):
  return associative_memory(q, k, v, beta, rule=rule, mode=mode, chunk_size=chunk,
                            decay=decay if rule in DECAYS else None, initial_state=S0,
                            return_state=True, **kw)


# ----------------------------------------------------------------------------------------
# values


@pytest.mark.parametrize("rule", RULES)
def test_every_mode_matches_numpy_loop_with_initial_state(rule):
  # T = 37 with chunk 16 (3 chunks, the last padded), D_k = 12, D_v = 5
  q, k, v, beta, decay, S0 = make_inputs(2, 37, 3, 12, 5, seed=1)
  ref_o, ref_S = numpy_assoc(q, k, v, beta, decay if rule in DECAYS else None, S0, rule)
  for mode in modes_for(rule):
    o, S = call(rule, mode, q, k, v, beta, decay, S0)
    assert o.shape == (2, 37, 3, 5) and o.dtype == jnp.float32, mode
    assert S.shape == (2, 3, 5, 12) and S.dtype == jnp.float32, mode
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5, err_msg=f"{rule} {mode} o")
    np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5, err_msg=f"{rule} {mode} S")


@pytest.mark.parametrize("rule", RULES)
def test_chunked_matches_numpy_loop_without_state_or_beta(rule):
  # D_k = 60, T = 63 with chunk 16; beta=None means 1 (unit keys: β‖k‖² = 1 is stable)
  q, k, v, _, decay, _ = make_inputs(1, 63, 2, 60, 7, seed=2, with_state=False)
  ref_o, ref_S = numpy_assoc(q, k, v, None, decay if rule in DECAYS else None, None, rule)
  o, S = call(rule, "chunked", q, k, v, None, decay, None)
  np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("rule,chunk,group", [
    ("delta", 8, 2), ("oja", 8, 2), ("gated_delta", 8, 2), ("decay", 8, 1), ("delta", 1, 4),
    ("oja", 64, None), ("gated_delta", 64, None),
])
def test_chunked_grouping_and_chunk_sizes(rule, chunk, group):
  # T = 37: chunk 8 gives 5 chunks, in groups of 2 the last group is half padding;
  # chunk 1 is the recurrence itself; chunk 64 > T is one chunk of T.
  q, k, v, beta, decay, S0 = make_inputs(1, 37, 2, 5, 3, seed=3)
  lg = jnp.log(decay) if rule in DECAYS else None
  o, S = assoc.chunked(q, k, v, beta, lg, S0, rule=rule, chunk_size=chunk, group=group)
  ref_o, ref_S = numpy_assoc(q, k, v, beta, decay if rule in DECAYS else None, S0, rule)
  np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("rule,T,chunk", [
    ("delta", 63, 16), ("gated_delta", 37, 8), ("oja", 63, 16), ("decay", 37, 16),
])
def test_chunked_batch_of_one_equals_its_row_of_a_batch(rule, T, chunk):
  # B = 1 groups the sequence by a reshape alone (no batch axis), B > 1 by a transpose:
  # both paths give the numpy loop's values and final states and the same gradients.
  # D_k = 60 and T not a multiple of the chunk (the last chunk padded).
  q, k, v, beta, decay, S0 = make_inputs(2, T, 2, 60, 12, seed=21)
  ref_o, ref_S = numpy_assoc(q, k, v, beta, decay if rule in DECAYS else None, S0, rule)
  one = lambda x: x[1:]
  o2, S2 = call(rule, "chunked", q, k, v, beta, decay, S0, chunk=chunk)
  o1, S1 = call(rule, "chunked", *map(one, (q, k, v, beta, decay, S0)), chunk=chunk)
  np.testing.assert_allclose(o2, ref_o, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S2, ref_S, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(o1, ref_o[1:], rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S1, ref_S[1:], rtol=1e-4, atol=2e-5)

  r = np.random.default_rng(22)
  cot_o = jnp.asarray(r.normal(size=(2, T, 2, 12)), jnp.float32)
  cot_S = jnp.asarray(r.normal(size=(2, 2, 12, 60)), jnp.float32)

  def grads(mode, cot_o, cot_S, *xs):
    def f(*xs):
      o, S = call(rule, mode, *xs, chunk=chunk)
      return jnp.sum(o * cot_o) + jnp.sum(S * cot_S)
    return jax.jit(jax.grad(f, argnums=tuple(range(6))))(*xs)

  g2 = grads("chunked", cot_o, cot_S, q, k, v, beta, decay, S0)
  g1 = grads("chunked", one(cot_o), one(cot_S), *map(one, (q, k, v, beta, decay, S0)))
  ref1 = grads("recurrent", one(cot_o), one(cot_S), *map(one, (q, k, v, beta, decay, S0)))
  names = ["q", "k", "v", "beta", "decay", "initial_state"]
  for name, a, b, c in zip(names, g1, g2, ref1, strict=True):
    if name == "decay" and rule not in DECAYS:
      continue
    np.testing.assert_allclose(a, c, rtol=2e-4, atol=2e-5, err_msg=f"B=1 vs recurrent d/d{name}")
    np.testing.assert_allclose(a, b[1:], rtol=2e-4, atol=2e-5, err_msg=f"B=1 vs B=2 d/d{name}")


def test_hebb_parallel_is_causal_linear_attention():
  q, k, v, _, _, _ = make_inputs(2, 29, 3, 12, 5, seed=4, with_state=False)
  mask = jnp.tril(jnp.ones((29, 29), bool))[None, None]
  scores = jnp.where(mask, jnp.einsum("bthd,bshd->bhts", q, k), 0.0)
  linear_attention = jnp.einsum("bhts,bshe->bthe", scores, v)  # o_t = Σ_{s≤t} (q_t·k_s) v_s
  o = associative_memory(q, k, v, rule="hebb", mode="parallel")
  np.testing.assert_allclose(o, linear_attention, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule,chunk", [(r, 5) for r in RULES] + [("oja", 100), ("gated_delta", 100)])
def test_chunked_with_initial_state_equals_recurrent(rule, chunk):
  q, k, v, beta, decay, S0 = make_inputs(2, 23, 2, 6, 4, seed=5)
  o_r, S_r = call(rule, "recurrent", q, k, v, beta, decay, S0)
  o_c, S_c = call(rule, "chunked", q, k, v, beta, decay, S0, chunk=chunk)
  np.testing.assert_allclose(o_c, o_r, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S_c, S_r, rtol=1e-4, atol=2e-5)


def test_splitting_a_sequence_carries_the_state():
  q, k, v, beta, decay, _ = make_inputs(1, 40, 2, 6, 4, seed=6, with_state=False)
  o, S = call("gated_delta", "chunked", q, k, v, beta, decay, None)
  o1, S1 = call("gated_delta", "chunked", q[:, :25], k[:, :25], v[:, :25], beta[:, :25],
                decay[:, :25], None)
  o2, S2 = call("gated_delta", "chunked", q[:, 25:], k[:, 25:], v[:, 25:], beta[:, 25:],
                decay[:, 25:], S1)
  np.testing.assert_allclose(jnp.concatenate([o1, o2], axis=1), o, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S2, S, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("rule", RULES)
def test_step_over_a_sequence_equals_the_sequence_form(rule):
  B, T, H, Dk, Dv = 2, 11, 3, 6, 4
  q, k, v, beta, decay, S0 = make_inputs(B, T, H, Dk, Dv, seed=7)
  o_seq, S_seq = call(rule, "chunked", q, k, v, beta, decay, S0, chunk=4)
  step_fn = jax.jit(lambda S, q, k, v, b, g: step(S, q, k, v, b, g if rule in DECAYS else None,
                                                  rule=rule))
  S, outs = S0, []
  for t in range(T):
    S, o_t = step_fn(S, q[:, t], k[:, t], v[:, t], beta[:, t], decay[:, t])
    outs.append(o_t)
  np.testing.assert_allclose(jnp.stack(outs, axis=1), o_seq, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, S_seq, rtol=1e-4, atol=2e-5)


def test_init_and_step_from_empty_memory():
  S = init(2, 3, 5, 4)
  assert S.shape == (2, 3, 4, 5) and S.dtype == jnp.float32 and not S.any()
  q = k = jnp.ones((2, 3, 5)) / np.sqrt(5)
  v = jnp.ones((2, 3, 4))
  S, o = step(S, q, k, v, rule="delta")  # β = 1, unit key: stores v exactly
  np.testing.assert_allclose(o, v, rtol=1e-6)
  S, o = step(S, q, k, 2 * v, 0.5, 0.9, rule="gated_delta")
  np.testing.assert_allclose(o, 0.9 * v + 0.5 * (2 * v - 0.9 * v), rtol=1e-6)


def test_normalize_keys_equals_passing_unit_keys():
  q, k, v, beta, _, _ = make_inputs(1, 19, 2, 6, 3, seed=8, with_state=False)
  k_big = 3.0 * k
  a = associative_memory(q, k_big, v, beta, rule="delta", normalize_keys=True, mode="chunked")
  b = associative_memory(q, k, v, beta, rule="delta", mode="chunked")
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_auto_runs_the_fast_forward_and_differentiates_the_chunked_form():
  q, k, v, beta, _, _ = make_inputs(1, 21, 2, 6, 3, seed=9, with_state=False)
  fwd = assoc.auto_forward_mode()
  assert fwd == ("recurrent" if jax.default_backend() == "cpu" else "chunked")
  a = associative_memory(q, k, v, beta, rule="delta", mode="auto", chunk_size=8)
  b = associative_memory(q, k, v, beta, rule="delta", mode=fwd, chunk_size=8)
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  loss = lambda mode: lambda q, k, v, b: jnp.sum(associative_memory(
      q, k, v, b, rule="delta", mode=mode, chunk_size=8) ** 2)
  g_auto = jax.grad(loss("auto"), argnums=(0, 1, 2, 3))(q, k, v, beta)
  g_chunked = jax.grad(loss("chunked"), argnums=(0, 1, 2, 3))(q, k, v, beta)
  for a_, b_ in zip(g_auto, g_chunked, strict=True):
    np.testing.assert_allclose(a_, b_, rtol=1e-5, atol=1e-6)
  # forward mode goes through the chunked JVP too: <∇_q L, t> = d/dε L(q + ε t)
  t = jnp.asarray(np.random.default_rng(0).normal(size=q.shape), jnp.float32)
  _, dL = jax.jvp(lambda q: loss("auto")(q, k, v, beta), (q,), (t,))
  np.testing.assert_allclose(dL, jnp.sum(g_auto[0] * t), rtol=1e-4)


def test_vmap_over_an_extra_axis_and_bfloat16():
  q, k, v, beta, _, _ = make_inputs(1, 20, 2, 6, 3, seed=10, with_state=False)
  stack = lambda x: jnp.stack([x, 0.5 * x])
  f = lambda q, k, v: associative_memory(q, k, v, beta, rule="delta", mode="chunked", chunk_size=8)
  batched = jax.vmap(f)(stack(q), stack(k), stack(v))
  np.testing.assert_allclose(batched[1], f(0.5 * q, 0.5 * k, 0.5 * v), rtol=1e-5, atol=1e-6)
  o16 = f(*(x.astype(jnp.bfloat16) for x in (q, k, v)))
  assert o16.dtype == jnp.bfloat16
  np.testing.assert_allclose(o16.astype(jnp.float32), f(q, k, v), atol=5e-2)


# ----------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("rule", RULES)
def test_gradients_agree_between_modes(rule):
  # T = 21 with chunk 8; gradients of a loss on outputs and final state, w.r.t. q, k, v,
  # beta, decay (for the decay rules) and the initial state
  q, k, v, beta, decay, S0 = make_inputs(1, 21, 2, 6, 5, seed=11)
  r = np.random.default_rng(12)
  cot_o = jnp.asarray(r.normal(size=(1, 21, 2, 5)), jnp.float32)
  cot_S = jnp.asarray(r.normal(size=(1, 2, 5, 6)), jnp.float32)

  def loss(mode):
    def f(q, k, v, beta, decay, S0):
      o, S = call(rule, mode, q, k, v, beta, decay, S0, chunk=8)
      return jnp.sum(o * cot_o) + jnp.sum(S * cot_S)
    return jax.jit(jax.grad(f, argnums=(0, 1, 2, 3, 4, 5)))

  names = ["q", "k", "v", "beta", "decay", "initial_state"]
  ref = loss("recurrent")(q, k, v, beta, decay, S0)
  for mode in [m for m in modes_for(rule) if m not in ("recurrent", "auto")]:  # auto: below
    got = loss(mode)(q, k, v, beta, decay, S0)
    for name, a, b in zip(names, got, ref, strict=True):
      if name == "decay" and rule not in DECAYS:
        continue
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg=f"{rule} {mode} d/d{name}")


@pytest.mark.parametrize("rule", RULES)
def test_gradients_match_finite_differences_float64(rule):
  with jax.enable_x64(True):
    q, k, v, beta, decay, S0 = make_inputs(1, 7, 2, 3, 2, seed=13, dtype=np.float64)
    beta = 0.5 * beta  # keep β‖a‖² < 2 under the finite-difference perturbations
    d = decay if rule in DECAYS else None

    def f(q, k, v, beta, decay, S0):
      o, S = associative_memory(q, k, v, beta, rule=rule, mode="chunked", chunk_size=3,
                                decay=decay, initial_state=S0, return_state=True)
      return o, S

    if d is None:
      check_grads(lambda q, k, v, b, S0: f(q, k, v, b, None, S0), (q, k, v, beta, S0),
                  order=1, modes=("rev",), eps=1e-5)
    else:
      check_grads(f, (q, k, v, beta, d, S0), order=1, modes=("rev",), eps=1e-5)


def test_unit_lower_inverse_matches_numpy():
  r = np.random.default_rng(14)
  # 5: one forward-substitution block; 64: three block levels; 37 and 100: padded to 40 and
  # 104 (m·2^L with m ≤ 8), not to a power of two
  for C in (5, 64, 37, 100):
    A = np.tril(r.normal(size=(3, C, C)) * (0.3 if C <= 64 else 0.1), -1).astype(np.float32)  # |T| = O(1)
    T = jax.jit(assoc.unit_lower_inverse)(jnp.asarray(A))
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
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(S)).all(), mode
    outs.append(o)
  scale = 1.0 + float(jnp.max(jnp.abs(outs[0])))  # hebb grows like T
  np.testing.assert_allclose(outs[1], outs[0], atol=1e-3 * scale)


def test_unstable_delta_is_rejected_with_concrete_values():
  q, k, v, _, _, _ = make_inputs(1, 9, 2, 4, 3, seed=16, with_state=False)
  big_k = 2.0 * k  # ‖k‖² = 4: β = 1 gives β‖k‖² = 4 > 2
  with pytest.raises(ValueError, match=r"beta_t·‖k_t‖² <= 2.*normalize_keys=True"):
    associative_memory(q, big_k, v, rule="delta")
  with pytest.raises(ValueError, match=r"beta_t·‖k_t‖²"):
    associative_memory(q, k, v, -0.5 * jnp.ones((1, 9, 2)), rule="gated_delta", decay=0.9)
  with pytest.raises(ValueError, match=r"‖v_t‖²"):
    associative_memory(q, k, 2.0 * v, rule="oja")
  with pytest.raises(ValueError, match=r"beta_t·‖k_t‖²"):
    step(init(1, 2, 4, 3), q[:, 0], big_k[:, 0], v[:, 0], rule="delta")
  # the guard's way out, and rules without an erase term, are accepted
  associative_memory(q, big_k, v, rule="delta", normalize_keys=True)
  associative_memory(q, big_k, v, rule="hebb")
  associative_memory(q, k, v, 2.0 * jnp.ones((1, 9, 2)), rule="delta")  # β‖k‖² = 2 exactly


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
        ({"k": (1, 5, 3, 4)}, {}, r"numbers of heads: q=2, k=3, v=2"),
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


def test_init_state_is_the_old_name_of_init():
  assert assoc.init_state is init
