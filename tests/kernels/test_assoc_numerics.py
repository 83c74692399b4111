"""Numerics of the associative-memory kernel that values-only tests at friendly inputs miss.

Decays of exactly 0 (and 1e-30, 1e-6, near 0, 1) and write strengths 0 / 1 / 2 under ``jit``,
in every rule and mode, values and gradients, against an independent reference (a float64
numpy loop for values, a float64 loop in ``γ`` for gradients); finite differences in every
form; the stability guard's edge cases; matmul precision (every matmul carries it, and
emulated bf16 / TF32 platforms cost what the docstring says); long sequences in the parallel
form; padding; dtypes of carried states; the ``auto`` mode's derivative form.

One grid of inputs (:func:`grid_inputs`, T = 37 with chunk 4) serves the grid, near-zero
decay, log-decay, parallel_head and ``auto`` tests: each (rule, mode, decay argument) compiles
one program returning outputs, final states and gradients (:func:`grid_results`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels import assoc
from jaxmem.kernels.assoc import associative_memory, init, step
from jaxmem.kernels.precision import dot_general_precisions, emulate_matmul_precision, jaxpr_eqns, matmul_for
from jaxmem.kernels.segsum import segsum
from tests.kernels.test_assoc import (
  DECAYS,
  NAMES,
  RULES,
  check_vjp_float64,
  float64_kernel,
  make_inputs,
  modes_for,
  numpy_assoc,
  unit,
)

GAMMAS = (0.0, 1e-30, 1e-6, 1.0)
BETAS = (0.0, 1.0, 2.0)
NEAR_ZERO = (1e-6, 1e-3, 0.05, 0.5, 1.0)
GRID_CHUNK = 4


def loop_reference(q, k, v, beta, decay, S0, rule):
  """The update equations scanned token by token in ``γ`` (not log γ): differentiable at γ = 0."""
  B, T, H, Dk = q.shape
  S = jnp.zeros((B, H, v.shape[-1], Dk), q.dtype) if S0 is None else S0
  decay = jnp.ones_like(beta) if decay is None else decay
  ein = functools.partial(jnp.einsum, precision="highest")

  def body(S, x):
    qt, kt, vt, bt, gt = x
    b, g = bt[..., None, None], gt[..., None, None]
    Sk = ein("bhvk,bhk->bhv", S, kt)[..., None]
    if rule == "hebb":
      S = S + b * vt[..., None] * kt[..., None, :]
    elif rule == "delta":
      S = S + b * (vt[..., None] - Sk) * kt[..., None, :]
    elif rule == "oja":
      S = S + b * vt[..., None] * (kt - ein("bhv,bhvk->bhk", vt, S))[..., None, :]
    elif rule == "decay":
      S = g * S + b * vt[..., None] * kt[..., None, :]
    elif rule == "gated_oja":
      S = g * S
      S = S + b * vt[..., None] * (kt - ein("bhv,bhvk->bhk", vt, S))[..., None, :]
    else:  # gated_delta
      S = g * S + b * (vt[..., None] - g * Sk) * kt[..., None, :]
    return S, ein("bhvk,bhk->bhv", S, qt)

  S, o = jax.lax.scan(body, S, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, beta, decay)))
  return jnp.moveaxis(o, 0, 1), S


@functools.cache
def grid_inputs(T=37, H=2, Dk=5, Dv=3, seed=0):
  """Rows 0..11: one per (γ, β) of the grid, constant over tokens; rows 12, 13: per-token γ
  drawn from the grid and from (0.6, 1], per-token β from the grid; rows 14, 15: per-token γ
  near 0 (1e-6, 1e-3, 0.05, 0.5 or 1, times U(0.5, 1)), β in (0.1, 1.5). Unit keys and values."""
  combos = [(g, b) for g in GAMMAS for b in BETAS]
  n = len(combos)
  q, k, v, beta, decay, S0 = make_inputs(n + 4, T, H, Dk, Dv, seed=seed)
  r = np.random.default_rng(seed)
  d = np.empty((n + 4, T, H))
  b = np.empty((n + 4, T, H))
  d[:n] = np.array([g for g, _ in combos])[:, None, None]
  b[:n] = np.array([x for _, x in combos])[:, None, None]
  d[n:n + 2] = np.where(r.random((2, T, H)) < 0.5, r.choice(GAMMAS, (2, T, H)), np.asarray(decay)[n:n + 2])
  b[n:n + 2] = r.choice(BETAS, (2, T, H))
  d[n + 2:] = np.minimum(r.choice(NEAR_ZERO, (2, T, H)) * r.uniform(0.5, 1.0, (2, T, H)), 1.0)
  b[n + 2:] = np.asarray(beta)[n + 2:]
  return q, k, v, jnp.asarray(b, jnp.float32), jnp.asarray(d, jnp.float32), S0


NEAR_ZERO_ROWS = slice(14, 16)


def _kernel(rule, mode, as_log, chunk=GRID_CHUNK):
  def f(q, k, v, beta, decay, S0):
    kw = {}
    if rule in DECAYS:
      kw = {"log_decay": decay} if as_log else {"decay": decay}  # as_log: the argument is log γ
    return associative_memory(q, k, v, beta, rule=rule, mode=mode, chunk_size=chunk,
                              initial_state=S0, return_state=True, **kw)
  return f


def _loss(fn, cot):
  def loss(*xs):
    o, S = fn(*xs)
    return jnp.sum(o * cot[0]) + jnp.sum(S * cot[1])
  return loss


@functools.cache
def grid_cotangents():
  q, _, v, _, _, S0 = grid_inputs()
  r = np.random.default_rng(3)
  return tuple(jnp.asarray(r.normal(size=s), jnp.float32) for s in (q.shape[:3] + v.shape[-1:], S0.shape))


@functools.cache
def grid_reference(rule):
  """The float64 numpy loop on the grid: ``(o, S_T)``."""
  q, k, v, beta, decay, S0 = grid_inputs()
  return numpy_assoc(q, k, v, beta, decay if rule in DECAYS else None, S0, rule)


@functools.cache
def grid_reference_grads(rule):
  """Gradients of ``<cot, (o, S_T)>`` w.r.t. all six inputs from :func:`loop_reference` in float64."""
  ref = lambda q, k, v, beta, decay, S0: loop_reference(
      q, k, v, beta, decay if rule in DECAYS else None, S0, rule)
  with jax.enable_x64(True):
    xs64 = tuple(jnp.asarray(np.asarray(x), jnp.float64) for x in grid_inputs())
    cot64 = tuple(jnp.asarray(np.asarray(c), jnp.float64) for c in grid_cotangents())
    return [np.asarray(g) for g in jax.jit(jax.grad(_loss(ref, cot64), argnums=tuple(range(6))))(*xs64)]


@functools.cache
def grid_program(rule, mode, as_log):
  """One jitted program: ``(o, S_T, pullback of (cot_o, cot_S) to q, k, v, beta, decay, S_0)``."""
  def run(cot_o, cot_S, *xs):
    (o, S), pullback = jax.vjp(_kernel(rule, mode, as_log), *xs)
    return o, S, pullback((cot_o, cot_S))
  return jax.jit(run)


def grid_arguments(as_log):
  """The grid's inputs; ``as_log``: decays as ``log γ`` (−inf at γ = 0), for ``log_decay=``."""
  q, k, v, beta, decay, S0 = grid_inputs()
  if as_log:
    with np.errstate(divide="ignore"):
      decay = jnp.asarray(np.log(np.asarray(decay)))
  return q, k, v, beta, decay, S0


