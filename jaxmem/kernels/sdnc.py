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

Decoding: the memory *is* a KV cache (:func:`jaxmem.kernels.attention.kv_cache_init`: ``k, v
[B, max_len, H, *]`` and the slots written per row, ``length [B]``). :func:`sdnc_scan` runs the
same write-then-read steps from a memory that already holds ``length`` slots (the write pointer
starts there, per row), and returns the memory after the chunk. The hybrids' cached form
(:func:`sdnc_hybrid_scan`) is below.

Packed sequences: the sequence forms take ``segment_ids [B, T]`` (:mod:`jaxmem.kernels.segments`). Each
segment has a memory of its own: a query reads only the slots its own segment wrote, and padding (id 0)
writes no slot and reads 0. In the hybrids the boundary also cuts the temporal links (a segment's first slot
has no predecessor, its last no successor; padding inside a segment is skipped, so the slots on either side
of it are neighbours), and padding retains every slot (f = 1), so an erase product covers its own segment's
steps only.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxmem.checks import check_finite_number
from jaxmem.kernels.attention import (
  MASK_VALUE,
  cache_write,
  check_kv_cache,
  check_qkv,
  kv_cache_append,
  kv_cache_init,
)
from jaxmem.kernels.segments import check_lengths, check_segment_ids, segment_index, segment_starts
from jaxmem.kernels.segsum import segsum


def _content_read(K_SD, V_SE, written_S, q_D, scale):
  """Read weights over written slots and the read vector (dot-product content address)."""
  acc = jnp.promote_types(q_D.dtype, jnp.float32)
  logits = jnp.einsum("sd,d->s", K_SD, q_D, preferred_element_type=acc) * jnp.asarray(scale, acc)
  logits = jnp.where(written_S, logits, MASK_VALUE)
  w_S = jax.nn.softmax(logits)
  return w_S, jnp.einsum("s,se->e", w_S, V_SE.astype(acc))


def _segments(segment_ids, B: int, T: int):
  """Per-token segment facts ``[B, T]`` (int32) from ``segment_ids`` (checked here): ``(index, start, prev,
  next)``: the run number (−1 for padding, :func:`jaxmem.kernels.segments.segment_index`), 1 at the first
  token of a segment after a row's first (the memory empties there), and the temporal links: the neighbouring
  non-padding tokens of the same segment (−1 where none: a segment's first / last token, padding)."""
  ids = check_segment_ids(segment_ids, B, T)
  index = segment_index(ids)
  start, valid = segment_starts(ids)
  t = jnp.arange(T, dtype=jnp.int32)
  last = jax.lax.cummax(jnp.where(valid, t, -1), axis=1)                # the last valid token at or before t
  first = jax.lax.cummin(jnp.where(valid, t, T), axis=1, reverse=True)  # the first valid token at or after t
  prev = jnp.concatenate([jnp.full((B, 1), -1, jnp.int32), last[:, :-1]], axis=1)
  nxt = jnp.concatenate([first[:, 1:], jnp.full((B, 1), T, jnp.int32)], axis=1)
  same = lambda j: valid & (j >= 0) & (j < T) & (jnp.take_along_axis(index, jnp.clip(j, 0, T - 1), 1) == index)
  prev, nxt = jnp.where(same(prev), prev, -1), jnp.where(same(nxt), nxt, -1)
  return index, start.astype(jnp.int32), prev, nxt


def sdnc_head(q_TD, k_TD, v_TE, seg=None, *, scale):
  """One read head over a write-as-you-go memory; returns ``(reads [T, E], weights [T, T])``. ``seg``: None,
  or the row's ``(index [T], start [T], ...)`` of :func:`_segments`: the memory empties at a segment's start,
  padding writes no slot and reads 0 (weights 0)."""
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

  def segment_step(mem, inputs):
    K, V, written = mem
    (t, q_t, k_t, v_t), valid_t, start_t = inputs
    written = written & ~start_t   # a new segment starts from an empty memory
    K, V, written = K.at[t].set(k_t), V.at[t].set(v_t), written.at[t].set(valid_t)   # padding writes nothing
    w, r = _content_read(K, V, written, q_t, scale)
    return (K, V, written), (jnp.where(valid_t, r, 0.0), jnp.where(valid_t, w, 0.0))

  xs = (jnp.arange(T), q_TD, k_TD, v_TE)
  if seg is None:
    _, (reads, weights) = jax.lax.scan(step, memory, xs)
  else:
    _, (reads, weights) = jax.lax.scan(segment_step, memory, (xs, seg[0] >= 0, seg[1] > 0))
  return reads.astype(v_TE.dtype), weights


