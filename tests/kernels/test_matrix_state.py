"""matrix_state (UniMatrix Core / Discovery) vs an independent float64 numpy loop of the equations.

``S_t = ρ_t S_{t−1} + (1 − ρ_t) U_t``, ``U_t = w_o k vᵀ + w_d Diag(d) + w_s ½(k vᵀ + v kᵀ)``,
optional ``S_t ← S_t / max(1, σ_max(S_t))``, read ``o_t = S_t q_t``. Both forms (recurrent,
chunked) are checked on values, final states and gradients, with odd lengths and state sizes
(T = 1, T not a multiple of the chunk); ``auto`` runs the fast forward and the chunked derivatives
(its custom_jvp); Core equals the associative memory's decay rule; the inference step equals the
sequence form; spectral normalisation against exact σ_max; ρ at 0 and 1; matmul precisions; dtypes;
argument checks. Gradients come from one module-level jitted VJP per configuration, and most tests
share the shape SMALL, so each configuration compiles once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.arrays import device_array
from jaxmem.kernels import matrix_state as ms
from jaxmem.kernels.assoc import associative_memory, auto_forward_mode
from jaxmem.kernels.matrix_state import init, matrix_state, max_singular_value, spectral_normalize, step
from jaxmem.kernels.precision import dot_general_precisions
from tests.kernels.packed import runs

VARIANTS = ("core", "mix_H", "mix_BTH")


def numpy_matrix_state(q, k, v, rho, d, mix, S0, spectral_norm=False):
  """Per-(batch, head, token) loop in float64, straight from the equations.

  ``rho`` is ``[B, T, H]`` (per head) or ``[B, T, H, S]`` (per channel: column ``j`` of the state
  is kept with ``ρ_j``, ``S_t[:, j] = ρ_tj S_{t−1}[:, j] + (1 − ρ_tj) U_t[:, j]``).
  Returns ``(o [B, T, H, S], S_T [B, H, S, S], sigma_pre [B, T, H])``; ``sigma_pre`` is
  ``σ_max`` of each state before spectral normalisation (exact: ``np.linalg.norm(·, 2)``).
  """
  q, k, v, rho = (np.asarray(x, np.float64) for x in (q, k, v, rho))
  B, T, H, S = q.shape
  d = np.zeros((B, T, H, S)) if d is None else np.asarray(d, np.float64)
  w = np.array([1.0, 0.0, 0.0]) if mix is None else np.asarray(mix, np.float64)
  w = np.broadcast_to(w, (B, T, H, 3))
  out, final, sigma_pre = np.zeros((B, T, H, S)), np.zeros((B, H, S, S)), np.zeros((B, T, H))
  for b in range(B):
    for h in range(H):
      St = np.zeros((S, S)) if S0 is None else np.asarray(S0[b, h], np.float64).copy()
      for t in range(T):
        kt, vt, (wo, wd, ws) = k[b, t, h], v[b, t, h], w[b, t, h]
        U = wo * np.outer(kt, vt) + wd * np.diag(d[b, t, h]) + ws * 0.5 * (np.outer(kt, vt) + np.outer(vt, kt))
        if rho.ndim == 3:
          St = rho[b, t, h] * St + (1.0 - rho[b, t, h]) * U
        else:
          for j in range(S):  # column by column
            St[:, j] = rho[b, t, h, j] * St[:, j] + (1.0 - rho[b, t, h, j]) * U[:, j]
        sigma_pre[b, t, h] = np.linalg.norm(St, 2)
        if spectral_norm:
          St = St / max(1.0, sigma_pre[b, t, h])
        out[b, t, h] = St @ q[b, t, h]  # read after write
      final[b, h] = St
  return out, final, sigma_pre


def make_inputs(B, T, H, S, variant="mix_BTH", seed=0, dtype=np.float32, scale=0.7):
  """q, k, v, d ~ N(0, scale²); log ρ = log σ(z + 1); softmax mixtures; S_0 ~ N(0, 0.3²)."""
  r = np.random.default_rng(seed)
  q, k, v, d = (scale * r.normal(size=(B, T, H, S)) for _ in range(4))
  log_rho = np.log(1.0 / (1.0 + np.exp(-(r.normal(size=(B, T, H)) + 1.0))))
  mix_shape = {"core": None, "mix_H": (H, 3), "mix_BTH": (B, T, H, 3)}[variant]
  mix = None
  if mix_shape is not None:
    z = r.normal(size=mix_shape)
    mix = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
  d = None if mix is None else d
  S0 = 0.3 * r.normal(size=(B, H, S, S))
  cast = lambda x: None if x is None else device_array(x, dtype)
  return tuple(cast(x) for x in (q, k, v, log_rho, d, mix, S0))


def call(mode, q, k, v, log_rho, d, mix, S0, chunk=4, **kw):
  return matrix_state(q, k, v, log_rho=log_rho, d=d, mix=mix, mode=mode, chunk_size=chunk,
                      initial_state=S0, return_state=True, **kw)


@functools.partial(jax.jit, static_argnames=("mode", "spectral_norm", "wrt"))
def functional_grads(q, k, v, gate, d, mix, S0, c_o, c_S, *, mode, spectral_norm=False, wrt=tuple(range(7))):
  """Gradients of ``⟨c_o, o⟩ + ⟨c_S, S_T⟩`` w.r.t. the arguments numbered ``wrt`` (0 = q, ..., 6 = S0).

  ``gate`` is ``{"log_rho": ...}`` or ``{"rho": ...}``; chunk size 4."""
  def f(q, k, v, gate, d, mix, S0):
    o, S_T = matrix_state(q, k, v, **gate, d=d, mix=mix, mode=mode, chunk_size=4, initial_state=S0,
                          return_state=True, spectral_norm=spectral_norm)
    return jnp.sum(c_o * o) + jnp.sum(c_S * S_T)
  return jax.grad(f, argnums=wrt)(q, k, v, gate, d, mix, S0)


def log_rho_grads(mode, q, k, v, log_rho, d, mix, S0, c_o, c_S, wrt=tuple(range(7)), **kw):
  """:func:`functional_grads` with log ρ: a gradient in each place of (q, k, v, log ρ, d, mix, S0)
  numbered in ``wrt``, None elsewhere."""
  got = functional_grads(q, k, v, {"log_rho": log_rho}, d, mix, S0, c_o, c_S, mode=mode, wrt=wrt, **kw)
  grads = [None] * 7
  for i, g in zip(wrt, got, strict=True):
    grads[i] = g["log_rho"] if i == 3 else g
  return tuple(grads)


# ----------------------------------------------------------------------------------------
# values

SMALL = (1, 5, 2, 3)  # B, T, H, S shared by the smaller tests (so they share compilations)


@pytest.mark.parametrize("T,S,chunk,variant", [(1, 3, 4, "mix_H"), (7, 5, 4, "core"), (19, 5, 8, "mix_BTH")])
def test_recurrent_and_chunked_match_numpy_loop_with_initial_state(T, S, chunk, variant):
  q, k, v, log_rho, d, mix, S0 = make_inputs(2, T, 3, S, variant, seed=T + S)
  o_ref, S_ref, _ = numpy_matrix_state(q, k, v, np.exp(np.asarray(log_rho, np.float64)), d, mix, S0)
  for mode in ("recurrent", "chunked"):
    o, S_T = call(mode, q, k, v, log_rho, d, mix, S0, chunk=chunk)
    assert o.shape == (2, T, 3, S) and S_T.shape == (2, 3, S, S)
    np.testing.assert_allclose(o, o_ref, atol=2e-5, err_msg=f"{variant} {mode} o")
    np.testing.assert_allclose(S_T, S_ref, atol=2e-5, err_msg=f"{variant} {mode} S_T")


def test_auto_runs_the_fast_forward_and_the_chunked_derivatives_and_rho_equals_log_rho():
  q, k, v, log_rho, d, mix, S0 = make_inputs(*SMALL, seed=3)
  fwd = auto_forward_mode()   # recurrent on CPU
  o_f, S_f = call(fwd, q, k, v, log_rho, d, mix, S0)
  o_a, S_a = call("auto", q, k, v, log_rho, d, mix, S0)
  # bitwise by construction: auto's forward is the forward form's code, unchanged
  np.testing.assert_array_equal(o_a, o_f)
  np.testing.assert_array_equal(S_a, S_f)
  # derivatives: exactly the chunked form's (the custom_jvp), not the forward form's; the gradients
  # of ⟨w, o⟩ w.r.t. (q, k)
  w = np.random.default_rng(9).normal(size=o_a.shape).astype(np.float32)
  zero_S = np.zeros(S_a.shape, np.float32)
  grads = {m: log_rho_grads(m, q, k, v, log_rho, d, mix, S0, w, zero_S, wrt=(0, 1))[:2]
           for m in ("auto", "chunked")}
  for a, c in zip(grads["auto"], grads["chunked"], strict=True):
    np.testing.assert_array_equal(a, c)
  rho = np.exp(np.asarray(log_rho))
  for mode in ("recurrent", "chunked"):
    o_r, S_r = matrix_state(q, k, v, rho, d=d, mix=mix, mode=mode, chunk_size=4,
                            initial_state=S0, return_state=True)
    o_l, S_l = call(mode, q, k, v, log_rho, d, mix, S0)
    np.testing.assert_allclose(o_r, o_l, atol=2e-6, err_msg=mode)
    np.testing.assert_allclose(S_r, S_l, atol=2e-6, err_msg=mode)


def test_core_is_the_assoc_decay_rule_with_v_as_key():
  # Core: S_t = ρ S_{t−1} + (1 − ρ) k vᵀ is assoc's decay rule Σ value keyᵀ with key v, value k
  q, k, v, log_rho, _, _, S0 = make_inputs(*SMALL, "core", seed=4)
  beta = -np.expm1(np.asarray(log_rho))
  o_a, S_a = associative_memory(q, v, k, beta, rule="decay", mode="chunked", chunk_size=4, log_decay=log_rho,
                                initial_state=S0, return_state=True)
  for mode in ("recurrent", "chunked"):
    o, S_T = call(mode, q, k, v, log_rho, None, None, S0)
    np.testing.assert_allclose(o, o_a, atol=1e-6, err_msg=mode)
    np.testing.assert_allclose(S_T, S_a, atol=1e-6, err_msg=mode)


def test_diag_and_sym_terms_alone_match_numpy_loop():
  # pure diagonal (w = (0, 1, 0)) and pure symmetric (w = (0, 0, 1)) updates, so neither term
  # hides behind the others
  B, T, H, S = SMALL
  q, k, v, log_rho, d, _, S0 = make_inputs(*SMALL, seed=5)
  for w in ([0.0, 1.0, 0.0], [0.0, 0.0, 1.0]):
    mix = np.broadcast_to(np.asarray(w, np.float32), (B, T, H, 3))
    o_ref, S_ref, _ = numpy_matrix_state(q, k, v, np.exp(np.asarray(log_rho, np.float64)), d, mix, S0)
    for mode in ("recurrent", "chunked"):
      o, S_T = call(mode, q, k, v, log_rho, d, mix, S0)
      np.testing.assert_allclose(o, o_ref, atol=2e-5, err_msg=f"{w} {mode}")
      np.testing.assert_allclose(S_T, S_ref, atol=2e-5, err_msg=f"{w} {mode}")
  # no diagonal weight: d may be omitted; the symmetric update keeps a symmetric state symmetric
  o, S_T = call("chunked", q, k, v, log_rho, None, mix, None)
  o_ref, S_ref, _ = numpy_matrix_state(q, k, v, np.exp(np.asarray(log_rho, np.float64)), None, mix, None)
  np.testing.assert_allclose(o, o_ref, atol=2e-5)
  np.testing.assert_allclose(S_T, S_ref, atol=2e-5)
  np.testing.assert_allclose(S_T, np.swapaxes(S_T, -1, -2), atol=1e-6)


# ----------------------------------------------------------------------------------------
# gradients


GRAD_NAMES = ("q", "k", "v", "log_rho", "d", "mix", "S0")


def _directional_fd(f_np, args, i, u, eps=1e-6):
  """Central difference of the float64 numpy function ``f_np`` along ``u`` in argument ``i``."""
  plus = [None if a is None else np.asarray(a) for a in args]
  minus = list(plus)
  plus[i] = plus[i] + eps * u
  minus[i] = minus[i] - eps * u
  return (f_np(*plus) - f_np(*minus)) / (2 * eps)


@pytest.mark.parametrize("variant", ("core", "mix_BTH"))
def test_gradients_recurrent_equal_chunked_and_finite_differences(variant):
  # float64: the two forms' gradients agree elementwise, and each argument's gradient matches a
  # central difference of the numpy loop along a random direction; log ρ has tokens at both
  # edges (0: frozen, −inf: reset)
  B, T, H, S = 2, 6, 2, 3
  with jax.enable_x64(True):
    args = list(make_inputs(B, T, H, S, variant, seed=8, dtype=np.float64))
    lr = np.array(args[3])
    lr[0, 1, 0] = lr[1, 2:4, 1] = 0.0
    lr[0, 4, 1] = lr[1, 0] = -np.inf
    args[3] = jnp.asarray(lr)
    _assert_gradients_match_each_other_and_finite_differences(variant, args, np.random.default_rng(9))


def _assert_gradients_match_each_other_and_finite_differences(variant, args, r):
  """float64 ``args`` (under ``jax.enable_x64``): the recurrent and chunked forms' gradients of a random
  projection of ``(o, S_T)`` agree elementwise, and each argument's gradient matches a central difference
  of the numpy loop along a random direction (``r`` draws the projection and the directions)."""
  B, T, H, S = np.shape(args[0])
  argnums = tuple(i for i, a in enumerate(args) if a is not None)
  c_o, c_S = r.normal(size=(B, T, H, S)), r.normal(size=(B, H, S, S))

  def f_np(q, k, v, log_rho, d, mix, S0):
    o, S_T, _ = numpy_matrix_state(q, k, v, np.exp(log_rho), d, mix, S0)
    return np.sum(c_o * o) + np.sum(c_S * S_T)

  grads = {mode: log_rho_grads(mode, *args, c_o, c_S, wrt=argnums) for mode in ("recurrent", "chunked")}
  for i in argnums:
    a, b = np.asarray(grads["recurrent"][i]), np.asarray(grads["chunked"][i])
    name = f"{variant} d/d{GRAD_NAMES[i]}"
    assert a.dtype == np.float64 and a.shape == np.shape(args[i]), name
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)), name
    assert np.any(a != 0), name
    np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11, err_msg=name)
    u = r.normal(size=a.shape)
    np.testing.assert_allclose(float(np.sum(a * u)), _directional_fd(f_np, args, i, u), rtol=1e-6,
                               atol=1e-8, err_msg=name)


# ----------------------------------------------------------------------------------------
# inference step and spectral normalisation


@functools.partial(jax.jit, static_argnames=("spectral",))
def step_scan(S0, q, k, v, log_rho, d, mix, *, spectral):
  """:func:`step` under ``lax.scan`` over a sequence: ``(S_T, o, S_t per token, σ_max(S_t))``."""
  tm = lambda x: jnp.moveaxis(x, 1, 0)

  def body(St, x):
    q_t, k_t, v_t, lr_t, d_t, w_t = x
    St, o_t = step(St, q_t, k_t, v_t, log_rho_t=lr_t, d_t=d_t, mix_t=w_t, spectral_norm=spectral)
    return St, (o_t, St)

  S_T, (o_TBHS, S_TBHSS) = jax.lax.scan(body, S0, tuple(tm(x) for x in (q, k, v, log_rho, d, mix)))
  return S_T, tm(o_TBHS), S_TBHSS, max_singular_value(S_TBHSS)


step_jit = jax.jit(step)


def test_step_over_a_sequence_equals_the_sequence_form():
  B, T, H, S = SMALL
  q, k, v, log_rho, d, mix, S0 = make_inputs(*SMALL, seed=10, scale=1.5)
  for spectral in (False, True):
    o_seq, S_seq = call("recurrent", q, k, v, log_rho, d, mix, S0, spectral_norm=spectral)
    S_T, o, S_TBHSS, sigma = step_scan(S0, q, k, v, log_rho, d, mix, spectral=spectral)
    np.testing.assert_allclose(o, o_seq, atol=1e-6, err_msg=f"spectral={spectral}")
    np.testing.assert_allclose(S_T, S_seq, atol=1e-6, err_msg=f"spectral={spectral}")
    sig = np.linalg.norm(np.asarray(S_TBHSS, np.float64), 2, axis=(-2, -1))
    np.testing.assert_allclose(sigma, sig, rtol=1e-5)
    if spectral:  # σ_max(S_t) ≤ 1 along the sequence
      assert sig.max() <= 1.0 + 1e-5
    else:
      assert sig.max() > 1.2  # the normalisation above had work to do
  # from init(), ρ as a scalar, one mixture per head ([H, 3])
  S = init(B, H, S)
  assert S.shape == (B, H, 3, 3) and S.dtype == jnp.float32
  q, k, v, d, mix = (np.asarray(x) for x in (q, k, v, d, mix))
  w = mix[0, 0]
  S1, o1 = step_jit(S, q[:, 0], k[:, 0], v[:, 0], 0.25, mix_t=w, d_t=d[:, 0])
  rho = np.full((B, 1, H), 0.25)
  o_ref, S_ref, _ = numpy_matrix_state(q[:, :1], k[:, :1], v[:, :1], rho, d[:, :1], w, None)
  np.testing.assert_allclose(o1, o_ref[:, 0], atol=1e-6)
  np.testing.assert_allclose(S1, S_ref, atol=1e-6)


def test_spectral_norm_matches_numpy_loop():
  # large inputs so that the normalisation is active on most steps
  q, k, v, log_rho, d, mix, S0 = make_inputs(*SMALL, seed=11, scale=2.5)
  o_ref, S_ref, sigma_pre = numpy_matrix_state(q, k, v, np.exp(np.asarray(log_rho, np.float64)), d, mix,
                                               S0, spectral_norm=True)
  assert (sigma_pre > 1.0).mean() > 0.5 and (sigma_pre < 1.0).any()  # both branches exercised
  for mode in ("recurrent", "auto"):
    o, S_T = call(mode, q, k, v, log_rho, d, mix, S0, spectral_norm=True)
    # σ_max is exact (an SVD), so float32 rounding is the only difference
    np.testing.assert_allclose(o, o_ref, atol=1e-5, err_msg=mode)
    np.testing.assert_allclose(S_T, S_ref, atol=1e-5, err_msg=mode)


def test_spectral_norm_gradients_match_finite_differences_from_zero_state():
  # S_0 = 0 and ρ_1 = 1: S_1 = 0 exactly, the SVD of a zero matrix is differentiated
  B, T, H, S = SMALL
  with jax.enable_x64(True):
    q, k, v, log_rho, d, mix, _ = make_inputs(*SMALL, seed=12, dtype=np.float64, scale=1.5)
    log_rho = np.array(log_rho)
    log_rho[:, 0] = 0.0
    S0 = np.zeros((B, H, S, S), np.float64)
    r = np.random.default_rng(13)
    c_o, c_S = r.normal(size=(B, T, H, S)), r.normal(size=(B, H, S, S))

    def f_np(q, k, v, log_rho, d, mix):
      o, S_T, _ = numpy_matrix_state(q, k, v, np.exp(log_rho), d, mix, S0, spectral_norm=True)
      return np.sum(c_o * o) + np.sum(c_S * S_T)

    sigma_pre = numpy_matrix_state(q, k, v, np.exp(log_rho), d, mix, S0, spectral_norm=True)[2]
    assert np.all(sigma_pre[:, 0] == 0) and (sigma_pre > 1).any() and (sigma_pre[:, 1:] < 1).any()

    args = (q, k, v, log_rho, d, mix)
    grads = log_rho_grads("recurrent", *args, S0, c_o, c_S, wrt=tuple(range(6)), spectral_norm=True)[:6]
    for i, g in enumerate(grads):
      g = np.asarray(g)
      assert g.dtype == np.float64 and np.all(np.isfinite(g)), GRAD_NAMES[i]
      u = r.normal(size=args[i].shape)
      np.testing.assert_allclose(float(np.sum(g * u)), _directional_fd(f_np, args, i, u), rtol=1e-6,
                                 atol=1e-8, err_msg=GRAD_NAMES[i])


normalize = jax.jit(spectral_normalize)


@jax.jit
def normalize_grads(S):
  """Gradients of Σ (sn(S)² + sn(S)) and of Σ σ_max(S)."""
  return (jax.grad(lambda S: jnp.sum(spectral_normalize(S) ** 2 + spectral_normalize(S)))(S),
          jax.grad(lambda S: jnp.sum(max_singular_value(S)))(S))


def test_spectral_normalize_zero_small_and_large():
  Z = np.zeros((2, 3, 3), np.float32)
  np.testing.assert_array_equal(normalize(Z), Z)
  g, g_sigma = normalize_grads(Z)
  np.testing.assert_array_equal(g, np.ones_like(Z))  # the identity map near 0
  assert np.all(np.isfinite(g_sigma))
  r = np.random.default_rng(14)
  A = r.normal(size=(4, 3, 5))
  sig = np.linalg.norm(A, 2, axis=(-2, -1))
  out = normalize(A.astype(np.float32))
  np.testing.assert_allclose(out, A / np.maximum(sig, 1.0)[:, None, None], rtol=1e-5, atol=1e-6)
  small = (0.1 * A / sig[:, None, None]).astype(np.float32)
  np.testing.assert_array_equal(normalize(small), small)  # divided by max(σ, 1) = 1: exact


# ----------------------------------------------------------------------------------------
# edges of ρ


@pytest.mark.parametrize("mode", ("recurrent", "chunked"))
def test_rho_one_freezes_and_rho_zero_resets_the_state(mode):
  B, T, H, S = SMALL
  q, k, v, _, d, mix, S0 = make_inputs(*SMALL, seed=15)
  full = lambda x: np.full((B, T, H), x, np.float32)
  # log ρ = 0 exactly: 1 − ρ = −expm1(0) = 0, the state stays S_0
  o, S_T = call(mode, q, k, v, full(0.0), d, mix, S0)
  np.testing.assert_allclose(S_T, S0, atol=1e-7)
  np.testing.assert_allclose(o, np.einsum("bhij,bthj->bthi", S0, q), atol=1e-6)
  # log ρ = −inf: S_t = U_t
  o, S_T = call(mode, q, k, v, full(-np.inf), d, mix, S0)
  o_ref, S_ref, _ = numpy_matrix_state(q, k, v, np.zeros((B, T, H)), d, mix, S0)
  np.testing.assert_allclose(o, o_ref, atol=2e-6)
  np.testing.assert_allclose(S_T, S_ref, atol=2e-6)
  # ρ given directly: values at 0 and 1 as with log ρ, gradients finite at both ends
  # (log ρ at the edges: test_gradients_recurrent_equal_chunked_and_finite_differences)
  c = np.random.default_rng(16).normal(size=(B, T, H, S)).astype(np.float32)
  zero_S = np.zeros((B, H, S, S), np.float32)
  for rho, log_rho in ((0.0, -np.inf), (1.0, 0.0)):
    o_l = call(mode, q, k, v, full(log_rho), d, mix, S0)[0]
    np.testing.assert_allclose(call_rho(mode, q, k, v, full(rho), d, mix, S0), o_l, atol=2e-6,
                               err_msg=f"rho={rho}")
  edges = (np.array([1.0, 0.0, 1.0, 0.0, 0.5])[None, :, None] * np.ones((B, T, H))).astype(np.float32)
  for rho in (edges, full(0.0), full(1.0)):
    g = functional_grads(q, k, v, {"rho": rho}, d, mix, S0, c, zero_S, mode=mode, wrt=(3,))[0]["rho"]
    assert np.all(np.isfinite(g)) and np.any(g != 0), mode


def call_rho(mode, q, k, v, rho, d, mix, S0):
  return matrix_state(q, k, v, rho, d=d, mix=mix, mode=mode, chunk_size=4, initial_state=S0)


# ----------------------------------------------------------------------------------------
# precision, dtypes


@pytest.mark.parametrize("mode", ("recurrent", "chunked"))
def test_every_matmul_carries_the_precision(mode):
  q, k, v, log_rho, d, mix, S0 = make_inputs(*SMALL, seed=17)
  per_channel = channel_log_rho(*SMALL, seed=17)
  for precision, want in (("highest", jax.lax.Precision.HIGHEST), ("high", jax.lax.Precision.HIGH)):
    for lr in (log_rho, per_channel):
      f = lambda q, precision=precision, lr=lr: jnp.sum(
          call(mode, q, k, v, lr, d, mix, S0, precision=precision)[0])
      for g in (f, jax.grad(f)):
        found = dot_general_precisions(jax.make_jaxpr(g)(q))
        assert found and all(p == (want, want) for p in found), (mode, precision, lr.ndim, set(found))


def test_dtypes():
  q, k, v, log_rho, d, mix, S0 = make_inputs(*SMALL, seed=18)
  bf16 = lambda x: np.asarray(x).astype(jnp.bfloat16)
  o, S_T = call("recurrent", bf16(q), k, bf16(v), log_rho, d, mix, bf16(S0))
  assert o.dtype == jnp.bfloat16 and S_T.dtype == jnp.bfloat16
  o, S_T = matrix_state(q, k, v, log_rho=log_rho, d=d, mix=mix, mode="recurrent", return_state=True)
  assert o.dtype == jnp.float32 and S_T.dtype == jnp.float32


# ----------------------------------------------------------------------------------------
# per-channel retention: ρ [B, T, H, S], S_t = S_{t−1} Diag(ρ_t) + U_t Diag(1 − ρ_t)


def channel_log_rho(B, T, H, S, seed, dtype=np.float32):
  """log ρ = log σ(z), z ~ N(1, 3²): gates from near 0 to near 1 (ρ ≈ 0.01 .. 0.9999), plus exact edges:
  channel 0 of head 0 frozen (log ρ = 0) at t = 1, 2 and every channel of the last head reset
  (log ρ = −inf) at t = 2, so that both ends meet the other channels' ordinary decays in one chunk."""
  z = 3.0 * np.random.default_rng(seed).normal(size=(B, T, H, S)) + 1.0
  lr = -np.logaddexp(0.0, -z)
  lr[:, 1:3, 0, 0] = 0.0
  lr[:, 2, -1] = -np.inf
  return device_array(lr, dtype)


