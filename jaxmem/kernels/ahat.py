"""Average hard attention (AHAT): the attention of exact constructions.

For query ``i`` with scores ``s_ij = q_i · k_j`` over the keys ``j`` it may see, AHAT takes
the *argmax set* ``A_i = {j : s_ij = max_j' s_ij'}`` and averages its values uniformly
(Pérez et al. 2019; Merrill et al. 2022; the simulator paper, Dutta et al. 2025/2026)::

    out_i = (1 / |A_i|) Σ_{j ∈ A_i} v_j.

Ties are the point: a RASP ``Aggregate`` is an AHAT head whose scores are 1 where the
selector holds and 0 elsewhere, so the mean over a selection is the mean over the argmax
set. Where nothing holds every key ties and AHAT averages the whole sequence — the reason
the RASP compiler keeps a BOS key with a score between the two.

Exactness: scores are summed in float32 with ``precision="highest"`` (the default here,
unlike the soft kernels, because exactness is the contract), and ``j ∈ A_i`` is the test
``s_ij >= max_j s_ij - tol``. For the integer and half-integer scores the compiler
produces (|s| < 2**24) the float32 products and sums are exact, so ``tol=0`` gives the
exact argmax set; ``tol > 0`` is for scores computed from real data (the simulator), where
intended ties can differ by rounding. The average is ``Σ_{j∈A} v_j / |A|`` accumulated in
float32: exact for integers below 2**24 divided by the count, else one rounding per add.

Masking: ``causal=True`` lets query ``i`` see keys ``j <= i`` (self-attention, ``T == S``);
``mask_BS`` (True = a real key) removes padded keys. Hidden keys score ``−inf`` and are excluded by a
visibility test, so every visible key, whatever its score (``−inf`` included), outranks them (in the soft
limit, every finite score: see :func:`soft_weights`). A query that
sees no key at all (possible only through ``mask_BS``, or a negative ``q_offset``) returns zeros. A NaN among
a query's visible scores makes its output (and weights) NaN: it propagates, as in softmax attention, instead
of turning into a silent zero.

KV cache: ``causal=True, q_offset=length`` (integers ``[B]``, as in
:func:`jaxmem.kernels.attention.softmax_attention`) reads a cache ``k, v [B, S, H, *]`` of any
``S``: query ``t`` of row ``b`` sees the keys ``j <= q_offset[b] + t`` (and ``mask_BS`` still
applies), so keys written later, or never, are not in any argmax set.

The soft limit :func:`soft_attention` is ``softmax(β·s)`` over the same visible keys: as
``β → ∞`` it tends to AHAT (the tie set shares the mass evenly); tracr's compiled models are
this with β = 100 and a BOS score of 50 — approximately right only.

Gradients: the argmax set is piecewise constant in q and k, so AHAT's gradient with respect
to ``q`` and ``k`` is zero almost everywhere (``stop_gradient`` makes that explicit); with
respect to ``v`` it is the average itself. Train with the soft limit if scores must learn.

Layout: ``q [B, T, H, D]``, ``k [B, S, H, D]``, ``v [B, S, H, E]`` → ``[B, T, H, E]`` (in the
dtype of ``v``, or float32 for integer ``v``: an average of integers is not one); the
arithmetic is written once per head on ``[T, D]`` and vmapped. With ``return_weights=True``
the attention map ``[B, H, T, S]`` (rows sum to 1, or 0 for a query that sees nothing)
comes back as a second output.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from jaxmem.checks import check_finite_number, check_rank
from jaxmem.kernels.attention import check_q_offset, check_qkv
from jaxmem.kernels.precision import matmul_for
from jaxmem.kernels.segments import check_segment_ids, segment_index

__all__ = ["ahat_attention", "ahat_head", "ahat_sublayer", "ahat_weights", "soft_attention", "soft_weights"]


def _visible(T: int, S: int, causal: bool, mask_S: Optional[jax.Array], q_offset=None,
             mask_TS=None) -> jax.Array:
  vis = jnp.ones((T, S), bool)
  if causal and q_offset is not None:
    vis = jnp.arange(S)[None, :] <= jnp.arange(T)[:, None] + q_offset
  elif causal:
    vis = jnp.arange(S)[None, :] <= jnp.arange(T)[:, None]
  if mask_S is not None:
    vis = vis & mask_S[None, :].astype(bool)
  if mask_TS is not None:
    vis = vis & mask_TS
  return vis


def _argmax_set(scores_TS, visible_TS, tol):
  """``(chosen [T, S] 0/1, count [T, 1], nan_row [T, 1])``: the argmax set among the visible keys (hidden
  keys are ``−inf`` and excluded by the visibility test, so any finite or infinite visible score beats them),
  its size (1 where empty), and the rows with a NaN visible score (whose outputs are NaN, not a default)."""
  s = jax.lax.stop_gradient(scores_TS)
  s = jnp.where(visible_TS, s, jnp.asarray(-jnp.inf, s.dtype))
  top = jnp.max(s, axis=-1, keepdims=True)
  chosen = visible_TS & (s >= top - jnp.asarray(tol, s.dtype))
  count = jnp.maximum(jnp.sum(chosen, axis=-1, keepdims=True), 1).astype(s.dtype)
  nan_row = jnp.any(visible_TS & jnp.isnan(s), axis=-1, keepdims=True)
  return jnp.where(chosen, 1.0, 0.0).astype(s.dtype), count, nan_row


def ahat_weights(scores_TS: jax.Array, visible_TS: jax.Array, tol: float = 0.0) -> jax.Array:
  """Uniform weights over each row's argmax set among the visible keys: ``[T, S]`` → ``[T, S]``.

  Rows with no visible key are all zero; rows with a NaN visible score are all NaN."""
  chosen, count, nan_row = _argmax_set(scores_TS, visible_TS, tol)
  return jnp.where(nan_row, jnp.nan, chosen / count)


def soft_weights(scores_TS: jax.Array, visible_TS: jax.Array, beta: float) -> jax.Array:
  """``softmax(β·s)`` over the visible keys (hidden keys are ``−inf``: any finite visible score outweighs them);
  rows with no visible key are all zero; a NaN visible score makes its row NaN, and so does a row whose visible
  scores are all ``−inf`` or hold ``+inf`` (``softmax`` is undefined there, as in ``jax.nn.softmax``; the hard
  :func:`ahat_weights` averages the tied keys)."""
  seen = jnp.any(visible_TS, axis=-1, keepdims=True)
  logits = jnp.where(visible_TS, scores_TS * jnp.asarray(beta, scores_TS.dtype), -jnp.inf)
  w = jax.nn.softmax(jnp.where(seen, logits, 0.0), axis=-1)
  return jnp.where(seen, w, 0.0)


def ahat_head(q_TD, k_SD, v_SE, *, causal: bool = False, mask_S=None, tol: float = 0.0,
              beta: Optional[float] = None, precision: Any = "highest", q_offset=None, mask_TS=None):
  """One head on ``q [T, D]``, ``k [S, D]``, ``v [S, E]`` → (``[T, E]``, weights ``[T, S]``).

  ``beta=None`` is AHAT; a number is the soft limit ``softmax(β·s)``. ``q_offset`` (a scalar int, with
  ``causal``): query ``t`` sees the keys ``j <= q_offset + t``. ``mask_TS`` (bools): which keys each query may
  see besides (packed sequences)."""
  dot = matmul_for(precision)
  acc = jnp.promote_types(jnp.result_type(q_TD, k_SD, v_SE), jnp.float32)
  scores = dot.einsum("td,sd->ts", q_TD.astype(acc), k_SD.astype(acc), preferred_element_type=acc)
  vis = _visible(q_TD.shape[0], k_SD.shape[0], causal, mask_S, q_offset, mask_TS)
  if beta is None:
    # Σ_{j∈A} v_j, then one division by |A|: exact for integer values (sums below 2**24),
    # correctly rounded otherwise up to the sum's own rounding — not Σ fl(1/|A|)·v_j
    chosen, count, nan_row = _argmax_set(scores, vis, tol)
    w = jnp.where(nan_row, jnp.nan, chosen / count)
    out = dot.einsum("ts,se->te", chosen, v_SE.astype(acc), preferred_element_type=acc) / count
    out = jnp.where(nan_row, jnp.nan, out)
  else:
    w = soft_weights(scores, vis, beta)
    out = dot.einsum("ts,se->te", w, v_SE.astype(acc), preferred_element_type=acc)
  # an average of integers is not an integer: integer (or bool) values come back in `acc`
  out_dtype = v_SE.dtype if jnp.issubdtype(v_SE.dtype, jnp.inexact) else acc
  return out.astype(out_dtype), w


def _check(q, k, v, causal, mask_BS, tol, q_offset=None, segment_ids=None):
  B, T, H, D, S = check_qkv(q, k, v)
  if segment_ids is not None:
    if q_offset is not None or T != S:
      raise ValueError("`segment_ids` marks packed sequences in self-attention (as many queries as keys, no "
                       "`q_offset`).")
    check_segment_ids(segment_ids, B, T)
  if q_offset is not None:
    check_q_offset(q_offset, B, causal)
  elif causal and T != S:
    raise ValueError(f"causal AHAT needs as many queries as keys; got q length {T}, k length {S}.")
  if mask_BS is not None:
    Bm, Sm = check_rank("mask_BS", mask_BS, 2, "B, S")
    if (Bm, Sm) != (B, S):
      raise ValueError(f"`mask_BS` must have shape (B, S) = {(B, S)} of the keys, got {(Bm, Sm)}.")
  if check_finite_number("tol", tol) < 0:
    raise ValueError(f"tol must be >= 0, got {tol!r}.")
  return B, T, H, D, S


def _run(q, k, v, causal, mask_BS, tol, beta, precision, return_weights, q_offset=None, segment_ids=None):
  m = mask_BS if mask_BS is not None else jnp.ones(k.shape[:2], bool)
  if segment_ids is not None:  # a query sees its own segment's keys; padding (run −1) sees nothing
    run_BT = segment_index(jnp.asarray(segment_ids, jnp.int32))
    seg_BTS = (run_BT[:, :, None] == run_BT[:, None, :]) & (run_BT[:, None, :] >= 0)
    head = lambda qh, kh, vh, m, mt: ahat_head(qh, kh, vh, causal=causal, mask_S=m, tol=tol, beta=beta,
                                               precision=precision, mask_TS=mt)
    per_b = jax.vmap(head, in_axes=(1, 1, 1, None, None), out_axes=(1, 0))
    out, w = jax.vmap(per_b)(q, k, v, m, seg_BTS)
    return (out, w) if return_weights else out
  if q_offset is not None:
    head = lambda qh, kh, vh, m, o: ahat_head(qh, kh, vh, causal=True, mask_S=m, tol=tol, beta=beta,
                                              precision=precision, q_offset=o)
    per_b = jax.vmap(head, in_axes=(1, 1, 1, None, None), out_axes=(1, 0))
    out, w = jax.vmap(per_b)(q, k, v, m, check_q_offset(q_offset, q.shape[0], causal))
    return (out, w) if return_weights else out
  head = lambda qh, kh, vh, m: ahat_head(qh, kh, vh, causal=causal, mask_S=m, tol=tol,
                                         beta=beta, precision=precision)
  # vmap over heads (axis 1 of [T, H, D]) then batch
  per_b = jax.vmap(head, in_axes=(1, 1, 1, None), out_axes=(1, 0))
  out, w = jax.vmap(per_b, in_axes=(0, 0, 0, 0))(q, k, v, m)
  return (out, w) if return_weights else out


def ahat_attention(q_BTHD, k_BSHD, v_BSHE, *, causal: bool = False, mask_BS=None,
                   tol: float = 0.0, precision: Any = "highest", return_weights: bool = False,
                   q_offset=None, segment_ids=None):
  """Average hard attention ``[B, T, H, D] × [B, S, H, D] × [B, S, H, E] → [B, T, H, E]``.

  Scores are the raw dot products ``q·k`` (no ``1/√D``: scale q if you want it).
  ``return_weights=True`` also returns the attention map ``[B, H, T, S]``. ``q_offset`` (integers ``[B]``,
  with ``causal=True``): query ``t`` of row ``b`` sees the keys ``j <= q_offset[b] + t`` of any ``S`` (a KV
  cache, :func:`jaxmem.kernels.attention.kv_cache_append`). ``segment_ids`` (``[B, T]`` integers,
  self-attention): packed sequences (:mod:`jaxmem.kernels.segments`), a query's argmax set is taken over its
  own segment's keys; padding (id 0) is seen by none and reads zeros."""
  _check(q_BTHD, k_BSHD, v_BSHE, causal, mask_BS, tol, q_offset, segment_ids)
  return _run(q_BTHD, k_BSHD, v_BSHE, causal, mask_BS, float(tol), None, precision, return_weights, q_offset,
              segment_ids)


