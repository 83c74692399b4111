"""Packed sequences with a state each: ``cu_seqlens`` with per-sequence initial and final states.

One row (``B = 1``) of ``T`` tokens holds ``N`` sequences, sequence ``n`` the tokens ``cu[n]:cu[n + 1]``
(fla's and FlashAttention's varlen form; empty sequences allowed). Sequence ``n`` starts from ``S_0[n]`` and
ends in its own final state, as if it ran alone, in one pass over the packed tokens whose shapes depend on
``T`` and ``N`` only: traced lengths work under ``jit`` and new lengths do not compile again.

Every sequence gets chunks of its own (fla's varlen chunking): sequence ``n`` takes ``ceil(len_n / C)``
chunks, its tokens copied into them in order, the rest of its last chunk padding (``q = k = v = 0``,
``β = 0``, ``log γ = 0``: the state passes through unchanged and the output is dropped). The scan over chunks
starts each sequence's first chunk from ``S_0[n]`` instead of the carried state, and adds the state after its
last chunk into a carried buffer of final states (zeros until then; an empty sequence keeps ``S_0[n]``); the
outputs are gathered back to the packed positions. The chunked form runs its UT / WY chunks on this layout
(``chunked_scan(..., sequences=...)``), the recurrent form a token-by-token scan inside each chunk.

At most ``(T + N (C − 1)) // C`` chunks, a bound fixed by ``T`` and ``N``, so the work is that of
``T + N·(C − 1)`` tokens: :func:`sequence_chunk` shortens the chunk when ``N·C`` would be a large part of
``T`` (any chunk length gives the same values up to float rounding). Memory beyond the packed call: the
laid-out inputs and the ``N`` final states (no per-chunk or per-token state). Indices are integers (nothing is
subtracted from a cumulative sum of floats). A traced ``cu_seqlens`` is not checked: one that does not rise
from 0 to ``T`` gives unspecified values, never an error (the public functions check a concrete one).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmem.kernels.assoc.chunked import chunked_scan
from jaxmem.kernels.assoc.common import HIGHEST
from jaxmem.kernels.assoc.recurrent import update
from jaxmem.kernels.precision import Matmul


def sequence_chunk(T: int, N: int, chunk_size: int) -> int:
  """The chunk length of the per-sequence layout of ``T`` tokens in ``N`` sequences: ``min(chunk_size, T)``,
  halved while the padding it may need, about ``(N − 1)·C`` tokens, exceeds ``T / 4`` (e.g. ``T = 4096`` in
  64 sequences: 16; one token per sequence, as in decoding: 1)."""
  C = min(chunk_size, T)
  while C > 1 and 4 * (N - 1) * C > T:
    C //= 2
  return C


def sequence_of_token(cu: jax.Array, T: int) -> jax.Array:
  """``n(t)`` ``[T]`` int32: the sequence holding token ``t`` (empty sequences hold none)."""
  t = jnp.arange(T, dtype=jnp.int32)
  return jnp.minimum(jnp.searchsorted(cu[1:], t, side="right"), cu.shape[0] - 2).astype(jnp.int32)


def chunk_layout(cu: jax.Array, T: int, C: int):
  """The per-sequence chunk layout of :mod:`this module <jaxmem.kernels.assoc.varlen>` for ``cu [N + 1]``.

  Returns ``(src, valid, load, store, pos)``: slot ``s`` of the laid-out row (``n_chunks·C`` slots,
  ``n_chunks = (T + N (C − 1)) // C``) holds token ``src[s]`` where ``valid[s]`` (padding elsewhere); chunk
  ``j`` starts sequence ``load[j]`` and ends sequence ``store[j]`` (``N``: none); token ``t`` sits at slot
  ``pos[t]``.
  """
  N = cu.shape[0] - 1
  n_chunks = (T + N * (C - 1)) // C
  per = (cu[1:] - cu[:-1] + C - 1) // C  # chunks of each sequence (0 for an empty one)
  ends = jnp.cumsum(per)
  first = ends - per  # integers: exact
  j = jnp.arange(n_chunks, dtype=jnp.int32)
  seq = jnp.searchsorted(ends, j, side="right").astype(jnp.int32)  # N past the last sequence's chunks
  n = jnp.minimum(seq, N - 1)
  load = jnp.where((seq < N) & (j == first[n]), seq, N)
  store = jnp.where((seq < N) & (j == ends[n] - 1), seq, N)
  slot = jnp.arange(n_chunks * C, dtype=jnp.int32)
  chunk, offset = slot // C, slot % C
  src = cu[n[chunk]] + (chunk - first[n[chunk]]) * C + offset
  valid = (seq[chunk] < N) & (src < cu[n[chunk] + 1])
  t_seq = sequence_of_token(cu, T)
  t_off = jnp.arange(T, dtype=jnp.int32) - cu[t_seq]
  pos = (first[t_seq] + t_off // C) * C + t_off % C
  return jnp.where(valid, src, 0), valid, load, store, pos


def _recurrent_chunks(rule, dot, q, k, v, beta, logg, S0_NHVK, load, store, C):
  """The recurrent form on the laid-out row ``[1, n_chunks·C, H, ·]``: a scan over chunks (loading the start
  states, adding the end states into the final ones as :func:`jaxmem.kernels.assoc.chunked._scan_chunks`) of a
  scan over their tokens, per head -> ``(o [1, n_chunks·C, H, D_v], finals [N, H, D_v, D_k])``."""
  M = S0_NHVK.shape[0]
  gamma = jnp.ones_like(beta) if logg is None else jnp.exp(logg)
  chunks = lambda x: x[0].reshape((-1, C) + x.shape[2:])  # [n_chunks, C, H, ...]

  def head(q, k, v, beta, gamma, states):  # [n_chunks, C, ·] and [M, D_v, D_k]
    def token(S, x):
      q_K, k_K, v_V, b, g = x
      S = update(rule, S, k_K, v_V, b, g, dot)
      return S, dot(S, q_K)  # read after write

    def chunk(carry, x):
      (S, finals), (ld, st, x) = carry, x
      S = jnp.where(ld < M, jax.lax.dynamic_index_in_dim(states, jnp.minimum(ld, M - 1), keepdims=False), S)
      S, o = jax.lax.scan(token, S, x)
      return (S, finals.at[st].add(S, mode="drop")), o

    carry = (jnp.zeros(states.shape[1:], q.dtype), jnp.zeros_like(states))
    (_, finals), o = jax.lax.scan(chunk, carry, (load, store, (q, k, v, beta, gamma)))
    return o, finals

  o, finals = jax.vmap(head, in_axes=(2, 2, 2, 2, 2, 1), out_axes=(2, 1))(
      *(chunks(x) for x in (q, k, v, beta, gamma)), S0_NHVK)
  return o.reshape((1, -1) + o.shape[2:]), finals


def sequences_forward(rule: str, mode: str, chunk_size: int, q, k, v, beta, logg, S0_NHVK, cu,
                      dot: Matmul = HIGHEST):
  """``[1, T, H, ·]`` inputs (accumulation dtype, ``beta`` an array), ``S_0 [N, H, D_v, D_k]``, ``cu [N + 1]``
  int32 -> ``(o [1, T, H, D_v], final states [N, H, D_v, D_k])`` in ``mode`` ``"chunked"`` or
  ``"recurrent"`` (module docstring). No argument checks."""
  if mode not in ("chunked", "recurrent"):
    raise ValueError(f"per-sequence states run in mode 'chunked' or 'recurrent', got {mode!r}.")
  T = q.shape[1]
  C = sequence_chunk(T, cu.shape[0] - 1, chunk_size)
  src, valid, load, store, pos = chunk_layout(cu, T, C)

  def laid_out(x):  # [1, T, ...] -> [1, n_chunks·C, ...], padding 0
    return None if x is None else jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 2)), x[0, src], 0)[None]

  q, k, v, beta, logg = (laid_out(x) for x in (q, k, v, beta, logg))
  if mode == "chunked":
    S0 = jnp.zeros((1,) + S0_NHVK.shape[1:], q.dtype)
    o, _, finals = chunked_scan(q, k, v, beta, logg, S0, rule=rule, chunk_size=C, dot=dot,
                                sequences=(load, store, S0_NHVK))
  else:
    o, finals = _recurrent_chunks(rule, dot, q, k, v, beta, logg, S0_NHVK, load, store, C)
  empty = (cu[1:] == cu[:-1])[:, None, None, None]  # no chunk: the initial state is the final one
  return o[:, pos], jnp.where(empty, S0_NHVK, finals)


__all__ = ["chunk_layout", "sequence_chunk", "sequence_of_token", "sequences_forward"]