CHANNEL = (2, 11, 2, 5)  # B, T, H, S: T = 11 is 2 chunks of 4 and a partial one of 3


@pytest.mark.parametrize("variant", ("core", "mix_BTH"))
def test_per_channel_recurrent_and_chunked_match_numpy_loop(variant):
  # float32 against the float64 loop: an entry of o or S_T sums O(T·S) products of O(1) factors, each
  # rounded at ε = 2^-24 ≈ 6e-8 relative (the decays come from exp/expm1 of the float32 log ρ with a few ε
  # more), so the accumulated error is a few T·S·ε ≈ 3e-6 in the worst case; 2e-5 bounds it, as in
  # test_recurrent_and_chunked_match_numpy_loop_with_initial_state
  q, k, v, _, d, mix, S0 = make_inputs(*CHANNEL, variant, seed=20)
  log_rho = channel_log_rho(*CHANNEL, seed=21)
  o_ref, S_ref, _ = numpy_matrix_state(q, k, v, np.exp(np.asarray(log_rho, np.float64)), d, mix, S0)
  for mode in ("recurrent", "chunked"):
    o, S_T = call(mode, q, k, v, log_rho, d, mix, S0)
    np.testing.assert_allclose(o, o_ref, atol=2e-5, err_msg=f"{variant} {mode} o")
    np.testing.assert_allclose(S_T, S_ref, atol=2e-5, err_msg=f"{variant} {mode} S_T")


