"""Softmax attention: the write-once memory that every other memory is compared with.

Layout: public functions take ``[B, T, H, D]`` arrays (batch, time, heads, features).
The arithmetic is written once per head on ``[T, D]`` arrays (:func:`attention_head`)
and vmapped over heads and batch.

Equation (Vaswani et al. 2017, eq. 1)::

    o_i = sum_j softmax_j(s · q_i·k_j + mask_ij) v_j,   s = 1/sqrt(D_k) by default,

with ``mask_ij = 0`` where key ``j`` is visible to query ``i`` (``j <= i`` when causal) and
a large negative finite number elsewhere, so that no row ever becomes NaN.
Logits, the softmax and the weighted sum accumulate in float32 (float64 for float64
inputs); the output has the
dtype of ``v``.

Precision: ``precision=`` is passed to both matmuls (:mod:`jaxmem.kernels.precision`).
The default ``None`` is the platform's default, as in every mainstream attention kernel:
bfloat16 operands on TPU, TF32 on recent GPUs (logits then carry ~1e-2 / ~1e-3 relative
error); pass ``"highest"`` for float32 operands everywhere.

KV cache (decoding): :func:`kv_cache_init` allocates ``k, v [B, max_len, H, *]`` and per-row
lengths ``[B]``; :func:`kv_cache_append` writes a chunk of ``T`` keys and values at each row's
positions ``length .. length + T − 1``; ``softmax_attention(q, cache["k"], cache["v"],
q_offset=length before the append)`` reads it: query ``t`` of row ``b`` is the token at
position ``q_offset[b] + t`` and sees the cache positions ``s ≤ q_offset[b] + t`` (one masked
matmul over the whole cache per head; unwritten positions are masked). Rows may be at different
positions. Nothing is ever wrapped around: writes at positions ``≥ max_len`` are dropped and
the length still grows, so a row past ``max_len`` reads its first ``max_len`` tokens (finite,
no NaN) and its ``length > max_len`` says so; the caller (a model's ``generate``) checks
lengths on the host before it decodes.

Invariant tested (tests/kernels/test_attention.py): equals ``jax.nn.dot_product_attention``
and an independent numpy loop, values and gradients, on odd ``T`` and ``D``, for self-
and cross-attention; with ``q_offset``, equals the loop over each row's visible prefix.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from jaxmem.checks import check_equal, check_finite_number, check_floating, check_rank
from jaxmem.kernels.precision import Matmul, matmul_for
from jaxmem.kernels.segments import check_lengths, check_segment_ids, segment_index

# Large negative *finite* logit for masked slots: exp underflows to exactly 0 while a
# fully masked row stays finite (uniform weights) instead of becoming NaN.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_PLATFORM_DEFAULT = Matmul(None)


def attention_head(
    q_TD: jax.Array,
    k_SD: jax.Array,
    v_SE: jax.Array,
    *,
    causal: bool,
    scale: float,
    dot: Matmul = _PLATFORM_DEFAULT,
    q_offset: Optional[jax.Array] = None,
    q_pos: Optional[jax.Array] = None,
    visible_TS: Optional[jax.Array] = None,
) -> jax.Array:
  """One head of softmax attention on ``q [T, D]``, ``k [S, D]``, ``v [S, E]`` -> ``[T, E]``.

  ``q_offset`` (a scalar int, with ``causal``): query ``t`` is at position ``q_offset + t`` and sees the
  keys ``s ≤ q_offset + t``. ``q_pos [T]`` (ints): the queries' positions when they are not ``0 .. T − 1``
  (several query heads of a group stacked as rows). ``visible_TS`` (bools): a further mask (segments)."""
  acc = jnp.promote_types(jnp.result_type(q_TD, k_SD, v_SE), jnp.float32)  # >= float32
  logits_TS = dot.einsum(
      "td,sd->ts", q_TD, k_SD, preferred_element_type=acc
  ) * jnp.asarray(scale, acc)
  if causal:
    t_idx = (jnp.arange(q_TD.shape[0]) if q_pos is None else q_pos)[:, None]
    s_idx = jnp.arange(k_SD.shape[0])[None, :]
    if q_offset is not None:
      t_idx = t_idx + q_offset
    logits_TS = jnp.where(s_idx <= t_idx, logits_TS, MASK_VALUE)
  if visible_TS is not None:
    logits_TS = jnp.where(visible_TS, logits_TS, MASK_VALUE)
  weights_TS = jax.nn.softmax(logits_TS, axis=-1)
  out_TE = dot.einsum(
      "ts,se->te", weights_TS, v_SE.astype(acc), preferred_element_type=acc,
  )
  return out_TE.astype(v_SE.dtype)


def check_qkv(q, k, v, *, heads: str = "numbers of heads",
              floating: bool = False, grouped: bool = False) -> tuple[int, int, int, int, int]:
  """Validates ``q [B, T, H, D]``, ``k [B, S, H, D]``, ``v [B, S, H, E]``; returns (B, T, H, D, S).

  ``floating=True`` also requires floating dtypes (:func:`jaxmem.checks.check_floating`), for kernels whose
  output takes the dtype of ``v`` (an integer ``v`` would truncate the weighted average). ``grouped=True``
  lets ``k`` and ``v`` have fewer heads than ``q``, a divisor of them (grouped-query attention)."""
  B, T, H, D = check_rank("q", q, 4, "B, T, H, D")
  Bk, S, Hk, Dk = check_rank("k", k, 4, "B, S, H, D")
  Bv, Sv, Hv, _ = check_rank("v", v, 4, "B, S, H, E")
  check_equal("batch sizes", q=B, k=Bk, v=Bv)
  if grouped:
    check_equal(heads, k=Hk, v=Hv)
    if H % Hk:
      raise ValueError(f"`k` and `v` have {Hk} heads, which must divide the {H} heads of `q` (grouped-query "
                       "attention: each key/value head serves H / H_kv query heads).")
  else:
    check_equal(heads, q=H, k=Hk, v=Hv)
  check_equal("key widths", q=D, k=Dk)
  check_equal("key/value lengths", k=S, v=Sv)
  if floating:
    check_floating(q=q, k=k, v=v)
  return B, T, H, D, S


def softmax_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    precision: Any = None,
    q_offset: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
) -> jax.Array:
  """Multi-head softmax attention.

  Args:
    q: queries ``[B, T, H, D]``.
    k: keys ``[B, S, H_kv, D]``; ``S`` may differ from ``T`` only when ``causal=False``
      (cross-attention) or with ``q_offset`` (a KV cache). ``H_kv`` divides ``H``: query head ``h`` reads
      key/value head ``h // (H / H_kv)`` (grouped-query attention; multi-query at ``H_kv = 1``).
    v: values ``[B, S, H_kv, E]``; the value width ``E`` may differ from ``D``.
    causal: if True, query ``t`` sees keys ``0..t`` only (requires ``S == T`` unless ``q_offset`` is given).
    scale: logit scale; ``1/sqrt(D)`` when None.
    precision: matmul precision (:mod:`jaxmem.kernels.precision`); None: platform default.
    q_offset: None, or the position of each row's first query, integers ``[B]`` (or one for every row;
      needs ``causal=True``): query ``t`` of row ``b`` sees the keys ``s ≤ q_offset[b] + t`` of any
      ``S`` (a KV cache, :func:`kv_cache_append`). A query that sees no key (``q_offset[b] + t < 0``)
      has every logit masked: it averages all ``S`` values uniformly, finite as any fully masked row.
    segment_ids: ``[B, T]`` integers, packed sequences (:mod:`jaxmem.kernels.segments`; self-attention,
      ``S == T``, no ``q_offset``): a query sees the keys of its own segment only; padding (id 0) is seen by
      none and its output is 0.

  Returns:
    ``[B, T, H, E]`` in the dtype of ``v``.

  Raises:
    ValueError: on wrong ranks, non-floating dtypes, mismatched batch/heads/feature/length sizes, a causal
      call with ``S != T`` (and no ``q_offset``), a ``q_offset`` without ``causal`` or not integers of shape
      ``[B]``, a non-finite ``scale``, or an unknown ``precision``.
  """
  dot = matmul_for(precision)
  B, T, H, D, S = check_qkv(q, k, v, floating=True, grouped=True)
  G = H // k.shape[2]  # query heads per key/value head
  scale = D ** -0.5 if scale is None else check_finite_number("scale", scale)
  if q_offset is not None:
    if segment_ids is not None:
      raise ValueError("`segment_ids` marks packed sequences in self-attention; it does not combine with "
                       "`q_offset` (a KV cache holds one sequence per row).")
    offset_B = check_q_offset(q_offset, B, causal)
  elif causal and S != T:
    raise ValueError(
        f"causal attention needs equal query and key lengths, got q length {T} and "
        f"k length {S}; pass causal=False for cross-attention."
    )
  else:
    offset_B = None
  if segment_ids is not None:
    if S != T:
      raise ValueError(f"`segment_ids` needs self-attention (equal query and key lengths), got {T} and {S}.")
    run_BT = segment_index(check_segment_ids(segment_ids, B, T))
  # each key/value head reads its G query heads as G·T rows (row r is query t = r mod T of the group's head
  # r // T): no copy of k or v
  q_pos = jnp.tile(jnp.arange(T), G) if G > 1 else None

  def per_row(q_THD, k_SKD, v_SKE, offset, run_T):
    visible = None
    if run_T is not None:
      run_rows = jnp.tile(run_T, G) if G > 1 else run_T
      visible = (run_rows[:, None] == run_T[None, :]) & (run_T[None, :] >= 0)
    q_KRD = jnp.moveaxis(q_THD.reshape(T, k_SKD.shape[1], G, D), 0, 2).reshape(k_SKD.shape[1], G * T, D) \
        if G > 1 else jnp.moveaxis(q_THD, 1, 0)
    head = lambda q_, k_, v_: attention_head(q_, k_, v_, causal=causal, scale=scale, dot=dot, q_offset=offset,
                                             q_pos=q_pos, visible_TS=visible)
    o_KRE = jax.vmap(head, in_axes=(0, 1, 1))(q_KRD, k_SKD, v_SKE)
    if G > 1:  # [H_kv, G·T, E] -> [T, H, E] with h = kv·G + g
      o_KRE = o_KRE.reshape(k_SKD.shape[1], G, T, -1)
      return jnp.moveaxis(o_KRE, 2, 0).reshape(T, H, -1)
    return jnp.moveaxis(o_KRE, 0, 1)

  o = jax.vmap(per_row, in_axes=(0, 0, 0, None if offset_B is None else 0,
                                 None if segment_ids is None else 0))(
      q, k, v, offset_B, None if segment_ids is None else run_BT)
  if segment_ids is not None:
    o = jnp.where((run_BT >= 0)[:, :, None, None], o, jnp.zeros((), o.dtype))
  return o


def check_q_offset(q_offset, batch_size: int, causal: bool = True) -> jax.Array:
  """Validates a ``q_offset`` (integers, shape ``[B]`` or ``[]``, with ``causal``); returns it as ``[B]``
  int32."""
  if not causal:
    raise ValueError("`q_offset` places causal queries in a longer key sequence; it needs causal=True.")
  offset = jnp.asarray(q_offset)
  if not jnp.issubdtype(offset.dtype, jnp.integer):
    raise ValueError(f"`q_offset` must hold integers (positions), got dtype {offset.dtype}.")
  if offset.shape not in ((), (batch_size,)):
    raise ValueError(f"`q_offset` must have shape (B,) = ({batch_size},) or be one int, got {offset.shape}.")
  return jnp.broadcast_to(offset.astype(jnp.int32), (batch_size,))


# -- KV cache: what a decoding attention layer keeps ----------------------------------------------------


def kv_cache_init(batch_size: int, max_len: int, n_heads: int, d_key: int, d_value: Optional[int] = None,
                  dtype: Any = jnp.float32) -> dict:
  """An empty cache: ``{"k": [B, max_len, H, d_key], "v": [B, max_len, H, d_value] (zeros, dtype),
  "length": [B] int32 (tokens written per row, 0)}``; ``d_value`` defaults to ``d_key``."""
  d_value = d_key if d_value is None else d_value
  return {"k": jnp.zeros((batch_size, max_len, n_heads, d_key), dtype),
          "v": jnp.zeros((batch_size, max_len, n_heads, d_value), dtype),
          "length": jnp.zeros((batch_size,), jnp.int32)}


def check_kv_cache(cache: dict, k_BTHD: jax.Array, v_BTHE: jax.Array) -> int:
  """Validates a cache from :func:`kv_cache_init` against a chunk ``k [B, T, H, D]``, ``v [B, T, H, E]``;
  returns ``max_len``."""
  if not isinstance(cache, dict) or not {"k", "v", "length"} <= set(cache):
    raise ValueError("a KV cache is a dict with 'k', 'v' and 'length' (kv_cache_init).")
  B, S, H, D = check_rank("cache['k']", cache["k"], 4, "B, max_len, H, D")
  Bv, Sv, Hv, E = check_rank("cache['v']", cache["v"], 4, "B, max_len, H, E")
  (Bl,) = check_rank("cache['length']", cache["length"], 1, "B")
  check_equal("cache batch sizes", k=B, v=Bv, length=Bl, chunk_k=k_BTHD.shape[0], chunk_v=v_BTHE.shape[0])
  check_equal("cache lengths (max_len)", k=S, v=Sv)
  check_equal("cache heads", k=H, v=Hv, chunk_k=k_BTHD.shape[2], chunk_v=v_BTHE.shape[2])
  check_equal("cache key widths", cache=D, chunk=k_BTHD.shape[3])
  check_equal("cache value widths", cache=E, chunk=v_BTHE.shape[3])
  check_equal("chunk lengths", k=k_BTHD.shape[1], v=v_BTHE.shape[1])
  return S


def cache_write(buffer_BS: jax.Array, length_B: jax.Array, new_BT: jax.Array) -> jax.Array:
  """``buffer [B, S, ...]`` with ``new [B, T, ...]`` written at each row's positions
  ``length .. length + T − 1`` (one scatter, static shapes); positions ``≥ S`` are dropped, never wrapped."""
  B, T = new_BT.shape[:2]
  rows = jnp.arange(B)[:, None]
  positions_BT = length_B.astype(jnp.int32)[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
  return buffer_BS.at[rows, positions_BT].set(new_BT.astype(buffer_BS.dtype), mode="drop")


def kv_cache_append(cache: dict, k_BTHD: jax.Array, v_BTHE: jax.Array, lengths=None) -> dict:
  """The cache with ``k [B, T, H, D]``, ``v [B, T, H, E]`` written at each row's positions
  ``length .. length + T − 1`` and ``length + T``: static shapes (no recompilation per step or per length).

  ``lengths [B]`` (or None: all ``T``): right-padded rows, row ``b``'s tokens past its first ``lengths[b]``
  are padding and its ``length`` grows by ``lengths[b]`` only. The padding's entries are still written, past
  the new length, where no query of a later chunk reads them (a query at position ``p`` reads entries
  ``≤ p``) before the row's next tokens overwrite them.

  Past ``max_len`` nothing wraps: the writes that do not fit are dropped and ``length`` still grows (the
  caller checks lengths on the host; a read past the end sees the first ``max_len`` tokens, finite)."""
  check_kv_cache(cache, k_BTHD, v_BTHE)
  length = cache["length"]
  T = k_BTHD.shape[1]
  grow = T if lengths is None else check_lengths(lengths, length.shape[0], T)
  return {**cache, "k": cache_write(cache["k"], length, k_BTHD), "v": cache_write(cache["v"], length, v_BTHE),
          "length": length + grow}