@functools.cache
def grid_results(rule, mode, as_log=False):
  """:func:`grid_program` on :func:`grid_arguments`, as numpy arrays."""
  return jax.device_get(grid_program(rule, mode, as_log)(*grid_cotangents(), *grid_arguments(as_log)))


@functools.cache
def grid_auto_forward(rule, as_log=False):
  """mode="auto" called without a derivative (the recurrent form on CPU): ``(o, S_T)``."""
  return jax.device_get(jax.jit(_kernel(rule, "auto", as_log))(*grid_arguments(as_log)))


def decay_arguments(rule):
  return [False, True] if rule in DECAYS else [False]


CASES = [(r, m) for r in RULES for m in modes_for(r)]


@pytest.mark.parametrize("rule,mode", CASES)
@pytest.mark.slow
def test_decay_and_beta_grid_finite_and_exact_under_jit(rule, mode):
  # γ ∈ {0, 1e-30, 1e-6, 1}, β ∈ {0, 1, 2}, traced (so no eager check can help), T = 37 with
  # chunk 4, values against the float64 numpy loop and gradients against a plain loop in γ
  # (not log γ), whose derivative at γ = 0 is the true one; the decay rules both with decay=
  # and with log_decay = log γ (−inf at γ = 0). auto: its values forward only (the recurrent
  # form on CPU); its gradient is the chunked form's program (a custom JVP that does not
  # depend on the rule), checked here for gated_delta, the rule with every input, and equal
  # to the chunked form's bit for bit (test_auto_gradient_is_the_chunked_forms...).
  ref_o, ref_S = grid_reference(rule)
  ref_g = grid_reference_grads(rule)
  decay = np.asarray(grid_inputs()[4], np.float64)
  for as_log in decay_arguments(rule):
    if mode == "auto":
      o, S = grid_auto_forward(rule, as_log)
      grads = grid_results(rule, mode, as_log)[2] if rule == "gated_delta" else ()
    else:
      o, S, grads = grid_results(rule, mode, as_log)
    assert np.isfinite(o).all() and np.isfinite(S).all(), (as_log,)
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=3e-5, err_msg=f"o log={as_log}")
    np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=3e-5, err_msg=f"S log={as_log}")
    for name, g, gr in zip(NAMES[:len(grads)], grads, ref_g[:len(grads)], strict=True):
      assert np.isfinite(g).all(), f"d/d{name} not finite (log={as_log})"
      if name == "decay" and rule not in DECAYS:
        continue  # not an input of the rule
      if name == "decay" and as_log:
        gr = gr * decay  # d/d log γ = γ · d/dγ (0 at γ = 0)
      np.testing.assert_allclose(g, gr, rtol=2e-3, atol=1e-4, err_msg=f"d/d{name} log={as_log}")