@pytest.mark.parametrize("variant", ("core", "mix_BTH"))
def test_per_channel_gradients_recurrent_equal_chunked_and_finite_differences(variant):
  # float64 (as test_gradients_recurrent_equal_chunked_and_finite_differences): the forms agree to
  # rounding of float64 sums (rtol 1e-9), and a central difference with step 1e-6 has truncation error
  # O(1e-12) and rounding error O(ε_64 / 1e-6) ≈ 1e-10 relative, inside rtol 1e-6
  B, T, H, S = 2, 6, 2, 3
  with jax.enable_x64(True):
    args = list(make_inputs(B, T, H, S, variant, seed=22, dtype=np.float64))
    args[3] = channel_log_rho(B, T, H, S, seed=23, dtype=np.float64)
    _assert_gradients_match_each_other_and_finite_differences(variant, args, np.random.default_rng(24))


def test_per_channel_step_over_a_sequence_equals_the_sequence_form_and_numpy_with_spectral_norm():
  # the recurrent form and step share the update, so they agree to a few ε (1e-6); the loop within
  # float32 rounding as above, spectral normalisation's exact σ_max adding a few ε
  q, k, v, _, d, mix, S0 = make_inputs(*SMALL, seed=25, scale=1.5)
  log_rho = channel_log_rho(*SMALL, seed=26)
  o_ref, S_ref, sigma_pre = numpy_matrix_state(q, k, v, np.exp(np.asarray(log_rho, np.float64)), d, mix, S0,
                                               spectral_norm=True)
  assert (sigma_pre > 1.0).any()  # the normalisation has work to do
  o_seq, S_seq = call("recurrent", q, k, v, log_rho, d, mix, S0, spectral_norm=True)
  S_T, o, _, sigma = step_scan(S0, q, k, v, log_rho, d, mix, spectral=True)
  np.testing.assert_allclose(o, o_seq, atol=1e-6)
  np.testing.assert_allclose(S_T, S_seq, atol=1e-6)
  np.testing.assert_allclose(o_seq, o_ref, atol=2e-5)
  np.testing.assert_allclose(S_seq, S_ref, atol=2e-5)
  assert float(np.max(sigma)) <= 1.0 + 1e-5


