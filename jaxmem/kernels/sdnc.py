"""The stateless DNC (sDNC): a write-once memory read by content.

Tang & Xie (2026), "Transformers are Stateless Differentiable Neural Computers": a causal
self-attention layer is a DNC whose controller is feed-forward and whose memory is
write-once. At step ``t`` slot ``t`` receives ``(k_t, v_t)`` and is never erased; the read
is content-only with dot-product similarity at temperature ``scale`` (``1/sqrt(D)``), over
*written* slots only::

    w_t = softmax_{s <= t}(scale · K[s] · q_t),    r_t = sum_s w_t[s] V[s].

This module runs that memory literally: a fixed-capacity memory ``K [T, D]``, ``V [T, E]``
and a written-slot mask carried through ``lax.scan`` over time. It is the executable form
of the theorem, not a fast path: the tests assert it equals
:func:`jaxmem.kernels.attention.softmax_attention` (``causal=True``), values and gradients.
Its reverse pass stores the ``[T, D]`` memory per step (``O(T² D)``); use
``softmax_attention`` for training.

Cross-attention is an sDNC with a second memory written once, all at the start, by the
encoder (:func:`sdnc_cross_attention`).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxmem._checks import check_finite_number
from jaxmem.kernels.attention import MASK_VALUE, check_qkv


def _content_read(K_SD, V_SE, written_S, q_D, scale):
  """Read weights over written slots and the read vector (dot-product content address)."""
  acc = jnp.promote_types(q_D.dtype, jnp.float32)
  logits = jnp.einsum("sd,d->s", K_SD, q_D, preferred_element_type=acc) * jnp.asarray(scale, acc)
  logits = jnp.where(written_S, logits, MASK_VALUE)
  w_S = jax.nn.softmax(logits)
  return w_S, jnp.einsum("s,se->e", w_S, V_SE.astype(acc))


def sdnc_head(q_TD, k_TD, v_TE, *, scale):
  """One read head over a write-as-you-go memory; returns ``(reads [T, E], weights [T, T])``."""
  T, D = k_TD.shape
  E = v_TE.shape[-1]
  memory = (jnp.zeros((T, D), k_TD.dtype), jnp.zeros((T, E), v_TE.dtype), jnp.zeros((T,), bool))

  def step(mem, inputs):
    K, V, written = mem
    t, q_t, k_t, v_t = inputs
    # write: slot t receives (k_t, v_t), once, never erased
    K, V, written = K.at[t].set(k_t), V.at[t].set(v_t), written.at[t].set(True)
    # read after write: content address over written slots only
    w, r = _content_read(K, V, written, q_t, scale)
    return (K, V, written), (r, w)

  _, (reads, weights) = jax.lax.scan(step, memory, (jnp.arange(T), q_TD, k_TD, v_TE))
  return reads.astype(v_TE.dtype), weights


def _check_qkv(q, k, v, same_length: bool) -> int:
  _, T, _, D, S = check_qkv(q, k, v, heads="numbers of heads (read heads)")
  if same_length and S != T:
    raise ValueError(f"the self-attention sDNC writes one slot per query: q length {T} != k length {S}.")
  return D


def sdnc_attention(q, k, v, *, scale: Optional[float] = None, return_weights: bool = False):
  """Causal self-attention computed as H read heads of a write-once memory.

  Args:
    q, k: ``[B, T, H, D]``; v: ``[B, T, H, E]``.
    scale: content-address temperature, ``1/sqrt(D)`` when None.
    return_weights: also return the read weights ``[B, H, T, T]`` (row t: weights on slots).

  Returns:
    read vectors ``[B, T, H, E]`` (and the weights).
  """
  D = _check_qkv(q, k, v, same_length=True)
  scale = D ** -0.5 if scale is None else check_finite_number("scale", scale)
  head = lambda q_, k_, v_: sdnc_head(q_, k_, v_, scale=scale)
  reads, weights = jax.vmap(jax.vmap(head, in_axes=1, out_axes=(1, 0)))(q, k, v)
  return (reads, weights) if return_weights else reads


def sdnc_cross_attention(q, k_mem, v_mem, *, scale: Optional[float] = None):
  """Reads of a fixed memory written once by an encoder: ``q [B, T, H, D]``,
  ``k_mem [B, S, H, D]``, ``v_mem [B, S, H, E]`` -> ``[B, T, H, E]``.

  Every slot is written before the first read, so every slot is readable at every step;
  the decoder's queries are processed one per step by ``lax.scan``.
  """
  D = _check_qkv(q, k_mem, v_mem, same_length=False)
  scale = D ** -0.5 if scale is None else check_finite_number("scale", scale)

  def head(q_TD, K_SD, V_SE):
    written = jnp.ones((K_SD.shape[0],), bool)
    def step(_, q_t):
      return None, _content_read(K_SD, V_SE, written, q_t, scale)[1]
    _, reads = jax.lax.scan(step, None, q_TD)
    return reads.astype(V_SE.dtype)

  return jax.vmap(jax.vmap(head, in_axes=1, out_axes=1))(q, k_mem, v_mem)