@pytest.mark.parametrize("rule,mode", [(r, m) for r in DECAYS for m in modes_for(r) if m != "auto"]
                         + [("gated_delta", "auto")])
def test_log_decay_minus_inf_has_finite_log_space_gradients(rule, mode):
  # γ = 0 passed as log γ = −inf: d/d(log γ) = γ · (...) = 0 there exactly, finite everywhere
  # (auto differentiates the chunked form's program: checked for gated_delta).
  zero = np.asarray(grid_inputs()[4]) == 0
  assert zero.any()
  grads = grid_results(rule, mode, True)[2]
  for name, g in zip(NAMES, grads, strict=True):
    assert np.isfinite(g).all(), name
  np.testing.assert_array_equal(grads[4][zero], 0.0)


@pytest.mark.parametrize("rule", RULES)
def test_decays_near_zero_match_the_numpy_loop(rule):
  # grid rows 14, 15: decays in (0, 1] with many values near 0 (1e-6, 1e-3) in every mode,
  # T = 37 with chunk 4 (the last chunk padded; the parallel form's one chunk of 37 is
  # inverted in blocks), given as decay= and as log_decay=
  ref_o, ref_S = grid_reference(rule)
  for mode in modes_for(rule):
    for as_log in decay_arguments(rule):
      o, S = grid_auto_forward(rule, as_log) if mode == "auto" else grid_results(rule, mode, as_log)[:2]
      np.testing.assert_allclose(o[NEAR_ZERO_ROWS], ref_o[NEAR_ZERO_ROWS], rtol=1e-4, atol=2e-5,
                                 err_msg=f"{mode} log={as_log}")
      np.testing.assert_allclose(S[NEAR_ZERO_ROWS], ref_S[NEAR_ZERO_ROWS], rtol=1e-4, atol=2e-5,
                                 err_msg=f"{mode} log={as_log}")


@pytest.mark.parametrize("rule,mode", [(r, m) for r, m in CASES if m in ("recurrent", "parallel")])
def test_finite_differences_in_every_mode_float64(rule, mode):
  # chunked: test_assoc.py::test_gradients_match_finite_differences_float64; auto
  # differentiates the chunked form (test_auto_gradient_is_the_chunked_forms...)
  # decays include 1e-3 so the log-space paths are exercised near 0
  with jax.enable_x64(True):
    q, k, v, beta, decay, S0 = make_inputs(1, 7, 2, 3, 2, seed=13, dtype=np.float64)
    beta = 0.5 * beta
    decay = np.array(decay)
    decay[0, 2] = 1e-3
    if rule in DECAYS:
      check_vjp_float64(float64_kernel(rule, mode), (q, k, v, beta, S0, jnp.asarray(decay)), eps=1e-6)
    else:
      check_vjp_float64(float64_kernel(rule, mode), (q, k, v, beta, S0), eps=1e-5)


# ----------------------------------------------------------------------------------------
# the stability guard