def test_per_channel_gates_equal_across_channels_are_the_per_head_gate():
  # the per-head forms (recurrent; chunked through the associative memory's decay rule) and the
  # per-channel ones (recurrent; the chunked form with [C, C, S] decays) are different float32
  # computations of the same sums: a few ε apart (2e-6 for O(1) outputs, as in the rho == log_rho check)
  B, T, H, S = SMALL
  q, k, v, log_rho, d, mix, S0 = make_inputs(*SMALL, seed=27)
  lr = np.array(log_rho)
  lr[0, 1, 0], lr[0, 3, 1] = 0.0, -np.inf
  per_channel = np.broadcast_to(lr[..., None], (B, T, H, S))
  for mode in ("recurrent", "chunked"):
    o_h, S_h = call(mode, q, k, v, lr, d, mix, S0)
    o_c, S_c = call(mode, q, k, v, per_channel, d, mix, S0)
    np.testing.assert_allclose(o_c, o_h, atol=2e-6, err_msg=mode)
    np.testing.assert_allclose(S_c, S_h, atol=2e-6, err_msg=mode)


# ----------------------------------------------------------------------------------------
# packed sequences (segment_ids)

# rows of T = 22 tokens, chunks of 8 (every boundary inside a chunk, the last chunk partial): row 0 is three
# segments, the second interrupted by padding (which it continues across), then trailing padding; row 1 starts
# with padding, then two segments
SEGMENTS = np.array([[1] * 5 + [2] * 4 + [0] * 3 + [2] * 2 + [3] * 6 + [0] * 2,
                     [0] * 3 + [5] * 8 + [7] * 11], np.int32)
