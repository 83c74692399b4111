"""Mamba-2's SSD layer (structured state-space duality) as a kernel: the associative memory's ``decay`` rule.

Mamba-2 (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality", arXiv:2405.21060) restricts the state matrix of a selective SSM to a
scalar times the identity, ``A_t = exp(Δ_t A)`` with one ``A ≤ 0`` per head, and discretises the input
matrix as ``Δ_t B_t``. Per head ``h``, with step sizes ``Δ_t ≥ 0`` (``dt``, already through softplus)::

    h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_tᵀ          state h [P, N]: head_dim P × d_state N
    y_t = h_t C_t + D x_t

This is :func:`jaxmem.kernels.assoc.associative_memory`'s ``decay`` rule
``S_t = γ_t S_{t−1} + β_t v_t k_tᵀ``, read ``o_t = S_t q_t``, under::

    q = C,   k = B,   v = x,   β = Δ,   log γ = Δ·A   (γ = exp(Δ A) ∈ (0, 1])

plus the skip ``D x``; :func:`ssd` is that call and nothing more, so every form of the decay rule is
available (``mode=``: ``recurrent``, the literal scan; ``parallel``, the masked quadratic form, the
paper's "attention-like" dual; ``chunked``, the paper's block decomposition: quadratic within a chunk,
the state carried between chunks; ``auto`` as in :mod:`jaxmem.kernels.assoc`).

Layouts (``batch`` the batch size, ``G`` groups dividing the ``H`` heads, as Mamba-2's ``ngroups``):
``x [batch, T, H, P]``, ``dt [batch, T, H]``, ``A [H]``, ``B, C [batch, T, G, N]`` (head ``h`` reads group
``h // (H/G)``), ``D [H]``; the state ``[batch, H, P, N]`` is both the associative memory's
``[B, H, D_v, D_k]`` and Mamba's ``(batch, nheads, headdim, dstate)``. Numerics are the associative
memory's: accumulation in float32 (float64 for float64 inputs), ``y`` in the dtype of ``x``, the final
state in the dtype of ``initial_state`` (else the accumulation dtype).

Decoding: :func:`init` and :func:`step` (one token, the same update).

Tested (``tests/kernels/test_ssd.py``): every mode against an independent float64 NumPy loop of the two
equations above (``G`` dividing ``H`` with ``G > 1``, ``T`` not a multiple of the chunk, an initial state),
values, final states and gradients with respect to every input; :func:`step` over a sequence; the argument
checks.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.arrays import device_array
from jaxmem.checks import check_choice, check_floating, check_positive_int, check_rank, is_concrete, shape_of
from jaxmem.kernels import assoc
from jaxmem.kernels.assoc import MODES, associative_memory
from jaxmem.kernels.precision import Matmul, matmul_for
from jaxmem.kernels.segments import check_segment_ids

# ----------------------------------------------------------------------------------------
# Checks.


def _as_array(x):
  """Lists and Python numbers become arrays (None stays None)."""
  return x if x is None or isinstance(x, jax.Array) else device_array(x)


def _check_shape(name: str, x, want: tuple, layout: str) -> None:
  if shape_of(x) != want:
    raise ValueError(f"`{name}` must have shape [{layout}] = {want}, got {shape_of(x)}.")


def _concrete(x) -> Optional[np.ndarray]:
  """``x`` as a float64 NumPy array when its values are known (not traced), else None."""
  if x is None or not is_concrete(x):
    return None
  return np.asarray(x, np.float64)


def _check_values(A, dt, A_name: str, dt_name: str) -> None:
  """Concrete ``A`` finite and ``≤ 0``, concrete ``dt`` finite and ``≥ 0`` (else ``exp(Δ A) > 1``: growth)."""
  a = _concrete(A)
  if a is not None:
    bad = ~(np.isfinite(a) & (a <= 0))
    if np.any(bad):
      raise ValueError(f"`{A_name}` must be finite and <= 0 (the decay is exp(dt·A)), got value(s) such as "
                       f"{a[bad].ravel()[:3].tolist()}.")
  d = _concrete(dt)
  if d is not None:
    bad = ~(np.isfinite(d) & (d >= 0))
    if np.any(bad):
      raise ValueError(f"`{dt_name}` must be finite and >= 0 (a step size, e.g. softplus of a projection), got "
                       f"value(s) such as {d[bad].ravel()[:3].tolist()}.")


def _check_groups(H: int, G: int, B_name: str, x_name: str) -> None:
  if H % G:
    raise ValueError(f"`{B_name}` has G={G} groups, which must divide the H={H} heads of `{x_name}` "
                     f"(head h reads group h // (H/G)).")


def _heads(x, H: int, axis: int):
  """Groups -> heads on ``axis``: head ``h`` gets group ``h // (H/G)`` (a no-op when ``G = H``)."""
  return jnp.repeat(x, H // x.shape[axis], axis=axis)


def _acc(*xs) -> Any:
  return jnp.promote_types(jnp.result_type(*(x for x in xs if x is not None)), jnp.float32)


# ----------------------------------------------------------------------------------------
# Sequence form.


@functools.partial(jax.jit, static_argnames=("mode", "chunk_size", "dot"))
def _forward(x, dt, A, B, C, D, h0, segment_ids, *, mode: str, chunk_size: int, dot: Matmul):
  """:func:`ssd` after its checks, in one compiled program."""
  H = x.shape[2]
  acc = _acc(x, dt, A, B, C, D, h0)
  xs = x.astype(acc)
  dts = dt.astype(acc)
  log_decay = dts * A.astype(acc)[None, None, :]
  # precision=dot.precision: associative_memory re-derives the same Matmul at trace time (the jit key holds it)
  y, h = associative_memory(_heads(C.astype(acc), H, 2), _heads(B.astype(acc), H, 2), xs, dts, rule="decay",
                            mode=mode, chunk_size=chunk_size, log_decay=log_decay, initial_state=h0,
                            return_state=True, precision=dot.precision, segment_ids=segment_ids)
  if D is not None:
    skip = D.astype(acc)[None, None, :, None] * xs
    if segment_ids is not None:  # padding reads 0
      skip = jnp.where((segment_ids != 0)[:, :, None, None], skip, 0.0)
    y = y + skip
  return y.astype(x.dtype), h


def ssd(
    x: jax.Array,
    dt: jax.Array,
    A: jax.Array,
    B: jax.Array,
    C: jax.Array,
    D: Optional[jax.Array] = None,
    *,
    mode: str = "auto",
    chunk_size: int = 64,
    initial_state: Optional[jax.Array] = None,
    return_state: bool = False,
    precision: Any = "highest",
    segment_ids: Optional[jax.Array] = None,
):
  """Mamba-2's SSD recurrence ``h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_tᵀ``, ``y_t = h_t C_t + D x_t`` per head.

  Args:
    x: inputs ``[batch, T, H, P]``.
    dt: step sizes ``Δ ≥ 0`` ``[batch, T, H]`` (softplus already applied).
    A: ``[H]``, ``≤ 0`` (Mamba's ``−exp(A_log)``).
    B: input matrices ``[batch, T, G, N]``; ``G`` divides ``H``, head ``h`` uses group ``h // (H/G)``.
    C: output matrices ``[batch, T, G, N]``.
    D: skip ``[H]``, or None for none.
    mode: ``"auto" | "recurrent" | "parallel" | "chunked"`` (:func:`jaxmem.kernels.assoc.associative_memory`).
    chunk_size: chunk length of the chunked form (any ``T``).
    initial_state: ``h_0 [batch, H, P, N]``; zeros when None.
    return_state: also return ``h_T [batch, H, P, N]``.
    precision: matmul precision (:mod:`jaxmem.kernels.precision`).
    segment_ids: ``[batch, T]`` integers, packed sequences (:mod:`jaxmem.kernels.segments`): the state empties
      at each segment's first token after a row's first; padding (id 0) writes nothing and reads 0.

  Returns:
    ``y [batch, T, H, P]`` in the dtype of ``x``, and ``h_T`` if ``return_state`` (in the dtype of
    ``initial_state``, else float32 — float64 for float64 inputs).

  Raises:
    ValueError: wrong ranks or shapes (naming the argument and the shape seen), ``G`` not dividing ``H``,
      no time steps, integer (non-floating) inputs, bad ``mode`` / ``chunk_size`` / ``precision``, and, when
      the values are concrete, ``A > 0`` or ``dt < 0`` (or either not finite).
  """
  check_choice("mode", mode, MODES)
  chunk_size = check_positive_int("chunk_size", chunk_size)
  dot = matmul_for(precision)
  x, dt, A, B, C, D, initial_state = (_as_array(a) for a in (x, dt, A, B, C, D, initial_state))
  nb, T, H, P = check_rank("x", x, 4, "batch, T, H, P")
  check_rank("dt", dt, 3, "batch, T, H")
  check_rank("A", A, 1, "H")
  _, _, G, N = check_rank("B", B, 4, "batch, T, G, N")
  check_rank("C", C, 4, "batch, T, G, N")
  if T == 0:
    raise ValueError(f"`x` must have at least one time step, got shape {shape_of(x)}.")
  _check_shape("dt", dt, (nb, T, H), "batch, T, H")
  _check_shape("A", A, (H,), "H")
  _check_shape("B", B, (nb, T, G, N), "batch, T, G, N")
  _check_shape("C", C, (nb, T, G, N), "batch, T, G, N")
  _check_groups(H, G, "B", "x")
  if D is not None:
    check_rank("D", D, 1, "H")
    _check_shape("D", D, (H,), "H")
  if initial_state is not None:
    _check_shape("initial_state", initial_state, (nb, H, P, N), "batch, H, P, N")
  check_floating(x=x, dt=dt, A=A, B=B, C=C, D=D, initial_state=initial_state)
  _check_values(A, dt, "A", "dt")
  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, nb, T)
  y, h = _forward(x, dt, A, B, C, D, initial_state, segment_ids, mode=mode, chunk_size=chunk_size, dot=dot)
  return (y, h) if return_state else y