def test_guard_rejects_nan_beta_and_reads_lists_as_arrays():
  q, k, v, _, _, _ = make_inputs(1, 3, 2, 4, 3, seed=16, with_state=False)
  for rule in RULES:
    with pytest.raises(ValueError, match=r"`beta` must be finite"):
      associative_memory(q, k, v, jnp.full((1, 3, 2), jnp.nan), rule=rule,
                         decay=0.9 if rule in DECAYS else None)
  # a list is an array of that shape: a per-token list of length T = 3 is not [B, T, H]
  with pytest.raises(ValueError, match=r"`beta` must be a scalar or have shape"):
    associative_memory(q, k, v, [0.5, 0.5, 0.5], rule="delta")
  nested = [[[0.5, 1.0]] * 3]  # [B, T, H] as nested lists
  np.testing.assert_allclose(associative_memory(q, k, v, nested, rule="delta"),
                             associative_memory(q, k, v, jnp.asarray(nested), rule="delta"), rtol=1e-6)
  with pytest.raises(ValueError, match=r"`decay` must be a scalar or have shape"):
    associative_memory(q, k, v, rule="decay", decay=[0.9, 0.9])


@jax.jit
def _decay_gradient(d, q, k, v, beta):
  return jax.grad(lambda d: jnp.sum(associative_memory(q, k, v, beta, rule="decay", decay=d)))(d)


def test_guard_rejects_non_finite_erase_vectors_and_float16_decays_stay_finite():
  q, k, v, beta, _, _ = make_inputs(1, 5, 2, 4, 3, seed=32, with_state=False)
  with pytest.raises(ValueError, match=r"`k` must be finite for rule 'delta'"):
    associative_memory(q, k.at[0, 2, 1, 0].set(jnp.nan), v, beta, rule="delta")
  with pytest.raises(ValueError, match=r"`v` must be finite for rule 'oja'"):
    associative_memory(q, k, v.at[0, 1, 0, 0].set(jnp.inf), beta, rule="oja")
  # the decay conversion in float16 (where the 1e-30 floor would be 0): finite, in float32
  g = jnp.asarray([0.0, 1e-3, 0.5, 1.0], jnp.float16)
  lg = assoc.log_of_decay(g)
  assert lg.dtype == jnp.float32 and np.isfinite(np.asarray(lg)).all()
  grad = _decay_gradient(jnp.zeros((1, 5, 2), jnp.float16), q, k, v, beta)
  assert grad.dtype == jnp.float16 and np.isfinite(np.asarray(grad, np.float32)).all()


def test_float64_initial_state_is_accumulated_in_float64():
  with jax.enable_x64(True):
    q, k, v, _, _, _ = make_inputs(1, 6, 2, 4, 3, seed=33, with_state=False)
    S0 = jnp.asarray(np.random.default_rng(34).normal(size=(1, 2, 3, 4)) * (1 + 1e-12), jnp.float64)
    for mode in ("recurrent", "chunked"):
      _, S = associative_memory(q, k, v, 0.0, rule="delta", mode=mode, initial_state=S0, return_state=True)
      assert S.dtype == jnp.float64
      np.testing.assert_array_equal(S, S0)  # β = 0 writes nothing: the state is untouched, as in step()


def test_guard_slack_follows_the_input_dtype():
  # keys L2-normalised in bfloat16 have ‖k‖² = 1 ± ~1%: β = 2 must pass, β = 2.2 must not
  r = np.random.default_rng(17)
  k = jnp.asarray(unit(r.normal(size=(1, 64, 2, 8))), jnp.bfloat16)
  k = (k / jnp.sqrt(jnp.sum(k * k, -1, keepdims=True))).astype(jnp.bfloat16)
  sq = np.sum(np.square(np.asarray(k, np.float64)), -1)
  assert sq.max() > 1 + 2e-4  # the float32 slack alone would reject β = 2
  q = v = k
  associative_memory(q, k, v, jnp.full((1, 64, 2), 2.0, jnp.bfloat16), rule="delta")
  with pytest.raises(ValueError, match=r"beta_t·‖k_t‖² <= 2"):
    associative_memory(q, k, v, jnp.full((1, 64, 2), 2.2, jnp.bfloat16), rule="delta")
  k32 = jnp.asarray(unit(r.normal(size=(1, 64, 2, 8))), jnp.float32)
  with pytest.raises(ValueError, match=r"beta_t·‖k_t‖² <= 2"):
    associative_memory(k32, 1.01 * k32, k32, 2.0, rule="delta")


# ----------------------------------------------------------------------------------------
# matmul precision