PACKED = (2, 22, 2, 3)  # B, T, H, S
PACKED_CHUNK = 8
GATE_KINDS = ("per_head", "per_channel")  # per head through log ρ, per channel through ρ (both gate paths)


def per_segment(run_one, xs, S0, xp):
  """``(o, S_T)`` of the packed batch from separate runs ``run_one(*xs_segment, S0) -> (o, S)`` of each
  segment (``[1, T_seg, ...]`` slices of the ``[B, T, ...]`` arrays ``xs``): a row's first segment from its
  initial state, later ones from zeros; padding reads 0; the final state is the row's last segment's."""
  outs, finals = [], []
  for b, ids in enumerate(SEGMENTS):
    o_b, S = [None] * len(ids), S0[b:b + 1]
    for i, r in enumerate(runs(ids)):
      o, S = run_one(*(x[b:b + 1, r] for x in xs), S if i == 0 else 0 * S)
      for j, t in enumerate(r):
        o_b[t] = o[0, j]
    outs.append(xp.stack([xp.zeros_like(o[0, 0]) if x is None else x for x in o_b]))
    finals.append(S[0])
  return xp.stack(outs), xp.stack(finals)


def packed_inputs(gate_kind, spectral_norm=False):
  """Discovery's inputs (d, mix [B, T, H, 3]) on PACKED: ``(q, k, v, gate, d, mix, S0)``, the gate log ρ
  [B, T, H] (per head) or ρ [B, T, H, S] (per channel, with exact 0 and 1 entries); for spectral
  normalisation larger inputs and an initial state outside the unit ball (row 1's leading padding must not
  normalise it)."""
  q, k, v, log_rho, d, mix, S0 = make_inputs(*PACKED, seed=30, scale=1.5 if spectral_norm else 0.7)
  if spectral_norm:
    S0 = 5.0 * S0
    assert np.linalg.norm(np.asarray(S0[1], np.float64), 2, axis=(-2, -1)).min() > 1.0
  gate = log_rho if gate_kind == "per_head" else jnp.exp(channel_log_rho(*PACKED, seed=31))
  return q, k, v, gate, d, mix, S0