# ----------------------------------------------------------------------------------------
# Decoding.


def init(batch: int, heads: int, head_dim: int, d_state: int, dtype=jnp.float32) -> jax.Array:
  """The empty state ``h_0 = 0``, ``[batch, heads, head_dim, d_state]``: the first ``state`` of :func:`step`."""
  for name, n in (("batch", batch), ("heads", heads), ("head_dim", head_dim), ("d_state", d_state)):
    check_positive_int(name, n)
  return assoc.init(batch, heads, d_state, head_dim, dtype)


@functools.partial(jax.jit, static_argnames=("dot",))
def _step(state, x_t, dt_t, A, B_t, C_t, D, *, dot: Matmul):
  H = x_t.shape[1]
  acc = jnp.promote_types(_acc(x_t, dt_t, A, B_t, C_t, D), state.dtype)
  xs, dts = x_t.astype(acc), dt_t.astype(acc)
  state, y = assoc.step(state, _heads(C_t.astype(acc), H, 1), _heads(B_t.astype(acc), H, 1), xs, dts,
                        rule="decay", log_decay_t=dts * A.astype(acc)[None, :], precision=dot.precision)
  if D is not None:
    y = y + D.astype(acc)[None, :, None] * xs
  return state, y.astype(x_t.dtype)


def step(state, x_t, dt_t, A, B_t, C_t, D=None, *, precision: Any = "highest"):
  """One token of :func:`ssd`: ``(h_{t−1}, x_t, Δ_t, A, B_t, C_t, D) -> (h_t, y_t)``.

  Args:
    state: ``h_{t−1} [batch, H, P, N]``.
    x_t: ``[batch, H, P]``; dt_t: ``[batch, H]``; A: ``[H]``; B_t, C_t: ``[batch, G, N]``; D: ``[H]`` or None.
    precision: as in :func:`ssd`.

  Returns:
    ``(h_t [batch, H, P, N], y_t [batch, H, P])`` — state first, as every kernel's and mixer's ``step``
    (and ``lax.scan``'s body); ``y_t`` in the dtype of ``x_t``, ``h_t`` in the dtype of ``state`` (computed
    in float32 or wider, rounded once).

  Raises:
    ValueError: as :func:`ssd`, for the per-token shapes.
  """
  dot = matmul_for(precision)
  state, x_t, dt_t, A, B_t, C_t, D = (_as_array(a) for a in (state, x_t, dt_t, A, B_t, C_t, D))
  nb, H, P, N = check_rank("state", state, 4, "batch, H, P, N")
  check_rank("x_t", x_t, 3, "batch, H, P")
  check_rank("dt_t", dt_t, 2, "batch, H")
  check_rank("A", A, 1, "H")
  G = check_rank("B_t", B_t, 3, "batch, G, N")[1]
  check_rank("C_t", C_t, 3, "batch, G, N")
  _check_shape("x_t", x_t, (nb, H, P), "batch, H, P")
  _check_shape("dt_t", dt_t, (nb, H), "batch, H")
  _check_shape("A", A, (H,), "H")
  _check_shape("B_t", B_t, (nb, G, N), "batch, G, N")
  _check_shape("C_t", C_t, (nb, G, N), "batch, G, N")
  _check_groups(H, G, "B_t", "state")
  if D is not None:
    check_rank("D", D, 1, "H")
    _check_shape("D", D, (H,), "H")
  check_floating(state=state, x_t=x_t, dt_t=dt_t, A=A, B_t=B_t, C_t=C_t, D=D)
  _check_values(A, dt_t, "A", "dt_t")
  return _step(state, x_t, dt_t, A, B_t, C_t, D, dot=dot)


__all__ = ["MODES", "init", "ssd", "step"]
