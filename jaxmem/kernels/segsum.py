"""Segment sums of log-decays without subtracting cumulative sums.

Decaying memories weight a write at step ``i`` read at step ``t ≥ i`` by
``Π_{i<s≤t} γ_s = exp(Σ_{i<s≤t} log γ_s)``. The usual shortcut ``exp(g_t − g_i)`` with
``g = cumsum(log γ)`` subtracts two large numbers: over a long sequence ``|g|`` grows like
``T·|log γ|`` and the difference keeps only ``eps·|g|`` absolute accuracy (9% relative error
at ``T = 4096``, ``γ ∈ (0.3, 0.7)``), and a decay of exactly 0 gives ``−inf − (−inf) = NaN``.
Mamba-2's ``segsum`` (Dao & Gu 2024, "Transformers are SSMs", the stable ``segsum``
of its reference code) instead sums each segment directly. :func:`segsum` does that in
two levels so that the work stays ``O(T²)`` elementwise: sums inside blocks of ``b`` steps
(``b ≈ √T``), and sums of whole blocks between them::

    Σ_{i<s≤t} x_s = head_P(t) + Σ_{Q<m<P} total_m + tail_Q(i)   (t in block P > Q ∋ i)

Every term is a sum over a contiguous range, nothing is subtracted, so for ``x ≤ 0``
(log-decays) every partial sum has the sign of its terms and float32 keeps ~``eps``
relative accuracy in each entry, and ``x_s = −inf`` (``γ_s = 0``) gives ``−inf`` (weight 0)
with finite values and gradients.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp


def _in_block(x_NB):
  """``L[..., n, t, i] = Σ_{i<s≤t} x[..., n, s]`` inside each block (0 for ``t ≤ i``)."""
  b = x_NB.shape[-1]
  later = jnp.arange(b)[:, None] > jnp.arange(b)[None, :]  # [s, i]: s after i
  return jnp.cumsum(jnp.where(later, x_NB[..., :, None], 0.0), axis=-2)


def default_block(T: int) -> int:
  """The block length :func:`segsum` uses for length ``T``: the power of two ≥ ``√T``."""
  return min(T, 1 << max(0, math.ceil(math.log2(max(1.0, math.sqrt(T))))))


def segsum(x: jax.Array, *, block: Optional[int] = None, fill: float = -jnp.inf) -> jax.Array:
  """``S[..., t, i] = Σ_{i<s≤t} x[..., s]`` for ``i ≤ t`` (0 on the diagonal), ``fill`` above.

  ``x [..., T] -> [..., T, T]``. ``exp(segsum(log γ))`` is the causal decay mask
  ``M_ti = Π_{i<s≤t} γ_s``; its last row ``S[..., T−1, :]`` gives the decays to the end of
  the sequence, and ``x[..., 0] + S[..., :, 0]`` the inclusive cumulative sum. ``block``:
  the inner block length (default :func:`default_block`); any value gives the same sums.
  """
  T = x.shape[-1]
  b = default_block(T) if block is None else max(1, min(int(block), T))
  N = -(-T // b)
  if N * b != T:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, N * b - T)])
  xb = x.reshape(x.shape[:-1] + (N, b))
  t, i = jnp.arange(N * b)[:, None], jnp.arange(N * b)[None, :]
  local = _in_block(xb)  # [..., N, b(t), b(i)]
  if N == 1:
    out = local[..., 0, :, :]
  else:
    head = xb[..., :1] + local[..., :, 0]  # Σ_{start of block ≤ s ≤ t}     [..., N, b]
    tail = local[..., b - 1, :]  # Σ_{i < s ≤ end of block}                  [..., N, b]
    between = _in_block(head[..., -1][..., None, :])[..., 0, :, :]  # Σ_{Q<m≤P} total_m  [..., N, N]
    # Σ_{Q<m<P} total_m = between[P − 1, Q] (rows shifted down by one; row 0 is never used)
    between = jnp.concatenate([jnp.zeros_like(between[..., :1, :]), between[..., :-1, :]], axis=-2)
    cross = head[..., :, :, None, None] + between[..., :, None, :, None] + tail[..., None, None, :, :]
    P = jnp.arange(N)
    same = (P[:, None] == P[None, :])[:, None, :, None]  # [P, 1, Q, 1]
    diag = jnp.broadcast_to(local[..., :, :, None, :], cross.shape)
    out = jnp.where(same, diag, cross).reshape(x.shape[:-1] + (N * b, N * b))
  out = jnp.where(t >= i, out, jnp.asarray(fill, out.dtype))
  return out[..., :T, :T]


__all__ = ["default_block", "segsum"]