def _segment_rows():
  """Every segment as a row of its own, right-padded to the longest: ``(batch [N], token [N, L], real
  [N, L], first [N], last [B])``: the packed row and tokens of each, which entries are tokens, whether it is
  its row's first segment, and each packed row's last segment."""
  rows = [(b, i, r) for b, ids in enumerate(SEGMENTS) for i, r in enumerate(runs(ids))]
  L = max(len(r) for _, _, r in rows)
  token = np.stack([np.pad(r, (0, L - len(r)), constant_values=-1) for _, _, r in rows])
  batch, first = np.array([b for b, _, _ in rows]), np.array([i == 0 for _, i, _ in rows])
  last = np.array([np.flatnonzero(batch == b).max() for b in range(len(SEGMENTS))])
  return batch, token, token >= 0, first, last


def segments_alone(run, xs, S0, neutral):
  """``(o, S_T)`` of the packed batch from ONE run ``run(*xs_rows, S0_rows) -> (o, S)`` of every segment alone
  as a row of its own (:func:`_segment_rows`; a row's first segment from its initial state, later ones from
  zeros), padded with the token ``neutral`` (one entry per ``xs``: gate 1, no decay and no write), which
  leaves the state as it is; padding reads 0, the final state is the row's last segment's."""
  batch, token, real, first, last = _segment_rows()
  at = (batch[:, None], np.maximum(token, 0))
  expand = lambda m, x: m.reshape(m.shape + (1,) * (x.ndim - m.ndim))
  xs_rows = [jnp.where(expand(real, x[at]), x[at], jnp.asarray(n, x.dtype)) for x, n in zip(xs, neutral,
                                                                                               strict=True)]
  o_rows, S_rows = run(*xs_rows, jnp.where(expand(first, S0[batch]), S0[batch], 0.0))
  o = jnp.zeros(xs[0].shape[:2] + o_rows.shape[2:], o_rows.dtype)
  return o.at[batch[:, None], np.where(real, token, xs[0].shape[1])].set(o_rows, mode="drop"), S_rows[last]