def _check_qkv(q, k, v, same_length: bool) -> int:
  _, T, _, D, S = check_qkv(q, k, v, heads="numbers of heads (read heads)", floating=True)
  if same_length and S != T:
    raise ValueError(f"the self-attention sDNC writes one slot per query: q length {T} != k length {S}.")
  return D


def sdnc_attention(q, k, v, *, scale: Optional[float] = None, return_weights: bool = False, segment_ids=None):
  """Causal self-attention computed as H read heads of a write-once memory.

  Args:
    q, k: ``[B, T, H, D]``; v: ``[B, T, H, E]``.
    scale: content-address temperature, ``1/sqrt(D)`` when None.
    return_weights: also return the read weights ``[B, H, T, T]`` (row t: weights on slots).
    segment_ids: None, or ``[B, T]`` integers, packed sequences (:mod:`jaxmem.kernels.segments`): a query reads
      only the slots written by its own segment, and padding (0) writes no slot and reads 0 (weights 0).

  Returns:
    read vectors ``[B, T, H, E]`` (and the weights).
  """
  D = _check_qkv(q, k, v, same_length=True)
  scale = D ** -0.5 if scale is None else check_finite_number("scale", scale)
  if segment_ids is None:
    head = lambda q_, k_, v_: sdnc_head(q_, k_, v_, scale=scale)
    reads, weights = jax.vmap(jax.vmap(head, in_axes=1, out_axes=(1, 0)))(q, k, v)
  else:
    seg = _segments(segment_ids, q.shape[0], q.shape[1])
    head = lambda q_, k_, v_, s: sdnc_head(q_, k_, v_, s, scale=scale)
    reads, weights = jax.vmap(jax.vmap(head, in_axes=(1, 1, 1, None), out_axes=(1, 0)))(q, k, v, seg)
  return (reads, weights) if return_weights else reads


def sdnc_memory_head(K_SD, V_SE, length, q_TD, k_TD, v_TE, *, scale):
  """:func:`sdnc_head` from a memory ``K [S, D]``, ``V [S, E]`` whose first ``length`` slots are written:
  step ``t`` writes slot ``length + t`` (dropped past ``S``, never wrapped) and reads the written slots
  ``s <= length + t``. Returns ``(K, V, reads [T, E])``."""
  S = K_SD.shape[0]

  def step(mem, inputs):
    K, V = mem
    slot, q_t, k_t, v_t = inputs
    K, V = K.at[slot].set(k_t.astype(K.dtype), mode="drop"), V.at[slot].set(v_t.astype(V.dtype), mode="drop")
    _, r = _content_read(K, V, jnp.arange(S) <= slot, q_t, scale)
    return (K, V), r

  slots = length + jnp.arange(q_TD.shape[0], dtype=jnp.int32)
  (K, V), reads = jax.lax.scan(step, (K_SD, V_SE), (slots, q_TD, k_TD, v_TE))
  return K, V, reads.astype(v_TE.dtype)


