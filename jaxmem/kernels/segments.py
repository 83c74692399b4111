"""Packed sequences: segment ids, their boundaries and positions, and fla's ``cu_seqlens``.

Several documents packed into one row of ``T`` tokens are told apart by ``segment_ids [B, T]``, integers:

* a **segment** is a maximal run of equal non-zero ids along a row; padding tokens are skipped when runs
  are found, so ``[1, 1, 0, 1]`` is one segment and ``[1, 2, 1]`` three;
* id **0 is padding**: such a token writes nothing, reads nothing (its output is 0) and is attended by
  nobody;
* the **first segment of a row continues the row's state** (a memory's ``initial_state``, a decoding cache)
  and every later segment starts empty: nothing crosses a boundary.

The same convention holds in every kernel and mixer that takes ``segment_ids`` (attention masks compare
:func:`segment_index`; recurrences reset at :func:`segment_starts`). ``cu_seqlens [N + 1]`` (fla's and
FlashAttention's varlen form: ``B = 1``, sequence ``n`` is tokens ``cu_seqlens[n]:cu_seqlens[n + 1]``) maps to
ids ``1..N`` (:func:`cu_seqlens_to_segment_ids`); a padding mask ``attention_mask [B, T]`` (1 = token) maps to
ids 1 and 0 (:func:`attention_mask_to_segment_ids`).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.checks import is_concrete, shape_of


def _check_integers(name: str, x, what: str = "") -> None:
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
    raise ValueError(f"`{name}` must hold integers{what}, got dtype {dtype}.")


def check_segment_ids(segment_ids, B: int, T: int, name: str = "segment_ids") -> jax.Array:
  """``segment_ids`` as an int32 array ``[B, T]``; ``ValueError`` naming ``name`` for a wrong shape, a
  non-integer (or boolean) dtype, or (when concrete) a negative id."""
  shape = shape_of(segment_ids)
  if shape != (B, T):
    raise ValueError(f"`{name}` must have shape [B, T] = {(B, T)}, got {shape}.")
  _check_integers(name, segment_ids, " (0 = padding, equal ids = one segment)")
  if is_concrete(segment_ids):
    a = np.asarray(segment_ids)
    if a.size and a.min() < 0:
      raise ValueError(f"`{name}` must be >= 0 (0 marks padding), got {int(a.min())}.")
  return jnp.asarray(segment_ids, jnp.int32)


def segment_starts(segment_ids_BT: jax.Array):
  """``(start [B, T], valid [B, T])`` booleans: ``valid`` = not padding; ``start`` = the first token of a
  segment other than a row's first (the tokens where a recurrence resets; padding skipped)."""
  T = segment_ids_BT.shape[-1]
  valid = segment_ids_BT != 0
  t = jnp.arange(T, dtype=jnp.int32)
  # the last valid token at or before t
  last = jax.lax.cummax(jnp.where(valid, t, -1), axis=segment_ids_BT.ndim - 1)
  prev = jnp.concatenate([jnp.full_like(last[..., :1], -1), last[..., :-1]], axis=-1)  # ... strictly before t
  prev_id = jnp.take_along_axis(segment_ids_BT, jnp.maximum(prev, 0), axis=-1)
  return valid & (prev >= 0) & (segment_ids_BT != prev_id), valid


def segment_index(segment_ids_BT: jax.Array) -> jax.Array:
  """The run number of each token ``[B, T]`` (0 for a row's first segment, then 1, 2, ...; −1 for padding): two
  tokens may see each other exactly when their run numbers are equal and not −1."""
  start, valid = segment_starts(segment_ids_BT)
  return jnp.where(valid, jnp.cumsum(start.astype(jnp.int32), axis=-1), -1)