# every rule in its chunked form; the recurrent and parallel code paths once each
PRECISION_CASES = [(r, "chunked") for r in RULES] + [
    ("delta", "recurrent"), ("oja", "recurrent"), ("delta", "parallel"), ("decay", "parallel")]


@pytest.mark.parametrize("rule,mode", PRECISION_CASES + [("gated_delta", "auto"), ("hebb", "parallel")])
def test_every_matmul_carries_the_precision_values_and_gradients(rule, mode):
  # jaxprs only: nothing is compiled
  q, k, v, beta, decay, S0 = make_inputs(1, 11, 2, 4, 3, seed=18)
  d = decay if rule in DECAYS else None

  def f(q, k, v, precision):
    o, S = associative_memory(q, k, v, beta, rule=rule, mode=mode, chunk_size=4, decay=d,
                              initial_state=S0, return_state=True, precision=precision)
    return jnp.sum(o) + jnp.sum(S)

  for precision, want in (("highest", jax.lax.Precision.HIGHEST), ("tensorfloat32", jax.lax.Precision.HIGH)):
    for g in (f, jax.grad(f, argnums=(0, 1, 2))):
      found = dot_general_precisions(jax.make_jaxpr(functools.partial(g, precision=precision))(q, k, v))
      assert found, "no matmul found"
      assert all(p == (want, want) for p in found), (precision, set(found))


def test_step_carries_the_precision():
  S = init(1, 2, 4, 3)
  q = k = jnp.ones((1, 2, 4)) / 2
  v = jnp.ones((1, 2, 3))
  found = dot_general_precisions(jax.make_jaxpr(lambda S: step(S, q, k, v, 0.5, rule="gated_delta",
                                                                 decay_t=0.9))(S))
  assert found and all(p == (jax.lax.Precision.HIGHEST,) * 2 for p in found)


# documented accuracy per (emulated) platform default, at T = 128, D = 16: max abs error
# against the float64 loop. "highest" must stay at float32 level on every platform.
EMULATED_TOL = {"highest": 3e-5, "tensorfloat32": 2e-2, "bfloat16": 2e-1}


@pytest.mark.parametrize("rule,mode", [("delta", "recurrent"), ("delta", "chunked"), ("delta", "parallel"),
                                       ("gated_delta", "chunked"), ("oja", "chunked"), ("hebb", "parallel"),
                                       ("decay", "parallel")])
@pytest.mark.slow
def test_emulated_reduced_precision_platforms(rule, mode):
  # the full rule × form table at T = 2048: `jaxmem bench precision`
  q, k, v, beta, decay, S0 = make_inputs(1, 128, 2, 16, 16, seed=19)
  d = decay if rule in DECAYS else None
  ref_o, _ = numpy_assoc(q, k, v, beta, d, S0, rule)
  f = lambda q, precision: associative_memory(
      q, k, v, beta, rule=rule, mode=mode, chunk_size=32, decay=d, initial_state=S0, precision=precision)
  exact = np.asarray(f(q, "highest"))
  program = str(jax.make_jaxpr(f, static_argnums=1)(q, "highest"))
  for platform in ("tensorfloat32", "bfloat16"):
    with emulate_matmul_precision(platform):
      # the kernel's default ("highest") ignores the platform default: the same float32
      # program as outside (no operand rounding, every matmul at HIGHEST), so the same bits
      assert str(jax.make_jaxpr(f, static_argnums=1)(q, "highest")) == program
      fast = np.asarray(f(q, "default"))
    err = np.abs(fast - ref_o).max()
    assert err < EMULATED_TOL[platform], (platform, err)
    assert err > 10 * np.abs(exact - ref_o).max(), (platform, err)  # the emulation does round
  assert np.abs(exact - ref_o).max() < EMULATED_TOL["highest"]


@functools.partial(jax.jit, static_argnums=(0,))
def _matmul_gradients(m, x, y, c):
  return jax.grad(lambda x, y: jnp.sum(m(x, y) * c), argnums=(0, 1))(x, y)


@functools.partial(jax.jit, static_argnums=(0,))
def _matmul_jacobian(m, x, y):
  return jax.jacfwd(lambda x: m(x, y))(x)


