"""jaxmem.kernels.ssd (Mamba-2's SSD recurrence) vs independent float64 references of its two equations.

``h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_tᵀ``, ``y_t = h_t C_t + D x_t`` per head, head ``h`` reading group
``h // (H/G)`` of ``B`` and ``C``. Two references, both written here from the equations and not from the
kernel: a float64 NumPy loop (values) and the same loop in float64 JAX, a Python loop over time with no
``lax`` (its ``jax.vjp`` gives the reference gradients; its values are checked against the NumPy loop first,
so the gradients are those of the equations). Why reverse-mode through a float64 loop rather than finite
differences: it gives every component of every gradient (a finite difference gives one direction per pair
of evaluations) with float64 rounding (≈ 1e-16 relative) instead of a truncation / cancellation error near
1e-10, far below the float32 tolerances.

One shape serves the values and gradients: ``SHAPE`` (batch 2, T = 37 with chunk 16: three chunks, the last
padded; H = 4 heads in G = 2 groups; P = 3, N = 5), with an initial state, a head with ``A = 0`` (no
decay) and some ``Δ = 0`` (no write, no decay). Each mode compiles one program returning ``y``, ``h_T`` and
the pullback of random cotangents to ``x, dt, A, B, C, D, h_0``.

Tolerances: every output and gradient entry is a sum of at most ``T·N = 185`` (``T·P·N`` for the gradients
of the shared ``A``) float32 products of O(1) terms, decay factors ≤ 1 and (chunked form) exponentials of
segment sums. Rounding bounds its error by about ``(number of terms)·ε₃₂ ≈ 185 · 1.2e-7 ≈ 2e-5`` of the
sum of the terms' magnitudes (worst case; √185·ε ≈ 2e-6 typical), so entries are compared with
``atol = 5e-5 · max|reference|`` (per array) and ``rtol = 1e-4``; the mutants the tests are meant to catch
(a dropped ``D``, a wrong group, the sign of ``A``, ...) change entries by O(1) of that scale.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.arrays import device_array
from jaxmem.kernels.ssd import init, ssd, step

SHAPE = (2, 37, 4, 2, 3, 5)  # batch, T, H, G, P, N
CHUNK = 16
NAMES = ("x", "dt", "A", "B", "C", "D", "h0")
MODES = ("recurrent", "chunked", "parallel", "auto")


def numpy_ssd(x, dt, A, B, C, D, h0):
  """Per-(batch, head, token) loop in float64, straight from the equations. ``D``/``h0`` None: zero."""
  x, dt, A, B, C = (np.asarray(a, np.float64) for a in (x, dt, A, B, C))
  nb, T, H, P = x.shape
  G, N = B.shape[2:]
  D = np.zeros(H) if D is None else np.asarray(D, np.float64)
  y, final = np.zeros((nb, T, H, P)), np.zeros((nb, H, P, N))
  for b in range(nb):
    for h in range(H):
      g = h // (H // G)
      S = np.zeros((P, N)) if h0 is None else np.asarray(h0[b, h], np.float64).copy()
      for t in range(T):
        S = np.exp(dt[b, t, h] * A[h]) * S + dt[b, t, h] * np.outer(x[b, t, h], B[b, t, g])
        y[b, t, h] = S @ C[b, t, g] + D[h] * x[b, t, h]
      final[b, h] = S
  return y, final


def loop_ssd(x, dt, A, B, C, D, h0):
  """The same equations in jnp, a Python loop over time (no lax), vectorised over batch and heads."""
  T, H, G = x.shape[1], x.shape[2], B.shape[2]
  group = np.arange(H) // (H // G)  # head -> its group, by indexing (not the kernel's repeat)
  Bh, Ch = B[:, :, group], C[:, :, group]
  S, ys = h0, []
  for t in range(T):
    gamma = jnp.exp(dt[:, t] * A[None])[:, :, None, None]
    S = gamma * S + dt[:, t][:, :, None, None] * (x[:, t][..., None] * Bh[:, t][:, :, None, :])
    ys.append(jnp.einsum("bhpn,bhn->bhp", S, Ch[:, t]) + D[None, :, None] * x[:, t])
  return jnp.stack(ys, axis=1), S


@functools.cache
def inputs(shape=SHAPE, seed=0):
  """x, B, C ~ N(0, 1); Δ ~ U(0.05, 1) with a few exact zeros; −A ~ U(0.2, 2) with A = 0 for head 1;
  D ~ N(0, 1); h_0 ~ N(0, 0.3²). Float32."""
  nb, T, H, G, P, N = shape
  r = np.random.default_rng(seed)
  x = r.normal(size=(nb, T, H, P))
  dt = r.uniform(0.05, 1.0, size=(nb, T, H))
  dt[0, 3, :] = 0.0
  dt[1, 20, 2] = 0.0
  A = -r.uniform(0.2, 2.0, size=(H,))
  A[1] = 0.0
  B, C = r.normal(size=(nb, T, G, N)), r.normal(size=(nb, T, G, N))
  D = r.normal(size=(H,))
  h0 = 0.3 * r.normal(size=(nb, H, P, N))
  return tuple(device_array(a, np.float32) for a in (x, dt, A, B, C, D, h0))


@functools.cache
def cotangents(shape=SHAPE):
  nb, T, H, G, P, N = shape
  r = np.random.default_rng(100)
  return (device_array(r.normal(size=(nb, T, H, P)), np.float32),
          device_array(r.normal(size=(nb, H, P, N)), np.float32))


@functools.cache
def numpy_reference():
  return numpy_ssd(*inputs())


@functools.cache
def float64_reference():
  """``(y, h_T, grads)`` of the jnp loop in float64 (grads: the pullback of the cotangents)."""
  with jax.enable_x64(True):
    @jax.jit
    def run(cot_y, cot_h, *xs):
      out, pullback = jax.vjp(loop_ssd, *xs)
      return out[0], out[1], pullback((cot_y, cot_h))
    f64 = lambda a: device_array(np.asarray(a), np.float64)
    return jax.device_get(run(*map(f64, cotangents()), *map(f64, inputs())))


@functools.cache
def value_and_grads(mode):
  """One jitted float32 program per mode: ``(y, h_T, pullback of the cotangents to x, dt, A, B, C, D, h_0)``."""
  def run(cot_y, cot_h, x, dt, A, B, C, D, h0):
    f = lambda *xs: ssd(*xs[:6], mode=mode, chunk_size=CHUNK, initial_state=xs[6], return_state=True)
    out, pullback = jax.vjp(f, x, dt, A, B, C, D, h0)
    return out[0], out[1], pullback((cot_y, cot_h))
  return jax.jit(run)


@functools.cache
def results(mode):
  return jax.device_get(value_and_grads(mode)(*cotangents(), *inputs()))


def assert_close(got, want, msg, atol_scale=5e-5, rtol=1e-4):
  want = np.asarray(want, np.float64)
  np.testing.assert_allclose(got, want, rtol=rtol, atol=atol_scale * np.abs(want).max(), err_msg=msg)


# ----------------------------------------------------------------------------------------
# values and gradients


def test_float64_references_agree():
  # the jnp loop (whose vjp is the gradient reference) computes what the NumPy loop computes
  y, h, _ = float64_reference()
  ref_y, ref_h = numpy_reference()
  np.testing.assert_allclose(y, ref_y, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(h, ref_h, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_values_and_gradients_match_the_float64_loop(mode):
  # SHAPE with an initial state and D; under vjp, auto runs the chunked form (its custom JVP)
  y, h, grads = results(mode)
  assert y.shape == (2, 37, 4, 3) and y.dtype == np.float32
  assert h.shape == (2, 4, 3, 5) and h.dtype == np.float32
  ref_y, ref_h, ref_grads = float64_reference()
  assert_close(y, ref_y, f"{mode} y")
  assert_close(h, ref_h, f"{mode} h_T")
  for name, g, want in zip(NAMES, grads, ref_grads, strict=True):
    assert g.shape == want.shape, name
    assert_close(g, want, f"{mode} d/d{name}")


def test_auto_forward_only_matches_the_float64_loop():
  # a forward-only call runs auto's fastest form (recurrent on CPU, chunked elsewhere)
  y, h = ssd(*inputs()[:6], chunk_size=CHUNK, initial_state=inputs()[6], return_state=True)
  ref_y, ref_h = numpy_reference()
  assert_close(y, ref_y, "auto forward y")
  assert_close(h, ref_h, "auto forward h_T")


def test_without_skip_or_initial_state():
  # D=None means no skip, initial_state=None zeros; return_state=False returns y alone
  x, dt, A, B, C, _, _ = inputs()
  y = ssd(x, dt, A, B, C, mode="chunked", chunk_size=CHUNK)
  assert isinstance(y, jax.Array)
  assert_close(y, numpy_ssd(x, dt, A, B, C, None, None)[0], "no D, no h_0")


def test_splitting_a_sequence_carries_the_state():
  # tokens 0..20 from h_0 (the second chunk padded by 11 tokens, which must not move the state), then
  # 21..36 from the state returned: the whole sequence's outputs and final state
  x, dt, A, B, C, D, h0 = inputs()
  first = lambda a: a[:, :21]
  rest = lambda a: a[:, 21:]
  y1, h1 = ssd(*map(first, (x, dt)), A, *map(first, (B, C)), D, mode="chunked", chunk_size=CHUNK,
               initial_state=h0, return_state=True)
  y2, h2 = ssd(*map(rest, (x, dt)), A, *map(rest, (B, C)), D, mode="chunked", chunk_size=CHUNK,
               initial_state=h1, return_state=True)
  ref_y, ref_h = numpy_reference()
  assert_close(np.concatenate([y1, y2], axis=1), ref_y, "split y")
  assert_close(h2, ref_h, "split h_T")


@jax.jit
def _step_over_sequence(h0, x, dt, A, B, C, D):
  def body(h, xs):
    x_t, dt_t, B_t, C_t = xs
    h, y_t = step(h, x_t, dt_t, A, B_t, C_t, D)
    return h, y_t
  h, y = jax.lax.scan(body, h0, tuple(jnp.moveaxis(a, 1, 0) for a in (x, dt, B, C)))
  return jnp.moveaxis(y, 0, 1), h


def test_step_over_a_sequence_equals_the_loop():
  x, dt, A, B, C, D, h0 = inputs()
  y, h = _step_over_sequence(h0, x, dt, A, B, C, D)
  ref_y, ref_h = numpy_reference()
  assert_close(y, ref_y, "step y")
  assert_close(h, ref_h, "step h_T")
  # from the empty state, one eager step: h_1 = Δ x Bᵀ, y_1 = h_1 C + D x
  h_init = init(2, 4, 3, 5)
  assert h_init.shape == (2, 4, 3, 5) and h_init.dtype == jnp.float32 and not np.any(h_init)
  h1, y1 = step(h_init, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D)
  assert y1.dtype == jnp.float32 and h1.dtype == jnp.float32
  ref1 = numpy_ssd(*(a[:, :1] for a in (x, dt)), A, *(a[:, :1] for a in (B, C)), D, None)
  assert_close(y1, ref1[0][:, 0], "first step y")
  assert_close(h1, ref1[1], "first step h")


# ----------------------------------------------------------------------------------------
# errors


def _args(nb=1, T=5, H=4, G=2, P=3, N=2):
  return dict(x=jnp.zeros((nb, T, H, P)), dt=jnp.zeros((nb, T, H)), A=-jnp.ones((H,)),
              B=jnp.zeros((nb, T, G, N)), C=jnp.zeros((nb, T, G, N)), D=jnp.ones((H,)))


@pytest.mark.parametrize(
    "change,kwargs,match",
    [
        ({"x": jnp.zeros((1, 5, 4))}, {}, r"`x` must have rank 4 \[batch, T, H, P\], got shape \(1, 5, 4\)"),
        ({"dt": jnp.zeros((1, 5))}, {}, r"`dt` must have rank 3 \[batch, T, H\], got shape \(1, 5\)"),
        ({"A": jnp.float32(-1.0)}, {}, r"`A` must have rank 1 \[H\], got shape \(\)"),
        ({"B": jnp.zeros((1, 5, 4))}, {}, r"`B` must have rank 4"),
        ({"C": jnp.zeros((1, 5, 2, 2, 1))}, {}, r"`C` must have rank 4"),
        ({"x": jnp.zeros((1, 0, 4, 3)), "dt": jnp.zeros((1, 0, 4)), "B": jnp.zeros((1, 0, 2, 2)),
          "C": jnp.zeros((1, 0, 2, 2))}, {}, r"`x` must have at least one time step"),
        ({"dt": jnp.zeros((1, 5, 3))}, {},
         r"`dt` must have shape \[batch, T, H\] = \(1, 5, 4\), got \(1, 5, 3\)"),
        ({"A": -jnp.ones((3,))}, {}, r"`A` must have shape \[H\] = \(4,\), got \(3,\)"),
        ({"B": jnp.zeros((2, 5, 2, 2))}, {},
         r"`B` must have shape \[batch, T, G, N\] = \(1, 5, 2, 2\), got \(2, 5, 2, 2\)"),
        ({"C": jnp.zeros((1, 5, 2, 3))}, {},
         r"`C` must have shape \[batch, T, G, N\] = \(1, 5, 2, 2\), got \(1, 5, 2, 3\)"),
        ({"B": jnp.zeros((1, 5, 3, 2)), "C": jnp.zeros((1, 5, 3, 2))}, {},
         r"`B` has G=3 groups, which must divide the H=4 heads of `x`"),
        ({"D": jnp.ones((3,))}, {}, r"`D` must have shape \[H\] = \(4,\), got \(3,\)"),
        ({"D": jnp.ones((4, 1))}, {}, r"`D` must have rank 1 \[H\]"),
        ({}, {"initial_state": jnp.zeros((1, 4, 2, 3))},
         r"`initial_state` must have shape \[batch, H, P, N\] = \(1, 4, 3, 2\), got \(1, 4, 2, 3\)"),
        ({"x": jnp.zeros((1, 5, 4, 3), jnp.int32)}, {}, r"`x` must be floating, got dtype int32"),
        ({"dt": jnp.zeros((1, 5, 4), jnp.int32)}, {}, r"`dt` must be floating"),
        ({"A": [-1, -1, -1, -1]}, {}, r"`A` must be floating, got dtype int32"),
        ({"B": jnp.zeros((1, 5, 2, 2), jnp.int32)}, {}, r"`B` must be floating"),
        ({}, {"initial_state": jnp.zeros((1, 4, 3, 2), jnp.int32)}, r"`initial_state` must be floating"),
        ({"A": jnp.array([-1.0, 0.5, -1.0, -1.0])}, {}, r"`A` must be finite and <= 0 .* such as \[0\.5\]"),
        ({"A": jnp.array([-1.0, jnp.nan, -1.0, -1.0])}, {}, r"`A` must be finite and <= 0"),
        ({"dt": jnp.full((1, 5, 4), -0.1)}, {}, r"`dt` must be finite and >= 0"),
        ({"dt": jnp.full((1, 5, 4), jnp.inf)}, {}, r"`dt` must be finite and >= 0"),
        ({}, {"mode": "fast"}, r"`mode` must be one of"),
        ({}, {"chunk_size": 0}, r"`chunk_size` must be a positive integer, got 0"),
        ({}, {"precision": "fp8"}, r"`precision` must be one of"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(change, kwargs, match):
  args = {**_args(), **change}
  with pytest.raises(ValueError, match=match):
    ssd(args["x"], args["dt"], args["A"], args["B"], args["C"], args["D"], **kwargs)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"state": jnp.zeros((1, 4, 3))}, r"`state` must have rank 4 \[batch, H, P, N\]"),
        ({"x_t": jnp.zeros((1, 4, 2))},
         r"`x_t` must have shape \[batch, H, P\] = \(1, 4, 3\), got \(1, 4, 2\)"),
        ({"dt_t": jnp.zeros((1, 5, 4))}, r"`dt_t` must have rank 2 \[batch, H\]"),
        ({"B_t": jnp.zeros((1, 3, 2)), "C_t": jnp.zeros((1, 3, 2))},
         r"`B_t` has G=3 groups, which must divide the H=4 heads of `state`"),
        ({"C_t": jnp.zeros((1, 2, 5))}, r"`C_t` must have shape \[batch, G, N\] = \(1, 2, 2\)"),
        ({"state": jnp.zeros((1, 4, 3, 2), jnp.int32)}, r"`state` must be floating"),
        ({"dt_t": -jnp.ones((1, 4))}, r"`dt_t` must be finite and >= 0"),
        ({"A": jnp.ones((4,))}, r"`A` must be finite and <= 0"),
    ],
)
def test_step_bad_input_raises_value_error_naming_the_argument(change, match):
  a = {"state": jnp.zeros((1, 4, 3, 2)), "x_t": jnp.zeros((1, 4, 3)), "dt_t": jnp.zeros((1, 4)),
       "A": -jnp.ones((4,)), "B_t": jnp.zeros((1, 2, 2)), "C_t": jnp.zeros((1, 2, 2)), "D": None}
  a.update(change)
  with pytest.raises(ValueError, match=match):
    step(a["state"], a["x_t"], a["dt_t"], a["A"], a["B_t"], a["C_t"], a["D"])


def test_init_rejects_bad_sizes():
  with pytest.raises(ValueError, match=r"`d_state` must be a positive integer, got 0"):
    init(1, 2, 3, 0)


@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
def test_packed_sequences_equal_each_document_alone(mode):
  # segment_ids: the SSM state empties at each document and padding reads 0 (the skip D x too); values and
  # gradients w.r.t. x, dt, B, C (A and D are per head, shared)
  from tests.kernels.packed import PACKED, check_packed_equals_alone
  r = np.random.default_rng(48)
  H, G, P, N = 4, 2, 3, 5
  xs = (r.normal(size=PACKED.shape + (H, P)), r.uniform(0.1, 1.0, PACKED.shape + (H,)),
        r.normal(size=PACKED.shape + (G, N)), r.normal(size=PACKED.shape + (G, N)))
  xs = tuple(np.asarray(x, np.float32) for x in xs)
  A, D = -np.linspace(0.5, 2.0, H).astype(np.float32), np.linspace(-1, 1, H).astype(np.float32)
  fn = lambda x, dt, B, C, segment_ids=None: ssd(x, dt, A, B, C, D, mode=mode, chunk_size=3,
                                                 segment_ids=segment_ids)
  check_packed_equals_alone(fn, xs, rtol=1e-5, atol=2e-6)