def segment_positions(segment_ids_BT: jax.Array, offset: Optional[jax.Array] = None) -> jax.Array:
  """Each token's position inside its segment ``[B, T]``: the number of non-padding tokens of its segment before
  it (0 at a segment's first token; left padding does not count). A row's first segment counts from ``offset
  [B]`` (the tokens already in the row's state; 0 when None). Padding tokens get their predecessor's position
  (0 at a row's start); nothing reads them."""
  start, valid = segment_starts(segment_ids_BT)
  c = jnp.cumsum(valid.astype(jnp.int32), axis=-1) - 1  # valid tokens up to t, minus one
  base = jax.lax.cummax(jnp.where(start, c, 0), axis=segment_ids_BT.ndim - 1)  # c at the current run's start
  pos = jnp.maximum(c - base, 0)
  if offset is not None:
    pos = pos + jnp.where(base == 0, jnp.asarray(offset, jnp.int32)[..., None], 0)
  return pos


def previous_in_segment(segment_ids_BT: jax.Array, lag: int):
  """For each token, the one ``lag ≥ 1`` non-padding tokens before it in its own segment: ``(index [B, T]
  int32, ok [B, T] bool)``, ``ok`` False where there is none (the segment's first ``lag`` tokens, padding).
  Padding inside a segment is skipped, so a short convolution or an n-gram window of a packed row sees what the
  segment alone would."""
  start, valid = segment_starts(segment_ids_BT)
  run = jnp.where(valid, jnp.cumsum(start.astype(jnp.int32), axis=-1), -1)
  B, T = segment_ids_BT.shape
  rank = jnp.cumsum(valid.astype(jnp.int32), axis=-1) - 1  # among the row's non-padding tokens
  t = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  rows = jnp.arange(B)[:, None]
  token_of_rank = jnp.zeros((B, T), jnp.int32).at[rows, jnp.where(valid, rank, T)].set(t, mode="drop")
  r = rank - lag
  src = jnp.take_along_axis(token_of_rank, jnp.maximum(r, 0), axis=-1)
  ok = valid & (r >= 0) & (jnp.take_along_axis(run, src, axis=-1) == run)
  return src, ok


def where_rows(pick_B: jax.Array, a, b):
  """Row ``i`` (leading axis) of every leaf of pytree ``a`` where ``pick_B[i]``, else of ``b``: how a
  recurrence over packed rows resets its state at :func:`segment_starts` or keeps it at padding."""
  return jax.tree.map(lambda x, y: jnp.where(pick_B.reshape((-1,) + (1,) * (x.ndim - 1)), x, y), a, b)


def check_cu_seqlens(cu_seqlens, T: int, name: str = "cu_seqlens") -> jax.Array:
  """``cu_seqlens [N + 1]`` as an int32 array (a list or tuple of integers is read as one); ``ValueError``
  naming ``name`` unless it is ``[N + 1]`` integers, ``N >= 1``, and (when concrete) ``0 = c_0 <= c_1 <= ...
  <= c_N = T``."""
  if isinstance(cu_seqlens, (list, tuple)):
    try:
      cu_seqlens = np.asarray(cu_seqlens)
    except ValueError:  # ragged nesting
      raise ValueError(f"`{name}` must be a flat list of integers [N + 1], got {cu_seqlens!r}.") from None
    if cu_seqlens.dtype == object:
      raise ValueError(f"`{name}` must be a flat list of integers [N + 1], got {cu_seqlens.tolist()!r}.")
  shape = shape_of(cu_seqlens)
  if len(shape) != 1 or shape[0] < 2:
    raise ValueError(f"`{name}` must have shape [N + 1] with N >= 1 (a list or a 1-D integer array), got "
                     f"shape {shape}.")
  _check_integers(name, cu_seqlens)
  if is_concrete(cu_seqlens):
    c = np.asarray(cu_seqlens)
    if c[0] != 0 or c[-1] != T or np.any(np.diff(c) < 0):
      raise ValueError(f"`{name}` must rise from 0 to T = {T} (cumulative sequence lengths), got "
                       f"{c.tolist() if c.size <= 12 else c[:6].tolist() + ['...'] + c[-3:].tolist()}.")
  return jnp.asarray(cu_seqlens, jnp.int32)