def test_emulation_rounds_operands_like_the_platform():
  a = jnp.asarray([[1.0 + 2.0 ** -9]], jnp.float32)  # representable in TF32, not in bf16
  one = jnp.ones((1, 1), jnp.float32)
  # gradients: the transposed matmuls see rounded cotangents and operands, and accumulate in
  # float32 (rounding the operands alone would round the gradient itself instead)
  r = np.random.default_rng(30)
  x, y, c = (jnp.asarray(r.normal(size=s), jnp.float32) for s in ((4, 5), (5, 3), (4, 3)))
  bf = lambda z: z.astype(jnp.bfloat16).astype(jnp.float32)
  with emulate_matmul_precision("bfloat16"):
    m = matmul_for("default")
    gx, gy = _matmul_gradients(m, x, y, c)
    assert _matmul_jacobian(m, x, y).shape == (4, 3, 4, 5)  # forward mode works too
  np.testing.assert_array_equal(gx, np.asarray(bf(c) @ bf(y).T))
  np.testing.assert_array_equal(gy, np.asarray(bf(x).T @ bf(c)))
  # a user's jit traced outside the context is not reused inside it (nor the reverse)
  q, k, v, beta, _, _ = make_inputs(1, 16, 1, 8, 8, seed=31, with_state=False)
  user = jax.jit(lambda q: associative_memory(q, k, v, beta, rule="delta", mode="chunked", precision="default"))
  outside = np.asarray(user(q))
  with emulate_matmul_precision("bfloat16"):
    inside = np.asarray(user(q))
  assert np.abs(inside - outside).max() > 1e-4
  np.testing.assert_array_equal(np.asarray(user(q)), outside)
  with emulate_matmul_precision("bfloat16"):
    assert float(matmul_for("default")(a, one)[0, 0]) == 1.0
    assert float(matmul_for("high")(a, one)[0, 0]) == float(a[0, 0])  # bf16×3 keeps it
    assert float(matmul_for("highest")(a, one)[0, 0]) == float(a[0, 0])
  with emulate_matmul_precision("tensorfloat32"):
    assert float(matmul_for("default")(a, one)[0, 0]) == float(a[0, 0])
  assert float(matmul_for("default")(a, one)[0, 0]) == float(a[0, 0])  # no emulation: CPU float32
  with pytest.raises(ValueError, match=r"`precision` must be one of"):
    matmul_for("fp8")


# ----------------------------------------------------------------------------------------
# long sequences, padding, parallel_head


def test_parallel_decay_keeps_float32_accuracy_on_long_sequences():
  # T = 4096, γ ∈ (0.3, 0.7): exp(g_t − g_i) of two cumulative sums had 9.4% relative error
  T = 4096
  q, k, v, beta, _, _ = make_inputs(1, T, 1, 8, 4, seed=20, with_state=False)
  decay = jnp.asarray(np.random.default_rng(21).uniform(0.3, 0.7, (1, T, 1)), jnp.float32)
  ref_o, ref_S = numpy_assoc(q, k, v, beta, decay, None, "decay")
  o, S = associative_memory(q, k, v, beta, rule="decay", mode="parallel", decay=decay, return_state=True)
  rel = np.abs(np.asarray(o) - ref_o).max() / np.abs(ref_o).max()
  assert rel < 1e-5, rel
  np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rule,tol", [
    # delta: the one-chunk UT form's rounding grows with T (no error feedback, see the module
    # docstring; measured 5.7e-5 with these inputs): bound 2e-4, chunked 2e-5.
    ("delta", {"parallel": 2e-4, "chunked": 2e-5}),
    # gated_delta, γ ∈ (0.3, 0.7): the decays bound the accumulation, and with segment sums
    # both forms are at float32 level (measured 2.8e-7; 1.0e-4 parallel and 4.6e-6 chunked
    # with exp(g_t − g_i) of cumulative sums).
    ("gated_delta", {"parallel": 3e-6, "chunked": 3e-6}),
])
def test_parallel_delta_rules_at_T_2048(rule, tol):
  T = 2048
  q, k, v, beta, _, _ = make_inputs(1, T, 1, 16, 8, seed=22, with_state=False)
  decay = jnp.asarray(np.random.default_rng(23).uniform(0.3, 0.7, (1, T, 1)), jnp.float32)
  d = decay if rule == "gated_delta" else None
  ref_o, ref_S = numpy_assoc(q, k, v, beta, d, None, rule)
  for mode in ("parallel", "chunked"):
    o, S = associative_memory(q, k, v, beta, rule=rule, mode=mode, decay=d, return_state=True)
    assert np.abs(np.asarray(o) - ref_o).max() < tol[mode], (mode, np.abs(np.asarray(o) - ref_o).max())
    assert np.abs(np.asarray(S) - ref_S).max() < tol[mode], mode