@functools.cache
def packed_program(gate_kind, mode, spectral_norm=False):
  """One jitted program: ``(o, S_T)`` of the packed call (``mode``; None: the reference, a recurrent run of
  each segment alone without segment_ids) and its pullback of ``(c_o, c_S)``."""
  gate_name = "log_rho" if gate_kind == "per_head" else "rho"

  def one(q, k, v, gate, d, mix, S0, **kw):
    return matrix_state(q, k, v, **{gate_name: gate}, d=d, mix=mix, chunk_size=PACKED_CHUNK, initial_state=S0,
                        return_state=True, spectral_norm=spectral_norm, **kw)

  def f(*xs):
    if mode is None:  # neutral tokens: q, k, v, d = 0, gate 1 (log ρ = 0 or ρ = 1), mix (1, 0, 0)
      neutral = (0.0, 0.0, 0.0, 0.0 if gate_kind == "per_head" else 1.0, 0.0, np.float32([1, 0, 0]))
      return segments_alone(functools.partial(one, mode="recurrent"), xs[:-1], xs[-1], neutral)
    return one(*xs, mode=mode, segment_ids=SEGMENTS)

  def run(c_o, c_S, *xs):
    (o, S), pullback = jax.vjp(f, *xs)
    return o, S, pullback((c_o, c_S))

  return jax.jit(run)


PACKED_NAMES = ("q", "k", "v", "gate", "d", "mix", "S0")


def _assert_packed_equals_each_segment_alone(gate_kind, modes, spectral_norm=False):
  # values and final states against the float64 numpy loop run on each segment alone; gradients w.r.t. every
  # input against separate recurrent runs of the segments (float32: a few ε of O(1) sums apart)
  xs = packed_inputs(gate_kind, spectral_norm)
  q, k, v, gate, d, mix, S0 = (np.asarray(x, np.float64) for x in xs)
  rho = np.exp(gate) if gate_kind == "per_head" else gate
  loop_one = lambda q, k, v, rho, d, mix, S0: numpy_matrix_state(q, k, v, rho, d, mix, S0, spectral_norm)[:2]
  ref_o, ref_S = per_segment(loop_one, (q, k, v, rho, d, mix), S0, np)
  r = np.random.default_rng(32)
  cot = tuple(r.normal(size=s).astype(np.float32) for s in (ref_o.shape, ref_S.shape))
  want = packed_program(gate_kind, None, spectral_norm)(*cot, *xs)
  np.testing.assert_allclose(want[0], ref_o, atol=2e-5)
  np.testing.assert_allclose(want[1], ref_S, atol=2e-5)
  for mode in modes:
    o, S_T, grads = packed_program(gate_kind, mode, spectral_norm)(*cot, *xs)
    what = f"{gate_kind} {mode} spectral_norm={spectral_norm}"
    np.testing.assert_allclose(o, ref_o, atol=2e-5, err_msg=f"{what} o")
    np.testing.assert_allclose(S_T, ref_S, atol=2e-5, err_msg=f"{what} S_T")
    assert not np.any(np.asarray(o)[SEGMENTS == 0]), f"{what}: padding reads 0"
    for name, g, g_ref in zip(PACKED_NAMES, grads, want[2], strict=True):
      assert np.all(np.isfinite(g)) and np.any(g != 0), f"{what} d/d{name}"
      np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=2e-5, err_msg=f"{what} d/d{name}")


@pytest.mark.parametrize("gate_kind", GATE_KINDS)
def test_packed_sequences_equal_each_segment_alone(gate_kind):
  _assert_packed_equals_each_segment_alone(gate_kind, ("recurrent", "chunked", "auto"))


def test_packed_sequences_with_spectral_norm_equal_each_segment_alone():
  # Discovery's configuration (per-head gates); the recurrent form's padding skip is the same for either kind
  _assert_packed_equals_each_segment_alone("per_head", ("recurrent",), spectral_norm=True)


# ----------------------------------------------------------------------------------------
# argument checks


