"""Numerics of the associative-memory kernel that values-only tests at friendly inputs miss.

Decays of exactly 0 (and 1e-30, 1e-6, 1) and write strengths 0 / 1 / 2 under ``jit``, in
every rule and mode, values and gradients, against an independent reference; the
stability guard's edge cases; matmul precision (every matmul carries it, and emulated
bf16 / TF32 platforms cost what the docstring says); long sequences in the parallel form;
padding; dtypes of carried states; the ``auto`` mode's derivative form.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxmem.kernels import assoc
from jaxmem.kernels.assoc import associative_memory, init, step
from jaxmem.kernels.precision import dot_general_precisions, emulate_matmul_precision, jaxpr_eqns
from jaxmem.kernels.segsum import segsum
from tests.kernels.test_assoc import DECAYS, RULES, make_inputs, modes_for, numpy_assoc, unit

GAMMAS = (0.0, 1e-30, 1e-6, 1.0)
BETAS = (0.0, 1.0, 2.0)


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
    else:  # gated_delta
      S = g * S + b * (vt[..., None] - g * Sk) * kt[..., None, :]
    return S, ein("bhvk,bhk->bhv", S, qt)

  S, o = jax.lax.scan(body, S, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, beta, decay)))
  return jnp.moveaxis(o, 0, 1), S


def grid_inputs(T=16, H=2, Dk=5, Dv=3, seed=0):
  """Rows 0..11: one per (γ, β) of the grid, constant over tokens; rows 12, 13: per-token γ
  drawn from the grid and from (0.6, 1], per-token β from the grid. Unit keys and values."""
  combos = [(g, b) for g in GAMMAS for b in BETAS]
  n = len(combos)
  q, k, v, _, decay, S0 = make_inputs(n + 2, T, H, Dk, Dv, seed=seed)
  r = np.random.default_rng(seed)
  d = np.empty((n + 2, T, H))
  b = np.empty((n + 2, T, H))
  d[:n] = np.array([g for g, _ in combos])[:, None, None]
  b[:n] = np.array([x for _, x in combos])[:, None, None]
  d[n:] = np.where(r.random((2, T, H)) < 0.5, r.choice(GAMMAS, (2, T, H)), np.asarray(decay)[n:])
  b[n:] = r.choice(BETAS, (2, T, H))
  return q, k, v, jnp.asarray(b, jnp.float32), jnp.asarray(d, jnp.float32), S0


def _kernel(rule, mode, as_log, chunk=4):
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


CASES = [(r, m) for r in RULES for m in modes_for(r)]


@pytest.mark.parametrize("rule,mode", CASES)
def test_decay_and_beta_grid_finite_and_exact_under_jit(rule, mode):
  # γ ∈ {0, 1e-30, 1e-6, 1}, β ∈ {0, 1, 2}, traced (so no eager check can help), values
  # against the float64 numpy loop and gradients against a plain loop in γ (not log γ),
  # whose derivative at γ = 0 is the true one; decay= for every decay rule, and for
  # gated_delta also log_decay = log γ (−inf at γ = 0).
  xs = grid_inputs()
  q, k, v, beta, decay, S0 = xs
  d = decay if rule in DECAYS else None
  ref_o, ref_S = numpy_assoc(q, k, v, beta, d, S0, rule)
  r = np.random.default_rng(3)
  cot = tuple(jnp.asarray(r.normal(size=x.shape), jnp.float32) for x in (ref_o, ref_S))
  argnums = (0, 1, 2, 3, 4, 5) if rule in DECAYS else (0, 1, 2, 3, 5)
  ref = lambda q, k, v, beta, decay, S0: loop_reference(
      q, k, v, beta, decay if rule in DECAYS else None, S0, rule)
  with jax.enable_x64(True):
    xs64 = tuple(jnp.asarray(np.asarray(x), jnp.float64) for x in xs)
    cot64 = tuple(jnp.asarray(np.asarray(c), jnp.float64) for c in cot)
    ref_g = [np.asarray(g) for g in jax.jit(jax.grad(_loss(ref, cot64), argnums=argnums))(*xs64)]
  for as_log in ([False, True] if rule == "gated_delta" else [False]):
    fn = _kernel(rule, mode, as_log)
    args = xs[:4] + (jnp.log(decay),) + xs[5:] if as_log else xs  # log 0 = −inf
    o, S = jax.jit(fn)(*args)
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(S)).all(), (as_log,)
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=3e-5, err_msg=f"o log={as_log}")
    np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=3e-5, err_msg=f"S log={as_log}")
    grads = jax.jit(jax.grad(_loss(fn, cot), argnums=argnums))(*args)
    names = ["q", "k", "v", "beta", "decay", "S0"]
    for i, g, gr in zip(argnums, grads, ref_g, strict=True):
      g = np.asarray(g)
      assert np.isfinite(g).all(), f"d/d{names[i]} not finite (log={as_log})"
      if names[i] == "decay" and as_log:
        gr = gr * np.asarray(decay, np.float64)  # d/d log γ = γ · d/dγ (0 at γ = 0)
      np.testing.assert_allclose(g, gr, rtol=2e-3, atol=1e-4, err_msg=f"d/d{names[i]} log={as_log}")


@pytest.mark.parametrize("rule", ["decay"])  # gated_delta: in the grid test (log_decay = log γ)
@pytest.mark.parametrize("mode", ["recurrent", "parallel", "chunked", "auto"])
def test_log_decay_minus_inf_has_finite_log_space_gradients(rule, mode):
  # γ = 0 passed as log γ = −inf: d/d(log γ) = γ · (...) = 0 there, finite everywhere.
  q, k, v, beta, decay, S0 = grid_inputs(seed=4)
  logd = jnp.log(decay)
  assert np.isneginf(np.asarray(logd)).any()
  f = lambda q, k, v, beta, logd, S0: associative_memory(
      q, k, v, beta, rule=rule, mode=mode, chunk_size=4, log_decay=logd, initial_state=S0,
      return_state=True)
  cot = (jnp.ones((14, 16, 2, 3)), jnp.ones((14, 2, 3, 5)))
  g = jax.jit(jax.grad(_loss(f, cot), argnums=(0, 1, 2, 3, 4, 5)))(q, k, v, beta, logd, S0)
  for x in g:
    assert np.isfinite(np.asarray(x)).all()
  zero = np.isneginf(np.asarray(logd))
  np.testing.assert_array_equal(np.asarray(g[4])[zero], 0.0)


@pytest.mark.parametrize("rule", RULES)
def test_decays_near_zero_match_the_numpy_loop(rule):
  # decays in (0, 1] with many values near 0 (1e-6, 1e-3) in every mode, D_k = 12, T = 37
  q, k, v, beta, _, S0 = make_inputs(2, 37, 3, 12, 5, seed=5)
  r = np.random.default_rng(6)
  d = r.choice([1e-6, 1e-3, 0.05, 0.5, 1.0], (2, 37, 3)) * r.uniform(0.5, 1.0, (2, 37, 3))
  decay = jnp.asarray(np.minimum(d, 1.0), jnp.float32)
  ref_o, ref_S = numpy_assoc(q, k, v, beta, decay if rule in DECAYS else None, S0, rule)
  for mode in modes_for(rule):
    o, S = associative_memory(q, k, v, beta, rule=rule, mode=mode, chunk_size=16,
                              decay=decay if rule in DECAYS else None, initial_state=S0, return_state=True)
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5, err_msg=mode)
    np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5, err_msg=mode)


@pytest.mark.parametrize("rule,mode", [(r, m) for r, m in CASES if m in ("recurrent", "parallel")])
def test_finite_differences_in_every_mode_float64(rule, mode):
  # chunked: test_assoc.py::test_gradients_match_finite_differences_float64; auto
  # differentiates the chunked form (test_auto_gradient_is_the_chunked_forms...)
  # decays include 1e-3 so the log-space paths are exercised near 0
  with jax.enable_x64(True):
    q, k, v, beta, decay, S0 = make_inputs(1, 7, 2, 3, 2, seed=13, dtype=np.float64)
    beta = 0.5 * beta
    decay = decay.at[0, 2].set(1e-3)
    chunk = 3

    def f(q, k, v, beta, S0, decay=None):
      return associative_memory(q, k, v, beta, rule=rule, mode=mode, chunk_size=chunk, decay=decay,
                                initial_state=S0, return_state=True)

    if rule in DECAYS:
      check_grads(lambda q, k, v, b, S0, d: f(q, k, v, b, S0, d), (q, k, v, beta, S0, decay),
                  order=1, modes=("rev",), eps=1e-6)
    else:
      check_grads(f, (q, k, v, beta, S0), order=1, modes=("rev",), eps=1e-5)


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
  d16 = jnp.zeros((1, 5, 2), jnp.float16)
  grad = jax.grad(lambda d: jnp.sum(associative_memory(q, k, v, beta, rule="decay", decay=d)))(d16)
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
def test_emulated_reduced_precision_platforms(rule, mode):
  # the full rule × form table at T = 2048: `jaxmem bench precision`
  q, k, v, beta, decay, S0 = make_inputs(1, 128, 2, 16, 16, seed=19)
  d = decay if rule in DECAYS else None
  ref_o, _ = numpy_assoc(q, k, v, beta, d, S0, rule)
  run = lambda precision: np.asarray(associative_memory(
      q, k, v, beta, rule=rule, mode=mode, chunk_size=32, decay=d, initial_state=S0, precision=precision))
  exact = run("highest")
  for platform in ("tensorfloat32", "bfloat16"):
    with emulate_matmul_precision(platform):
      # the kernel's default ("highest") ignores the platform default: bit-for-bit float32
      np.testing.assert_array_equal(run("highest"), exact)
      fast = run("default")
    err = np.abs(fast - ref_o).max()
    assert err < EMULATED_TOL[platform], (platform, err)
    assert err > 10 * np.abs(exact - ref_o).max(), (platform, err)  # the emulation does round
  assert np.abs(exact - ref_o).max() < EMULATED_TOL["highest"]


def test_emulation_rounds_operands_like_the_platform():
  a = jnp.asarray([[1.0 + 2.0 ** -9]], jnp.float32)  # representable in TF32, not in bf16
  one = jnp.ones((1, 1), jnp.float32)
  from jaxmem.kernels.precision import matmul_for
  # gradients: the transposed matmuls see rounded cotangents and operands, and accumulate in
  # float32 (rounding the operands alone would round the gradient itself instead)
  r = np.random.default_rng(30)
  x, y, c = (jnp.asarray(r.normal(size=s), jnp.float32) for s in ((4, 5), (5, 3), (4, 3)))
  bf = lambda z: z.astype(jnp.bfloat16).astype(jnp.float32)
  with emulate_matmul_precision("bfloat16"):
    m = matmul_for("default")
    gx, gy = jax.grad(lambda x, y: jnp.sum(m(x, y) * c), argnums=(0, 1))(x, y)
    assert jax.jacfwd(lambda x: m(x, y))(x).shape == (4, 3, 4, 5)  # forward mode works too
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


@pytest.mark.parametrize("B,rule", [(1, "delta"), (2, "delta"), (1, "gated_delta"), (2, "oja")])
def test_chunked_pads_to_the_next_chunk_only(B, rule):
  # T = 2100, chunk 64: 33 chunks = 2 groups of 16 and a tail group of 1. Padding to whole
  # groups padded this to 48 chunks (3072). gated_delta with some decays exactly 0.
  T, H, D = 2100, 4, 8
  q, k, v, beta, decay, _ = make_inputs(B, T, H, D, D, seed=24, with_state=False)
  decay = jnp.where(jnp.arange(T)[None, :, None] % 97 == 5, 0.0, decay)
  d = decay if rule in DECAYS else None
  f = lambda q, k, v: assoc.chunked(q, k, v, beta, None if d is None else assoc.log_of_decay(d),
                                    jnp.zeros((B, H, D, D)), rule=rule, chunk_size=64, group=16)
  jaxpr = jax.make_jaxpr(f)(q, k, v)
  assert _max_time_extent(jaxpr, (H, D)) == 33 * 64
  o, S = jax.jit(f)(q, k, v)
  ref_o, ref_S = numpy_assoc(q, k, v, beta, d, None, rule)
  np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("rule", ["hebb", "delta", "decay", "gated_delta"])
def test_parallel_head_computes_its_rule(rule):
  q, k, v, beta, decay, S0 = make_inputs(1, 19, 1, 5, 3, seed=25)
  d = decay if rule in DECAYS else None
  ref_o, ref_S = numpy_assoc(q, k, v, beta, d, S0, rule)
  lg = None if d is None else jnp.log(d[0, :, 0])
  o, S = assoc.parallel_head(q[0, :, 0], k[0, :, 0], v[0, :, 0], beta[0, :, 0], lg, S0[0, 0], rule=rule)
  np.testing.assert_allclose(o, ref_o[0, :, 0], rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(S, ref_S[0, 0], rtol=1e-4, atol=2e-5)
  o, S = assoc.recurrent_head(q[0, :, 0], k[0, :, 0], v[0, :, 0], beta[0, :, 0], lg, S0[0, 0], rule=rule)
  np.testing.assert_allclose(o, ref_o[0, :, 0], rtol=1e-4, atol=2e-5)


def test_parallel_head_has_no_oja_form_and_rejects_unknown_rules():
  x = jnp.ones((4, 3))
  with pytest.raises(ValueError, match=r"rule='oja' has no parallel form"):
    assoc.parallel_head(x, x, x, jnp.ones(4), None, jnp.zeros((3, 3)), rule="oja")
  with pytest.raises(ValueError, match=r"`rule` must be one of"):
    assoc.parallel_head(x, x, x, jnp.ones(4), None, jnp.zeros((3, 3)), rule="anti_hebb")


def test_segsum_matches_direct_sums_and_is_exact_at_minus_inf():
  r = np.random.default_rng(26)
  for T, block in ((1, None), (37, None), (37, 4), (100, 7), (64, 64)):
    x = r.uniform(-2, 0, (2, T))
    ref = np.full((2, T, T), -np.inf)
    for t in range(T):
      for i in range(t + 1):
        ref[:, t, i] = x[:, i + 1:t + 1].sum(-1)
    got = np.asarray(jax.jit(functools.partial(segsum, block=block))(jnp.asarray(x, jnp.float32)))
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got), fin)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-5)
  x = jnp.zeros(8).at[3].set(-jnp.inf)
  s = segsum(x, block=2)
  assert np.isneginf(np.asarray(s)[4:, :3]).all() and (np.asarray(s)[4:, 3:] == 0).sum() == 14  # i ≥ 3, i ≤ t
  g = jax.grad(lambda x: jnp.sum(jnp.exp(segsum(x, block=2)) * jnp.arange(64.0).reshape(8, 8)))(x)
  assert np.isfinite(np.asarray(g)).all() and float(g[3]) == 0.0


# ----------------------------------------------------------------------------------------
# dtypes


def test_step_keeps_a_bfloat16_carry_and_accumulates_in_float32():
  B, T, H, Dk, Dv = 1, 24, 2, 8, 4
  q, k, v, beta, decay, _ = make_inputs(B, T, H, Dk, Dv, seed=27, with_state=False)
  xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, beta, decay))

  def run(dtype):
    def body(S, x):
      qt, kt, vt, bt, gt = x
      S, o = step(S, qt, kt, vt, bt, gt, rule="gated_delta")
      return S, o
    return jax.lax.scan(body, init(B, H, Dk, Dv, dtype), xs)  # raises if the carry dtype changes

  S16, o16 = run(jnp.bfloat16)
  S32, o32 = run(jnp.float32)
  assert S16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(S16, np.float32), S32, atol=3e-2)
  np.testing.assert_allclose(np.asarray(o16, np.float32), o32, atol=5e-2)


def test_sequence_form_returns_the_state_in_the_initial_states_dtype():
  q, k, v, beta, decay, S0 = make_inputs(1, 9, 2, 4, 3, seed=28)
  for mode in ("recurrent", "chunked", "auto"):
    _, S = associative_memory(q, k, v, beta, rule="delta", mode=mode, initial_state=S0.astype(jnp.bfloat16),
                              return_state=True)
    assert S.dtype == jnp.bfloat16, mode
    _, S = associative_memory(q, k, v, beta, rule="delta", mode=mode, return_state=True)
    assert S.dtype == jnp.float32, mode


# ----------------------------------------------------------------------------------------
# auto differentiates the chunked form


def _scan_lengths(jaxpr):
  return [e.params["length"] for e in jaxpr_eqns(jaxpr) if e.primitive.name == "scan"]


def test_auto_gradient_is_the_chunked_forms_not_the_recurrent_ones():
  # T = 21, chunk 8: the recurrent form scans 21 steps, the chunked one 3 chunks. The
  # gradients of the two forms agree to rounding, so compare the programs: no per-token
  # scan may appear in auto's gradient, and its values equal mode="chunked" bit for bit.
  T = 21
  q, k, v, beta, _, _ = make_inputs(1, T, 2, 6, 3, seed=9, with_state=False)
  loss = lambda mode: lambda q, k, v, b: jnp.sum(associative_memory(
      q, k, v, b, rule="delta", mode=mode, chunk_size=8) ** 2)
  grad = lambda mode: jax.grad(loss(mode), argnums=(0, 1, 2, 3))
  assert T in _scan_lengths(jax.make_jaxpr(loss("recurrent"))(q, k, v, beta))
  assert T not in _scan_lengths(jax.make_jaxpr(grad("auto"))(q, k, v, beta))
  assert T not in _scan_lengths(jax.make_jaxpr(jax.jacfwd(loss("auto")))(q, k, v, beta))
  if jax.default_backend() == "cpu":  # the primal alone runs the recurrent form
    assert T in _scan_lengths(jax.make_jaxpr(loss("auto"))(q, k, v, beta))
  g_auto = jax.jit(grad("auto"))(q, k, v, beta)
  g_chunked = jax.jit(grad("chunked"))(q, k, v, beta)
  for a, b in zip(g_auto, g_chunked, strict=True):
    np.testing.assert_array_equal(a, b)