def sdnc_scan(memory: dict, q, k, v, *, scale: Optional[float] = None, lengths=None):
  """:func:`sdnc_attention` from a memory that already holds tokens (decoding, a prompt's prefill).

  Args:
    memory: ``{"k": [B, S, H, D], "v": [B, S, H, E], "length": [B] int32}``
      (:func:`jaxmem.kernels.attention.kv_cache_init`): row ``b``'s slots ``0 .. length[b] − 1`` are written.
    q, k: ``[B, T, H, D]``; v: ``[B, T, H, E]``: the next ``T`` tokens of every row.
    scale: content-address temperature, ``1/sqrt(D)`` when None.
    lengths: ``[B]`` or None (all ``T``): right-padded rows, only row ``b``'s first ``lengths[b]`` tokens are
      kept (:func:`jaxmem.kernels.attention.kv_cache_append`: its ``length`` grows by that many, the
      padding's slots lie past it and are overwritten by the row's next tokens; their reads are unspecified).

  Returns:
    ``(memory after the chunk, reads [B, T, H, E])``; from an empty memory of ``S ≥ T`` slots the reads are
    :func:`sdnc_attention`'s. Writes past ``S`` are dropped and ``length`` still grows (the caller checks
    lengths on the host; such a read sees the first ``S`` tokens, finite).
  """
  D = _check_qkv(q, k, v, same_length=True)
  check_kv_cache(memory, k, v)
  scale = D ** -0.5 if scale is None else check_finite_number("scale", scale)
  head = lambda K, V, n, q_, k_, v_: sdnc_memory_head(K, V, n, q_, k_, v_, scale=scale)
  per_row = jax.vmap(head, in_axes=(1, 1, None, 1, 1, 1), out_axes=(1, 1, 1))  # over heads
  K, V, reads = jax.vmap(per_row)(memory["k"], memory["v"], memory["length"], q, k, v)
  T = q.shape[1]
  grow = T if lengths is None else check_lengths(lengths, q.shape[0], T)
  return {**memory, "k": K, "v": V, "length": memory["length"] + grow}, reads


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


# --------------------------------------------------------------------------------------
# Hybrids: attention plus the DNC operations it lacks (Tang & Xie 2026, "what next").
# --------------------------------------------------------------------------------------
#
# One memory, three optional operations, all given per step and per head as logits:
#
# * selective write (``write_gate`` z_s): slot s is written with strength g_s = σ(z_s);
#   its unnormalised read weight is multiplied by g_s.
# * erase (``erase_gate`` z_t): before slot t is written, every written slot is retained
#   with f_t = σ(z_t) (the DNC erase applied to all slots; Forgetting-Transformer-style
#   decay), so slot s carries g_s Π_{s<τ≤t} f_τ at step t.
# * temporal-link reads (``read_modes`` [.., 3], softmax, order backward, content,
#   forward as in the DNC): the read weights are mixed with their images under the link
#   matrix of the write-once memory, which is the sub-diagonal shift (tested in
#   tests/kernels/test_dnc.py): forward reads the slot written after the attended one,
#   backward the slot written before it.
#
# Read weights: w_t[s] ∝ g_s Π_{s<τ≤t} f_τ exp(scale k_s·q_t) over written slots s <= t;
# read r_t = π_b Σ_s (Lᵀw_t)[s] V[s] + π_c Σ_s w_t[s] V[s] + π_f Σ_s (L w_t)[s] V[s].
# With every operation off (None) this is exactly softmax attention.


def _log_sigmoid(z):
  return jax.nn.log_sigmoid(z.astype(jnp.promote_types(z.dtype, jnp.float32)))


def hybrid_head(q_TD, k_TD, v_TE, write_TL, erase_TL, modes_T3, seg=None, *, scale):
  """Parallel (masked quadratic) form of the hybrid read for one head.

  ``write_TL``/``erase_TL`` are gate logits ``[T]`` or None; ``modes_T3`` read-mode logits
  ``[T, 3]`` or None; ``seg`` None or the row's ``(index, start, prev, next)`` ``[T]`` of :func:`_segments`.
  With segments the boundary enters three terms: the mask (a query sees its own segment's slots, padding
  none), the erase products (padding retains, f = 1, so a product over a segment's steps skips the padding
  inside it; products across a boundary reach masked slots only) and the link reads (the linked neighbours
  ``prev`` / ``next`` replace the shift by one slot, none across a boundary).
  """
  T = q_TD.shape[0]
  acc = jnp.promote_types(jnp.result_type(q_TD, k_TD, v_TE), jnp.float32)
  logits = jnp.einsum("td,sd->ts", q_TD, k_TD, preferred_element_type=acc) * jnp.asarray(scale, acc)
  if write_TL is not None:
    logits = logits + _log_sigmoid(write_TL)[None, :]
  if erase_TL is not None:
    # slot s at step t carries Π_{s<τ≤t} f_τ: the segment sum Σ_{s<τ≤t} log f_τ, summed
    # directly (never F_t − F_s of two cumulative sums, which loses eps·|F| over long
    # sequences and gives −inf − (−inf) for f = 0); 0 above the diagonal (masked below)
    log_f = _log_sigmoid(erase_TL)
    if seg is not None:
      log_f = jnp.where(seg[0] >= 0, log_f, 0.0)   # padding erases nothing
    logits = logits + segsum(log_f, fill=0.0)
  causal = jnp.tril(jnp.ones((T, T), bool))
  if seg is None:
    w = jax.nn.softmax(jnp.where(causal, logits, MASK_VALUE), axis=-1)
    out = _read_with_links(w, v_TE.astype(acc), modes_T3, jnp.tril(jnp.ones((T, T), bool), -1))
    return out.astype(v_TE.dtype)
  index, _, prev, nxt = seg
  valid = index >= 0
  visible = causal & (index[:, None] == index[None, :]) & valid[:, None]
  w = jax.nn.softmax(jnp.where(visible, logits, MASK_VALUE), axis=-1)
  before_query = visible & jnp.tril(jnp.ones((T, T), bool), -1)
  out = _read_with_links(w, v_TE.astype(acc), modes_T3, before_query, (prev, nxt))
  return jnp.where(valid[:, None], out, 0.0).astype(v_TE.dtype)