def _bad_calls():
  # numpy inputs: every call raises before a JAX program is built
  q, k, v, log_rho, d, mix, S0 = (np.asarray(x) for x in make_inputs(1, 4, 2, 3, "mix_H", seed=19))  # mix [H,3]
  ok = dict(log_rho=log_rho, d=d, mix=mix)
  run = lambda **kw: matrix_state(*kw.pop("qkv", (q, k, v)), **{**ok, **kw})
  rho = np.exp(log_rho)
  not_nonnegative = mix.copy()
  not_nonnegative[0] = [1.5, -0.25, -0.25]
  return [
      ("q", lambda: run(qkv=(q[0], k, v))),
      ("lengths", lambda: run(qkv=(q, k[:, :3], v))),
      ("numbers of heads", lambda: run(qkv=(q, k, v[:, :, :1]))),
      ("state dims", lambda: run(qkv=(q, k, v[..., :2]))),
      ("batch sizes", lambda: run(qkv=(q, np.concatenate([k, k]), v))),
      ("at least one time step", lambda: run(qkv=(q[:, :0], k[:, :0], v[:, :0]), log_rho=log_rho[:, :0],
                                              d=d[:, :0], mode="recurrent")),
      ("mode", lambda: run(mode="parallel")),
      ("chunk_size", lambda: run(chunk_size=0)),
      ("precision", lambda: run(precision="fast")),
      ("spectral_norm", lambda: run(mode="chunked", spectral_norm=True)),
      ("exactly one", lambda: run(log_rho=None)),
      ("exactly one", lambda: matrix_state(q, k, v, rho, **ok)),
      ("`rho` must lie in", lambda: matrix_state(q, k, v, rho + 1.0, d=d, mix=mix)),
      ("`rho` must lie in", lambda: matrix_state(q, k, v, -rho, d=d, mix=mix)),
      ("`log_rho` must be <= 0", lambda: run(log_rho=log_rho + 5.0)),
      ("`log_rho` must be <= 0", lambda: run(log_rho=np.full_like(log_rho, np.nan))),
      ("`log_rho` must be a scalar or have shape", lambda: run(log_rho=log_rho[0])),
      (r"`log_rho` must be a scalar or have shape \[B, T, H\] = \(1, 4, 2\) or \[B, T, H, S\] = \(1, 4, 2, 3\)",
       lambda: run(log_rho=np.zeros((1, 4, 2, 4), np.float32))),  # per channel, S + 1 channels
      ("`rho` must lie in", lambda: matrix_state(q, k, v, np.full((1, 4, 2, 3), 1.5, np.float32), d=d,
                                                   mix=mix)),
      ("`mix` must have shape", lambda: run(mix=mix[0])),
      ("`mix` must have shape", lambda: run(mix=np.ones((2, 2), np.float32) / 2)),
      ("nonnegative", lambda: run(mix=not_nonnegative)),
      ("sum to 1", lambda: run(mix=2 * mix)),
      ("`d` is required", lambda: run(d=None)),
      ("is only used with `mix`", lambda: run(mix=None)),
      ("`d` must have shape", lambda: run(d=d[..., :2])),
      ("`initial_state` must have shape", lambda: run(initial_state=S0[:, :, :2])),
      ("`d` is required with a traced", lambda: jax.jit(lambda m: run(mix=m, d=None))(mix)),
      (r"`segment_ids` must have shape \[B, T\] = \(1, 4\)",
       lambda: run(segment_ids=np.ones((1, 3), np.int32))),
      ("`segment_ids` must hold integers", lambda: run(segment_ids=np.ones((1, 4), np.float32))),
      ("`segment_ids` must hold integers", lambda: run(segment_ids=np.ones((1, 4), bool))),
      ("`segment_ids` must be >= 0", lambda: run(segment_ids=np.array([[1, 1, -1, 2]], np.int32))),
  ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_bad_arguments_raise_value_error(index):
  match, fn = _bad_calls()[index]
  with pytest.raises(ValueError, match=match):
    fn()


def test_bad_step_and_init_arguments_raise_value_error():
  S = np.asarray(init(1, 2, 3))
  x = np.ones((1, 2, 3), np.float32)
  mix = np.ones((2, 3), np.float32) / 3
  with pytest.raises(ValueError, match="state_dim"):
    init(1, 2, 0)
  with pytest.raises(ValueError, match="state dims"):
    step(S, x, x, np.ones((1, 2, 4), np.float32), 0.5)
  with pytest.raises(ValueError, match="state"):
    step(S[0], x, x, x, 0.5)
  with pytest.raises(ValueError, match="exactly one"):
    step(S, x, x, x, 0.5, log_rho_t=-1.0)
  with pytest.raises(ValueError, match="`rho_t` must lie in"):
    step(S, x, x, x, 1.5)
  with pytest.raises(ValueError, match=r"`log_rho_t` must be a scalar or have shape \[B, H\] = \(1, 2\) or "
                                       r"\[B, H, S\] = \(1, 2, 3\)"):
    step(S, x, x, x, log_rho_t=np.zeros((1, 2, 4), np.float32))
  with pytest.raises(ValueError, match="`d_t` is required"):
    step(S, x, x, x, 0.5, mix_t=mix)
  with pytest.raises(ValueError, match="`mix_t` must have shape"):
    step(S, x, x, x, 0.5, mix_t=mix[None, None], d_t=x)
  with pytest.raises(ValueError, match="`S` must have at least 2"):
    spectral_normalize(np.ones(3, np.float32))
  # a concrete mixture without diagonal weight needs no d (an eager call: the mixture stays concrete)
  step(S, x, x, x, 0.5, mix_t=np.float32([[0.5, 0.0, 0.5]] * 2))
  assert ms.MODES == ("auto", "recurrent", "chunked")