def _max_time_extent(jaxpr, dims):
  """Largest size of any intermediate's axis 1 (time) among arrays with the given trailing dims."""
  shapes = [getattr(var.aval, "shape", ()) for eqn in jaxpr_eqns(jaxpr) for var in eqn.outvars]
  return max(s[1] for s in shapes if len(s) >= 2 and tuple(s[-len(dims):]) == dims)


@functools.partial(jax.jit, static_argnames=("rule",))
def _chunked_64_in_groups_of_16(q, k, v, beta, logg, S0, *, rule):
  return assoc.chunked_scan(q, k, v, beta, logg, S0, rule=rule, chunk_size=64, group=16)


@pytest.mark.parametrize("B,rule", [(1, "delta"), (2, "delta"), (1, "gated_delta"), (2, "oja")])
def test_chunked_pads_to_the_next_chunk_only(B, rule):
  # T = 2100, chunk 64: 33 chunks = 2 groups of 16 and a tail group of 1. Padding to whole
  # groups padded this to 48 chunks (3072). gated_delta with some decays exactly 0.
  T, H, D = 2100, 4, 8
  q, k, v, beta, decay, _ = make_inputs(B, T, H, D, D, seed=24, with_state=False)
  decay = np.where(np.arange(T)[None, :, None] % 97 == 5, 0.0, np.asarray(decay)).astype(np.float32)
  d = decay if rule in DECAYS else None
  args = (q, k, v, beta, None if d is None else assoc.log_of_decay(d), jnp.zeros((B, H, D, D)))
  jaxpr = jax.make_jaxpr(functools.partial(_chunked_64_in_groups_of_16, rule=rule))(*args)
  assert _max_time_extent(jaxpr, (H, D)) == 33 * 64
  o, S = _chunked_64_in_groups_of_16(*args, rule=rule)
  ref_o, ref_S = numpy_assoc(q, k, v, beta, d, None, rule)
  np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5)


@functools.partial(jax.jit, static_argnames=("rule",))
def _parallel_and_recurrent_head(q, k, v, beta, logg, S0, *, rule):
  return (assoc.parallel_head(q, k, v, beta, logg, S0, rule=rule),
          assoc.recurrent_head(q, k, v, beta, logg, S0, rule=rule))


@pytest.mark.parametrize("rule", ["hebb", "delta", "decay", "gated_delta"])
def test_parallel_head_computes_its_rule(rule):
  # one head of the grid's near-zero-decay row 14 (T = 37), from its initial state
  row, head = 14, 0
  q, k, v, beta, decay, S0 = (np.asarray(x) for x in grid_inputs())
  ref_o, ref_S = grid_reference(rule)
  lg = jnp.asarray(np.log(decay[row, :, head])) if rule in DECAYS else None
  (o, S), (o_r, S_r) = _parallel_and_recurrent_head(
      q[row, :, head], k[row, :, head], v[row, :, head], beta[row, :, head], lg, S0[row, head], rule=rule)
  for form, got_o, got_S in (("parallel", o, S), ("recurrent", o_r, S_r)):
    np.testing.assert_allclose(got_o, ref_o[row, :, head], rtol=1e-4, atol=2e-5, err_msg=form)
    np.testing.assert_allclose(got_S, ref_S[row, head], rtol=1e-4, atol=2e-5, err_msg=form)


def test_parallel_head_has_no_oja_form_and_rejects_unknown_rules():
  x = jnp.ones((4, 3))
  with pytest.raises(ValueError, match=r"rule='oja' has no parallel form"):
    assoc.parallel_head(x, x, x, jnp.ones(4), None, jnp.zeros((3, 3)), rule="oja")
  with pytest.raises(ValueError, match=r"`rule` must be one of"):
    assoc.parallel_head(x, x, x, jnp.ones(4), None, jnp.zeros((3, 3)), rule="anti_hebb")


_segsum = jax.jit(segsum, static_argnames=("block",))


@jax.jit
def _segsum_block_2_gradient(x):
  return jax.grad(lambda x: jnp.sum(jnp.exp(segsum(x, block=2)) * jnp.arange(64.0).reshape(8, 8)))(x)