def hybrid_memory_head(q_TD, k_TD, v_TE, write_TL, erase_TL, modes_T3, seg=None, *, scale):
  """The same read computed literally as a memory under ``lax.scan``: slot presences,
  erase-then-write, and the DNC temporal link matrix (``kernels.dnc.update_link``) for
  link reads. The executable specification that :func:`hybrid_head` is tested against.
  With ``seg`` (as in :func:`hybrid_head`) the memory empties at a segment's start (written slots, link
  matrix, precedence), and a padding step is a write of weight 0: no slot, no erase, no link; it reads 0.
  """
  from jaxmem.kernels.dnc import update_link

  T, D = k_TD.shape
  E = v_TE.shape[-1]
  acc = jnp.promote_types(jnp.result_type(q_TD, k_TD, v_TE), jnp.float32)
  zeros_T = jnp.zeros((T,), acc)
  write = zeros_T if write_TL is None else _log_sigmoid(write_TL)
  erase = zeros_T if erase_TL is None else _log_sigmoid(erase_TL)
  modes = jnp.tile(jnp.array([-1e4, 1e4, -1e4], acc), (T, 1)) if modes_T3 is None else modes_T3
  memory = (jnp.zeros((T, D), acc), jnp.zeros((T, E), acc), jnp.full((T,), -jnp.inf, acc),
            jnp.zeros((T, T), acc), jnp.zeros((T,), acc))

  def step(mem, inp):
    K, V, log_presence, link, precedence = mem
    t, q_t, k_t, v_t, lw, le, m = inp
    log_presence = log_presence + le                    # erase: retain every slot by f_t
    K, V = K.at[t].set(k_t.astype(acc)), V.at[t].set(v_t.astype(acc))
    log_presence = log_presence.at[t].set(lw)           # write slot t with strength g_t
    link, precedence = update_link(link, precedence, jax.nn.one_hot(t, T, dtype=acc))
    logits = K @ q_t.astype(acc) * scale + log_presence
    written = jnp.arange(T) <= t
    w = jax.nn.softmax(jnp.where(written, logits, MASK_VALUE))
    pi = jax.nn.softmax(m.astype(acc))
    rw = pi[0] * (link.T @ w) + pi[1] * w + pi[2] * (link @ w)
    return (K, V, log_presence, link, precedence), rw @ V

  def segment_step(mem, inp):
    (K, V, log_presence, link, precedence), written = mem
    (t, q_t, k_t, v_t, lw, le, m), valid_t, start_t = inp
    # a new segment: an empty memory (no written slot, no link, no precedence)
    written = written & ~start_t
    link, precedence = jnp.where(start_t, 0.0, link), jnp.where(start_t, 0.0, precedence)
    log_presence = log_presence + jnp.where(valid_t, le, 0.0)   # erase (padding retains every slot)
    K, V = K.at[t].set(k_t.astype(acc)), V.at[t].set(v_t.astype(acc))
    log_presence = log_presence.at[t].set(lw)
    written = written.at[t].set(valid_t)
    # padding writes with weight 0: the link matrix and precedence stay as they are
    link, precedence = update_link(link, precedence, jax.nn.one_hot(t, T, dtype=acc) * valid_t.astype(acc))
    logits = K @ q_t.astype(acc) * scale + log_presence
    w = jax.nn.softmax(jnp.where(written, logits, MASK_VALUE))
    pi = jax.nn.softmax(m.astype(acc))
    rw = pi[0] * (link.T @ w) + pi[1] * w + pi[2] * (link @ w)
    return ((K, V, log_presence, link, precedence), written), jnp.where(valid_t, rw @ V, 0.0)

  xs = (jnp.arange(T), q_TD, k_TD, v_TE, write, erase, modes)
  if seg is None:
    _, reads = jax.lax.scan(step, memory, xs)
  else:
    _, reads = jax.lax.scan(segment_step, (memory, jnp.zeros((T,), bool)), (xs, seg[0] >= 0, seg[1] > 0))
  return reads.astype(v_TE.dtype)