def cu_seqlens_to_segment_ids(cu_seqlens, T: int) -> jax.Array:
  """``[1, T]`` ids: ``n + 1`` for the tokens of sequence ``n`` (empty sequences take no token)."""
  t = jnp.arange(T, dtype=jnp.int32)
  ends = jnp.asarray(cu_seqlens, jnp.int32)[1:]
  return (jnp.searchsorted(ends, t, side="right") + 1).astype(jnp.int32)[None]


def attention_mask_to_segment_ids(attention_mask) -> jax.Array:
  """A Hugging Face / fla padding mask ``[B, T]`` (1 or True = token, 0 or False = padding) as ``segment_ids
  [B, T]`` int32: each row one document, its tokens id 1, its padding id 0.

  With the convention above this is exactly what fla's layers do with ``attention_mask``: they gather each row's
  tokens into one sequence (left or right padding alike; a mixer's convolution and state skip the padding), run
  them with ``cu_seqlens``, and write zeros back at the padding. For a decoding step fla reads the mask's last
  ``T`` columns (``attention_mask[:, -T:]``); pass those. Integer or boolean dtype (``ValueError`` otherwise);
  concrete values other than 0 and 1 raise a ``ValueError``; under ``jit`` any non-zero value is a token."""
  shape = shape_of(attention_mask)
  if len(shape) != 2:
    raise ValueError(f"`attention_mask` must have shape [B, T] (1 = token, 0 = padding), got {shape}; fla's "
                     "layers refuse [B, T, T] masks too.")
  dtype = jnp.result_type(attention_mask)
  if not (jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_):
    raise ValueError(f"`attention_mask` must hold integers or booleans (1 = token, 0 = padding), got dtype "
                     f"{dtype}.")
  if is_concrete(attention_mask):
    a = np.asarray(attention_mask)
    bad = a[(a != 0) & (a != 1)]
    if bad.size:
      raise ValueError(f"`attention_mask` must hold 0 (padding) and 1 (token), got values such as "
                       f"{bad.ravel()[:3].tolist()}.")
  return (jnp.asarray(attention_mask) != 0).astype(jnp.int32)


def check_lengths(lengths, B: int, T: int, name: str = "lengths") -> jax.Array:
  """``lengths [B]``, how many leading tokens of each row of a ``T``-token chunk are read (the rest is right
  padding), as int32 clipped to ``[0, T]``; ``ValueError`` naming ``name`` for a wrong shape, a non-integer (or
  boolean) dtype, or (when concrete) a value outside ``[0, T]``. Under ``jit`` the values cannot be checked:
  they are clipped, so a row never reads past its chunk."""
  shape = shape_of(lengths)
  if shape != (B,):
    raise ValueError(f"`{name}` must have shape [B] = {(B,)}, got {shape}.")
  _check_integers(name, lengths, " (tokens read per row)")
  if is_concrete(lengths):
    a = np.asarray(lengths)
    if a.size and (a.min() < 0 or a.max() > T):
      raise ValueError(f"`{name}` must lie in [0, T = {T}], got {a.tolist()}.")
  return jnp.clip(jnp.asarray(lengths, jnp.int32), 0, T)


def lengths_to_segment_ids(lengths_B, T: int) -> jax.Array:
  """``[B, T]`` ids of right-padded rows: 1 for row ``b``'s first ``lengths[b]`` tokens (one segment, which
  continues the row's state), 0 (padding: writes nothing, reads nothing) after them."""
  t = jnp.arange(T, dtype=jnp.int32)
  return (t[None, :] < jnp.asarray(lengths_B, jnp.int32)[:, None]).astype(jnp.int32)


__all__ = ["attention_mask_to_segment_ids", "check_cu_seqlens", "check_lengths", "check_segment_ids",
           "cu_seqlens_to_segment_ids", "lengths_to_segment_ids", "previous_in_segment", "segment_index",
           "segment_positions", "segment_starts", "where_rows"]