def test_segsum_matches_direct_sums_and_is_exact_at_minus_inf():
  r = np.random.default_rng(26)
  for T, block in ((1, None), (37, None), (37, 4), (100, 7), (64, 64)):
    x = r.uniform(-2, 0, (2, T))
    ref = np.full((2, T, T), -np.inf)
    for t in range(T):
      for i in range(t + 1):
        ref[:, t, i] = x[:, i + 1:t + 1].sum(-1)
    got = np.asarray(_segsum(jnp.asarray(x, jnp.float32), block=block))
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got), fin)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-5)
  x = jnp.asarray(np.where(np.arange(8) == 3, -np.inf, 0.0), jnp.float32)
  s = np.asarray(_segsum(x, block=2))
  assert np.isneginf(s[4:, :3]).all() and (s[4:, 3:] == 0).sum() == 14  # i ≥ 3, i ≤ t
  g = np.asarray(_segsum_block_2_gradient(x))
  assert np.isfinite(g).all() and float(g[3]) == 0.0


# ----------------------------------------------------------------------------------------
# dtypes


@functools.partial(jax.jit, static_argnames=("dtype",))
def _gated_delta_steps(q, k, v, beta, decay, *, dtype):
  def body(S, x):
    qt, kt, vt, bt, gt = x
    return step(S, qt, kt, vt, bt, gt, rule="gated_delta")
  B, _, H, Dk = q.shape
  xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, beta, decay))
  return jax.lax.scan(body, init(B, H, Dk, v.shape[-1], dtype), xs)  # raises if the carry dtype changes


def test_step_keeps_a_bfloat16_carry_and_accumulates_in_float32():
  q, k, v, beta, decay, _ = make_inputs(1, 24, 2, 8, 4, seed=27, with_state=False)
  S16, o16 = _gated_delta_steps(q, k, v, beta, decay, dtype=jnp.bfloat16)
  S32, o32 = _gated_delta_steps(q, k, v, beta, decay, dtype=jnp.float32)
  assert S16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(S16, np.float32), S32, atol=3e-2)
  np.testing.assert_allclose(np.asarray(o16, np.float32), o32, atol=5e-2)


def test_sequence_form_returns_the_state_in_the_initial_states_dtype():
  # the dtypes of the traced programs (jax.eval_shape: nothing is compiled)
  q, k, v, beta, decay, S0 = make_inputs(1, 9, 2, 4, 3, seed=28)
  for mode in ("recurrent", "chunked", "auto"):
    f = lambda S0, mode=mode: associative_memory(q, k, v, beta, rule="delta", mode=mode, initial_state=S0,
                                                 return_state=True)
    assert jax.eval_shape(f, S0.astype(jnp.bfloat16))[1].dtype == jnp.bfloat16, mode
    assert jax.eval_shape(f, None)[1].dtype == jnp.float32, mode


# ----------------------------------------------------------------------------------------
# auto differentiates the chunked form


def _scan_lengths(jaxpr):
  return [e.params["length"] for e in jaxpr_eqns(jaxpr) if e.primitive.name == "scan"]


def test_auto_gradient_is_the_chunked_forms_not_the_recurrent_ones():
  # the grid, T = 37 with chunk 4: the recurrent form scans 37 steps, the chunked one 10
  # chunks. The gradients of the two forms agree to rounding, so compare the programs: no
  # per-token scan may appear in auto's gradient, and its gradients w.r.t. every input equal
  # mode="chunked"'s bit for bit (auto's JVP is the chunked form's: the same arithmetic),
  # for gated_delta with decay= and with log_decay=.
  q, k, v, beta, _, _ = grid_inputs()
  T = q.shape[1]
  loss = lambda mode: lambda q, k, v, b: jnp.sum(associative_memory(
      q, k, v, b, rule="delta", mode=mode, chunk_size=GRID_CHUNK) ** 2)
  grad = lambda mode: jax.grad(loss(mode), argnums=(0, 1, 2, 3))
  assert T in _scan_lengths(jax.make_jaxpr(loss("recurrent"))(q, k, v, beta))
  assert T not in _scan_lengths(jax.make_jaxpr(grad("auto"))(q, k, v, beta))
  assert T not in _scan_lengths(jax.make_jaxpr(jax.jacfwd(loss("auto")))(q, k, v, beta))
  if jax.default_backend() == "cpu":  # the primal alone runs the recurrent form
    assert T in _scan_lengths(jax.make_jaxpr(loss("auto"))(q, k, v, beta))
  for as_log in decay_arguments("gated_delta"):
    g_auto = grid_results("gated_delta", "auto", as_log)[2]
    g_chunked = grid_results("gated_delta", "chunked", as_log)[2]
    for name, a, b in zip(NAMES, g_auto, g_chunked, strict=True):
      np.testing.assert_array_equal(a, b, err_msg=f"d/d{name} log={as_log}")