def _check_hybrid(q, k, v, write_gate, erase_gate, read_modes, scale) -> float:
  B, T, H, D, _ = check_qkv(q, k, v, heads="numbers of heads (read heads)", floating=True)
  if k.shape[1] != T:
    raise ValueError(f"the hybrid memory writes one slot per query: q length {T} != k length {k.shape[1]}.")
  for name, x, extra in (("write_gate", write_gate, ()), ("erase_gate", erase_gate, ()),
                         ("read_modes", read_modes, (3,))):
    if x is not None and tuple(x.shape) != (B, T, H) + extra:
      raise ValueError(f"`{name}` must have shape {[B, T, H, *extra]}, got {list(x.shape)}.")
  return D ** -0.5 if scale is None else check_finite_number("scale", scale)


def _read_with_links(w_TS, v_SE, modes_T3, before_query_TS, neighbours=None):
  """The content read ``w @ V``, or with read modes ``π`` the mix ``π_0 · (w @ V[s−1]) + π_1 · (w @ V) +
  π_2 · (w' @ V[s+1])`` of the backward, content and forward link reads, ``w'`` being ``w`` on the slots before
  the query's own (``before_query_TS``; the forward link from the query's slot is not written yet).
  ``neighbours``: None, or ``(prev [S], next [S])``: the linked slots in place of ``s ∓ 1`` (−1: no link, a
  zero vector)."""
  out = w_TS @ v_SE
  if modes_T3 is None:
    return out
  pi = jax.nn.softmax(modes_T3.astype(v_SE.dtype), axis=-1)
  zero = jnp.zeros_like(v_SE[:1])
  if neighbours is None:
    v_next = jnp.concatenate([v_SE[1:], zero])    # V[s+1]; read only before the query's slot
    v_prev = jnp.concatenate([zero, v_SE[:-1]])   # V[s-1]; slot 0 has no predecessor
  else:
    linked = lambda j: jnp.where((j >= 0)[:, None], jnp.take(v_SE, jnp.maximum(j, 0), axis=0), 0.0)
    v_prev, v_next = linked(neighbours[0]), linked(neighbours[1])
  forward = jnp.where(before_query_TS, w_TS, 0.0) @ v_next
  backward = w_TS @ v_prev
  return pi[:, 0:1] * backward + pi[:, 1:2] * out + pi[:, 2:3] * forward


def _hybrid_apply(head_fn, q, k, v, write_gate, erase_gate, read_modes, scale, segment_ids=None):
  scale = _check_hybrid(q, k, v, write_gate, erase_gate, read_modes, scale)
  args = [q, k, v]
  axes = [1, 1, 1]
  for x in (write_gate, erase_gate, read_modes):
    args.append(x)
    axes.append(None if x is None else 1)
  if segment_ids is not None:   # per row, shared by the heads
    args.append(_segments(segment_ids, q.shape[0], q.shape[1]))
    axes.append(None)
  head = lambda *a: head_fn(*a, scale=scale)
  return jax.vmap(jax.vmap(head, in_axes=tuple(axes), out_axes=1),
                  in_axes=tuple(None if a is None else 0 for a in args))(*args)