def soft_attention(q_BTHD, k_BSHD, v_BSHE, *, beta: float, causal: bool = False, mask_BS=None,
                   precision: Any = "highest", return_weights: bool = False, q_offset=None, segment_ids=None):
  """The soft limit of :func:`ahat_attention`: ``softmax(β · q·k)`` over the visible keys (``q_offset`` as
  there)."""
  _check(q_BTHD, k_BSHD, v_BSHE, causal, mask_BS, 0.0, q_offset, segment_ids)
  check_finite_number("beta", beta, positive=True)
  return _run(q_BTHD, k_BSHD, v_BSHE, causal, mask_BS, 0.0, float(beta), precision, return_weights, q_offset,
              segment_ids)


def ahat_sublayer(x_BTD, wq_HDK, wk_HDK, wv_HDV, wo_HVD, *, causal: bool = False, mask_BS=None,
                  tol: float = 0.0, return_scores: bool = False):
  """The attention sublayer of a transformer of AHAT layers with fixed weights (the machine that RASP programs
  compile to and that the universal simulator is written in): the residual update
  ``Σ_h AHAT(x W_Q^h, x W_K^h, x W_V^h) W_O^h`` ``[B, T, D]`` (the caller adds it to ``x``), every product at
  ``precision="highest"``.

  Weights are per head: ``wq, wk [H, D, K]``, ``wv [H, D, V]``, ``wo [H, V, D]``. Returns ``(update, weights
  [B, H, T, T])`` and with ``return_scores`` also the raw scores ``q·k`` ``[B, H, T, T]`` (hidden keys
  included, unmasked)."""
  D = check_rank("x_BTD", x_BTD, 3, "B, T, D")[2]
  H, Dq, K = check_rank("wq_HDK", wq_HDK, 3, "H, D, K")
  shapes = {"wk_HDK": (H, D, K), "wv_HDV": (H, D, None), "wo_HVD": (H, None, D)}
  for name, w in (("wk_HDK", wk_HDK), ("wv_HDV", wv_HDV), ("wo_HVD", wo_HVD)):
    got = check_rank(name, w, 3, name[-3:])
    if any(want is not None and g != want for g, want in zip(got, shapes[name], strict=True)):
      raise ValueError(f"`{name}` has shape {got}; expected {shapes[name]} (None: any) for x of width {D} "
                       f"and {H} heads of key width {K}.")
  if Dq != D or wv_HDV.shape[2] != wo_HVD.shape[1]:
    raise ValueError(f"`wq_HDK` must read the residual width {D} and `wo_HVD` the value width "
                     f"{wv_HDV.shape[2]}; got wq {tuple(wq_HDK.shape)}, wo {tuple(wo_HVD.shape)}.")
  proj = lambda w: jnp.einsum("btd,hdk->bthk", x_BTD, w, precision=jax.lax.Precision.HIGHEST)
  q, k, v = proj(wq_HDK), proj(wk_HDK), proj(wv_HDV)
  o, weights = ahat_attention(q, k, v, causal=causal, mask_BS=mask_BS, tol=tol, precision="highest",
                              return_weights=True)
  update = jnp.einsum("bthv,hvd->btd", o, wo_HVD, precision=jax.lax.Precision.HIGHEST)
  if not return_scores:
    return update, weights
  return update, weights, jnp.einsum("bthk,bshk->bhts", q, k, precision=jax.lax.Precision.HIGHEST)
