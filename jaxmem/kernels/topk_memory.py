"""A dense append-only key/value memory read by sparse (top-K) cosine attention.

UniMatrix-Assoc's memory (Liu Xiao 2026, arXiv:2604.25930, ``docs/papers/unimatrix.md``):
every token appends its key ``k_t`` and value ``v_t``; the read at ``t`` sees the entries
written **before** ``t`` (read before write, as the slot memory of
:mod:`jaxmem.kernels.slots`), scores them by cosine similarity, keeps the ``K`` best and
mixes their values with ``softmax(τ · score)`` over the kept ones (the paper's ``K = 8``,
``τ = 8``)::

    s_tj = cos(q_t, k_j)                       j < t
    A_t  = top-K_j s_tj                         (fewer when t < K)
    o_t  = Σ_{j∈A_t} softmax_j(τ s_tj) v_j      (o_t = 0 when t = 0: nothing written yet)

Shapes: ``q, k [B, T, H, D]``, ``v [B, T, H, D_v]`` -> ``o [B, T, H, D_v]``. The scores are
the full ``[B, H, T, T]`` causal matrix (``O(T²)`` memory, like softmax attention without a
fused kernel); the top-K selection is ``lax.top_k`` on it. Gradients flow through the kept
scores and values; the selection itself is piecewise constant. Empty reads give exactly
0 in values and gradients (no ``softmax`` over an all-``−inf`` row).

KV cache (decoding): with ``q_offset`` (integers ``[B]``, as in
:func:`jaxmem.kernels.attention.softmax_attention`) ``k, v [B, S, H, *]`` are a cache of any ``S`` (each
row's entries at positions ``0 .. S − 1``) and query ``t`` of row ``b`` is the token at position
``q_offset[b] + t``: it reads the entries ``j < q_offset[b] + t``. With fewer than ``K`` of them it keeps
those that exist, as the sequence form does at early positions (the rest weigh exactly 0, selected away);
an empty read is 0.

Packed sequences (``segment_ids [B, T]``, sequence form; :mod:`jaxmem.kernels.segments`): the candidates of
read ``t`` are the entries ``j < t`` of ``t``'s own segment, so a segment's first token reads 0, as does
padding (id 0), which is nobody's candidate either.

Tested against a per-token numpy loop in ``tests/kernels/test_topk_memory.py``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxmem.checks import check_equal, check_finite_number, check_floating, check_positive_int, check_rank
from jaxmem.kernels.assoc import l2_normalize
from jaxmem.kernels.attention import check_q_offset
from jaxmem.kernels.precision import matmul_for
from jaxmem.kernels.segments import check_segment_ids, segment_index


def topk_memory_read(q: jax.Array, k: jax.Array, v: jax.Array, *, top_k: int = 8, temperature: float = 8.0,
                     precision: Any = "highest", q_offset=None, segment_ids=None) -> jax.Array:
  """Top-K cosine read of the append-only memory of earlier tokens (equations in the module docstring).

  Args:
    q, k: ``[B, T, H, D]`` queries and keys (cosine similarity: their norms do not matter).
    v: ``[B, T, H, D_v]`` values.
    top_k: entries kept per read (``K``); reads at ``t < K`` keep the ``t`` that exist.
    temperature: ``τ`` in ``softmax(τ · cos)``; finite and > 0.
    precision: matmul precision (:mod:`jaxmem.kernels.precision`).
    q_offset: None, or integers ``[B]``: the position of each row's first query in ``k, v [B, S, H, *]``,
      a cache of any length ``S``; query ``t`` of row ``b`` reads the entries ``j < q_offset[b] + t``.
    segment_ids: None, or ``[B, T]`` integers, packed sequences (:mod:`jaxmem.kernels.segments`; sequence form
      only, not with ``q_offset``): a read keeps the top-K of its own segment's earlier entries; padding (0)
      reads 0 and is never read.

  Returns:
    ``o [B, T, H, D_v]`` in the dtype of ``v`` (computed in float32 at least).
  """
  B, T, H, D = check_rank("q", q, 4, "B, T, H, D")
  Bk, Tk, Hk, Dk = check_rank("k", k, 4, "B, T, H, D")
  Bv, Tv, Hv, _ = check_rank("v", v, 4, "B, T, H, D_v")
  check_equal("batch sizes", q=B, k=Bk, v=Bv)
  if q_offset is None:
    check_equal("lengths", q=T, k=Tk, v=Tv)
  else:
    check_equal("key/value lengths", k=Tk, v=Tv)
    offset_B = check_q_offset(q_offset, B)
    if segment_ids is not None:
      raise ValueError("`segment_ids` is for the sequence form; the cached form (`q_offset`) takes none.")
  check_equal("numbers of heads", q=H, k=Hk, v=Hv)
  check_equal("key widths", q=D, k=Dk)
  check_floating(q=q, k=k, v=v)
  top_k = check_positive_int("top_k", top_k)
  tau = check_finite_number("temperature", temperature, positive=True)
  if T == 0:
    raise ValueError(f"`q` must have at least one time step, got shape {tuple(q.shape)}.")
  if segment_ids is not None:
    index_BT = segment_index(check_segment_ids(segment_ids, B, T))
  dot = matmul_for(precision)
  acc = jnp.promote_types(jnp.result_type(q, k, v), jnp.float32)
  qn, kn = l2_normalize(q.astype(acc)), l2_normalize(k.astype(acc))
  s_BHTJ = dot.einsum("bthd,bjhd->bhtj", qn, kn)
  if q_offset is None:
    earlier = jnp.arange(T)[:, None] > jnp.arange(T)[None, :]  # j < t: written before the read
  else:   # [B, 1, T, S]: j < q_offset + t
    earlier = (offset_B[:, None, None, None] + jnp.arange(T)[None, None, :, None]
               > jnp.arange(Tk)[None, None, None, :])
  if segment_ids is not None:   # [B, 1, T, T]: and j in t's own segment (padding in none)
    same = (index_BT[:, :, None] == index_BT[:, None, :]) & (index_BT >= 0)[:, :, None]
    earlier = earlier[None, None] & same[:, None]
  K = min(top_k, Tk)
  s_BHTJ = jnp.where(earlier, s_BHTJ, -jnp.inf)
  vals_BHTK, idx_BHTK = jax.lax.top_k(s_BHTJ, K)
  valid = jnp.isfinite(vals_BHTK)
  logits = jnp.where(valid, tau * vals_BHTK, 0.0)
  logits = logits - jax.lax.stop_gradient(jnp.max(jnp.where(valid, logits, -1e30), axis=-1, keepdims=True))
  e = jnp.where(valid, jnp.exp(jnp.where(valid, logits, 0.0)), 0.0)
  w_BHTK = e / jnp.maximum(jnp.sum(e, axis=-1, keepdims=True), 1e-30)  # all-invalid rows: 0 / 1e-30 = 0
  v_BHJV = jnp.swapaxes(v.astype(acc), 1, 2)
  gathered = jnp.take_along_axis(v_BHJV[:, :, None], idx_BHTK[..., None], axis=3)  # [B, H, T, K, Dv]
  # reads at t < K also pick masked (future) entries; select them away rather than weigh them by 0, so
  # a non-finite value written later cannot reach an earlier read (0 · inf = NaN)
  gathered = jnp.where(valid[..., None], gathered, 0.0)
  o_BHTV = jnp.sum(w_BHTK[..., None] * gathered, axis=3)
  return jnp.swapaxes(o_BHTV, 1, 2).astype(v.dtype)


__all__ = ["topk_memory_read"]