def sdnc_hybrid_attention(q, k, v, *, write_gate=None, erase_gate=None, read_modes=None,
                          scale: Optional[float] = None, segment_ids=None):
  """Causal attention with DNC operations: selective write, erase, temporal-link reads.

  Args:
    q, k: ``[B, T, H, D]``; v: ``[B, T, H, E]``.
    write_gate: write-gate logits ``[B, T, H]`` (slot t written with σ(z)), or None.
    erase_gate: retention logits ``[B, T, H]`` (f_t = σ(z) applied to all written slots
      before slot t is written), or None.
    read_modes: read-mode logits ``[B, T, H, 3]`` (backward, content, forward), or None.
    segment_ids: None, or ``[B, T]`` integers, packed sequences (:mod:`jaxmem.kernels.segments`): each segment
      reads, erases and links only its own slots, as if run alone; padding (0) writes nothing, erases
      nothing, is skipped by the links and reads 0.

  With all four None this is exactly ``softmax_attention(q, k, v, causal=True)``.
  """
  return _hybrid_apply(hybrid_head, q, k, v, write_gate, erase_gate, read_modes, scale, segment_ids)


def sdnc_hybrid_memory(q, k, v, *, write_gate=None, erase_gate=None, read_modes=None,
                       scale: Optional[float] = None, segment_ids=None):
  """:func:`sdnc_hybrid_attention` computed as a literal memory scan (slow; the reference); ``segment_ids``
  as there (the memory empties at each segment's start)."""
  return _hybrid_apply(hybrid_memory_head, q, k, v, write_gate, erase_gate, read_modes, scale, segment_ids)


# -- the hybrids' cached form: a KV cache plus each slot's log presence ----------------------------------
#
# Every term of the hybrid read is a function of the written slots alone, so a cache holds it: the
# selective write and the erase act on the read only through a per-slot, per-head log presence
# p_s(t) = log g_s + Σ_{s<τ≤t} log f_τ (the memory scan's ``log_presence``), advanced by a chunk's
# retentions; the link reads of a write-once memory use the current read weights and the link
# matrix, which is the shift between neighbouring slots (no earlier read weights, no link matrix
# to carry): forward reads V[s + 1], backward V[s − 1], both in the cache.


def sdnc_hybrid_init(batch_size: int, max_len: int, n_heads: int, d_key: int, d_value: Optional[int] = None,
                     dtype=jnp.float32, *, presence: bool) -> dict:
  """An empty memory for :func:`sdnc_hybrid_scan`: the KV cache of
  :func:`jaxmem.kernels.attention.kv_cache_init`, plus, when ``presence`` (a write gate or erase is used),
  ``"presence"``: each slot's log presence ``[B, max_len, H]`` (float32 at least)."""
  memory = kv_cache_init(batch_size, max_len, n_heads, d_key, d_value, dtype)
  if presence:
    memory["presence"] = jnp.zeros((batch_size, max_len, n_heads), jnp.promote_types(dtype, jnp.float32))
  return memory


def hybrid_cache_head(K_SD, V_SE, P_S, length, q_TD, erase_TL, modes_T3, n_valid=None, *, scale):
  """One head of the hybrid read of a chunk of ``T`` queries at positions ``length + t`` from a cache
  ``K [S, D]``, ``V [S, E]`` that already holds the chunk's keys and values, and ``P [S]`` (or None): the
  log presences at the chunk's start, with the chunk's own write strengths ``log g`` at its slots.
  One masked ``[T, S]`` read (the parallel form of :func:`hybrid_head` on the cache). Returns
  ``(reads [T, E] in float32 at least, P after the chunk or None)``; ``n_valid`` (a scalar, or None for
  ``T``): only the chunk's first ``n_valid`` tokens are kept, so ``P`` is the one after token
  ``n_valid − 1`` (the erases of the padding after it never apply)."""
  T, S = q_TD.shape[0], K_SD.shape[0]
  acc = jnp.promote_types(jnp.result_type(q_TD, K_SD, V_SE), jnp.float32)
  logits = jnp.einsum("td,sd->ts", q_TD, K_SD, preferred_element_type=acc) * jnp.asarray(scale, acc)
  s_idx = jnp.arange(S)
  position_T = length + jnp.arange(T)
  P_new = None
  if P_S is not None:
    logits = logits + P_S.astype(acc)[None, :]
    P_new = P_S
    if erase_TL is not None:
      # the retentions of chunk steps τ with slot(s) < length + τ ≤ length + t: a segment sum over
      # [0, log f_0 .. log f_{T−1}], column 0 for the older slots, column j + 1 for the chunk's slot j
      seg = segsum(jnp.concatenate([jnp.zeros((1,), acc), _log_sigmoid(erase_TL).astype(acc)]), fill=0.0)
      column_S = jnp.clip(s_idx - length + 1, 0, T)
      decay_TS = seg[1:, column_S]   # slots after the query (or unwritten) get 0 (and are masked)
      logits = logits + decay_TS
      if n_valid is None:
        P_new = P_S + decay_TS[-1].astype(P_S.dtype)
      else:  # the decays to the last kept token; none when the row keeps no token of this chunk
        last = decay_TS[jnp.clip(n_valid - 1, 0, T - 1)]
        P_new = P_S + jnp.where(n_valid > 0, last, 0.0).astype(P_S.dtype)
  visible = s_idx[None, :] <= position_T[:, None]
  w = jax.nn.softmax(jnp.where(visible, logits, MASK_VALUE), axis=-1)
  out = _read_with_links(w, V_SE.astype(acc), modes_T3, s_idx[None, :] < position_T[:, None])
  return out, P_new


def sdnc_hybrid_scan(memory: dict, q, k, v, *, write_gate=None, erase_gate=None, read_modes=None,
                     scale: Optional[float] = None, lengths=None):
  """:func:`sdnc_hybrid_attention` from a memory that already holds tokens (decoding, a prompt's prefill).

  Args:
    memory: from :func:`sdnc_hybrid_init` (``presence=True`` when ``write_gate`` or ``erase_gate`` is given),
      or a memory this function returned: row ``b``'s slots ``0 .. length[b] − 1`` are written.
    q, k, v, write_gate, erase_gate, read_modes, scale: as in :func:`sdnc_hybrid_attention`, for the next
      ``T`` tokens of every row.
    lengths: ``[B]`` or None (all ``T``): right-padded rows, only row ``b``'s first ``lengths[b]`` tokens are
      kept: the memory is the one after them (the padding's erases never apply; its slots lie past the new
      ``length``, overwritten by the row's next tokens); the padding's reads are unspecified.

  Returns:
    ``(memory after the chunk, reads [B, T, H, E])``: from an empty memory, :func:`sdnc_hybrid_attention`'s
    reads; chunk by chunk, the same. Writes past ``max_len`` are dropped and ``length`` still grows (the
    caller checks lengths on the host; such reads stay finite).
  """
  scale = _check_hybrid(q, k, v, write_gate, erase_gate, read_modes, scale)
  check_kv_cache(memory, k, v)
  presence = memory.get("presence")
  if presence is None and (write_gate is not None or erase_gate is not None):
    raise ValueError("a write gate or erase needs the memory's slot presences: "
                     "sdnc_hybrid_init(..., presence=True).")
  length = memory["length"]
  if lengths is not None:
    lengths = check_lengths(lengths, q.shape[0], q.shape[1])
  new = kv_cache_append(memory, k, v, lengths)
  if presence is not None:
    log_g = (jnp.zeros(q.shape[:3], presence.dtype) if write_gate is None
             else _log_sigmoid(write_gate).astype(presence.dtype))
    presence = cache_write(presence, length, log_g)   # slot t is written with strength g_t
  # vmap over heads, then rows; absent inputs (None) are passed through unbatched
  args = (new["k"], new["v"], presence, length, q, erase_gate, read_modes, lengths)
  head_axes = (1, 1, 1, None, 1, 1, 1, None)
  row_axes = (0, 0, 0, 0, 0, 0, 0, 0)
  if presence is None:
    head = lambda K, V, _, n, q_, e, m, c: (hybrid_cache_head(K, V, None, n, q_, e, m, c, scale=scale)[0], None)
  else:
    head = lambda K, V, P, n, q_, e, m, c: hybrid_cache_head(K, V, P, n, q_, e, m, c, scale=scale)
  head_axes = tuple(None if a is None else ax for a, ax in zip(args, head_axes, strict=True))
  row_axes = tuple(None if a is None else ax for a, ax in zip(args, row_axes, strict=True))
  reads, presence = jax.vmap(jax.vmap(head, in_axes=head_axes, out_axes=1), in_axes=row_axes)(*args)
  if presence is not None:
    new["presence"] = presence
  return new, reads.astype(v.dtype)
