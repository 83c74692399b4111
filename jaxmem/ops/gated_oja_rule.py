"""fla's ``gated_oja_rule`` ops: ``h_t = D_t h_{t−1} + β_t (k_t − (D_t h_{t−1}) v_t) v_tᵀ``, read
``o_t = scale · h_tᵀ q_t``, on ``h [K, V]`` with ``D_t`` fla's decay of the state's value columns (``gv``).

In jaxmem's layout ``S = hᵀ [V, K]`` this is ``S_t = (I − β_t v_t v_tᵀ) D_t S_{t−1} + β_t v_t k_tᵀ``: Oja's rule
with the value as post-synaptic signal (``oja``, and ``gated_oja`` with one decay per head).

``gv``, in log space:

* ``gv [B, T, HV, V]``, fla's form: a decay per value channel, ``D_t = diag(exp(gv_t))``. jaxmem's kernels have
  one decay per head, so this form runs its own ``lax.scan`` of fla's update, token by token, in both ops
  (``chunk_`` too: no chunked form for it) and the same way eagerly and under ``jit``; grouped value heads,
  ``cu_seqlens`` (with per-sequence states) and ``segment_ids`` as everywhere. The scan is sequential in ``T``
  and its gradient stores a state per token.
* ``gv [B, T, HV]``, a jaxmem addition: one decay per value head (``D_t = exp(gv_t) I``), run by the kernel
  in the op's form (chunked or recurrent). A ``[B, T, HV, V]`` decay whose channels are equal is this one; pass
  it as ``gv[..., 0]`` for the chunked kernel.
* ``gv`` None: no decay (``oja``).

``beta [B, T, HV]``, one per head (fla's per-channel ``beta`` is refused). ``use_q_l2norm`` /
``use_k_l2norm`` as in fla. The state is ``[N, HV, K, V]`` (fla's), the final one float32
(:mod:`jaxmem.ops.common`). Oja erases along ``v`` and needs ``β_t‖v_t‖² <= 2``: like fla, not checked
(normalise ``v``; ``use_k_l2norm`` normalises ``k``, which Oja does not erase along).
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from jaxmem.checks import (
  check_finite_number,
  check_positive_int,
  shape_of,
)
from jaxmem.kernels.assoc import l2_normalize
from jaxmem.kernels.segments import check_cu_seqlens, check_segment_ids, segment_starts
from jaxmem.ops.common import check_gate, check_qkv, run


def _gated_oja(form, q, k, v, gv, beta, scale, initial_state, output_final_state, use_q_l2norm, use_k_l2norm,
               cu_seqlens, segment_ids, chunk_size, op):
  if beta is None:
    raise ValueError(f"{op}: `beta` [B, T, HV] is required.")
  shape_v = shape_of(v)
  if gv is not None and len(shape_v) == 4 and shape_of(gv) not in (shape_v[:3], shape_v):
    raise ValueError(f"`gv` must have shape [B, T, HV] = {shape_v[:3]} (a decay per head) or [B, T, HV, V] = "
                     f"{shape_v} (fla's, a decay per value channel), got {shape_of(gv)}.")
  if gv is not None and len(shape_of(gv)) == 4:
    check_positive_int("chunk_size", chunk_size)
    return _per_channel(q, k, v, gv, beta, scale, initial_state, output_final_state, use_q_l2norm, use_k_l2norm,
                        cu_seqlens, segment_ids, op)
  return run("gated_oja" if gv is not None else "oja", form, q, k, v, beta=beta, g=gv, scale=scale,
             initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
             segment_ids=segment_ids, chunk_size=chunk_size, q_l2norm=use_q_l2norm, k_l2norm=use_k_l2norm,
             op=op)


def _per_channel(q, k, v, gv, beta, scale, initial_state, output_final_state, q_l2norm, k_l2norm, cu_seqlens,
                 segment_ids, op):
  """``gv [B, T, HV, V]``: the checks of :func:`jaxmem.ops.common.run`, then :func:`_per_channel_program`."""
  B, T, H, K, HV, V = check_qkv(q, k, v, initial_state)
  scale = K ** -0.5 if scale is None else check_finite_number("scale", scale)
  check_gate("gv", gv, (B, T, HV, V), "B, T, HV, V")
  check_gate("beta", beta, (B, T, HV), "B, T, HV")
  if cu_seqlens is not None and segment_ids is not None:
    raise ValueError("pass `cu_seqlens` (fla's varlen form, B = 1) or `segment_ids` [B, T], not both.")
  N = B
  if cu_seqlens is not None:
    if B != 1:
      raise ValueError(f"with `cu_seqlens` the batch size must be 1 (sequences packed along T), got B = {B}; "
                       "flatten the batch, or pass `segment_ids` [B, T] instead.")
    check_cu_seqlens(cu_seqlens, T)
    N = shape_of(cu_seqlens)[0] - 1
  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, B, T)
  if initial_state is not None and shape_of(initial_state) != (N, HV, K, V):
    what = "N sequences" if cu_seqlens is not None else "B rows"
    raise ValueError(f"`initial_state` must have shape [N, HV, K, V] = {(N, HV, K, V)} ({what}), got "
                     f"{shape_of(initial_state)}.")
  cu = None if cu_seqlens is None else jnp.asarray(cu_seqlens, jnp.int32)
  return _per_channel_program(q, k, v, gv, beta, initial_state, cu, segment_ids, scale=float(scale),
                              final=bool(output_final_state), q_l2norm=bool(q_l2norm), k_l2norm=bool(k_l2norm))


@functools.partial(jax.jit, static_argnames=("scale", "final", "q_l2norm", "k_l2norm"))
def _per_channel_program(q, k, v, gv, beta, h0, cu, segment_ids, *, scale, final, q_l2norm, k_l2norm):
  """fla's update with a decay per value channel, a ``lax.scan`` over T on ``h [B, HV, K, V]`` in the
  accumulation dtype. Varlen as the kernels' (:mod:`jaxmem.kernels.segments`): with ``segment_ids`` the state
  empties at each later segment's first token and padding neither writes nor reads; with ``cu_seqlens`` (B = 1)
  sequence ``n`` starts from ``h0[n]`` at its first token and its final state is read after its last (an empty
  sequence keeps ``h0[n]``). Sums over a state axis are elementwise products summed in the accumulation dtype
  (no matmul, so no reduced-precision matmul on accelerators)."""
  B, T, H, K = q.shape
  HV, V = v.shape[2:]
  out_dtype = v.dtype
  acc = jnp.promote_types(jnp.result_type(q, k, v), jnp.float32)
  acc = acc if h0 is None else jnp.promote_types(acc, h0.dtype)
  q, k = q.astype(acc), k.astype(acc)
  if q_l2norm:
    q = l2_normalize(q)
  if k_l2norm:
    k = l2_normalize(k)
  q, k = (jnp.repeat(x, HV // H, axis=2) for x in (q * scale, k))  # value head j reads key head j // (HV / H)
  v, gv, beta = v.astype(acc), gv.astype(acc), beta.astype(acc)
  zeros = jnp.zeros((B, HV, K, V), acc)
  t = jnp.arange(T, dtype=jnp.int32)
  if cu is not None:
    N = cu.shape[0] - 1
    n = jnp.searchsorted(cu[1:], t, side="right")  # token t's sequence (N past cu[N] under jit)
    seq = jnp.minimum(n, N - 1)
    valid = (n < N)[None]
    reset = (t == cu[seq])[None] & valid
    end = (t == cu[seq + 1] - 1) & (n < N)
    fresh = jnp.zeros((N, HV, K, V), acc) if h0 is None else h0.astype(acc)
  else:
    seq, end, fresh = jnp.zeros((T,), jnp.int32), jnp.zeros((T,), bool), None
    if segment_ids is None:
      reset, valid = jnp.zeros((B, T), bool), jnp.ones((B, T), bool)
    else:
      reset, valid = segment_starts(segment_ids)

  def step(carry, x):
    h, finals = carry
    q_t, k_t, v_t, g_t, b_t, reset_t, valid_t, seq_t, end_t = x
    start = fresh[seq_t][None] if fresh is not None else zeros
    h = jnp.where(reset_t[:, None, None, None], start, h)
    d = h * jnp.exp(g_t)[:, :, None, :]  # the value columns decay
    err = b_t[..., None] * (k_t - jnp.sum(d * v_t[:, :, None, :], axis=-1))  # β (k − (D h) v)  [B, HV, K]
    new = d + err[..., None] * v_t[:, :, None, :]
    h = jnp.where(valid_t[:, None, None, None], new, h)
    o_t = jnp.where(valid_t[:, None, None], jnp.sum(h * q_t[..., None], axis=2), 0.0)  # hᵀ q  [B, HV, V]
    if finals is not None:
      finals = finals.at[seq_t].set(jnp.where(end_t, h[0], finals[seq_t]))
    return (h, finals), o_t

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  xs = tuple(time_major(x) for x in (q, k, v, gv, beta, reset, valid)) + (seq, end)
  h_start = zeros if h0 is None or cu is not None else h0.astype(acc)
  (h, finals), o = jax.lax.scan(step, (h_start, fresh), xs)
  o = time_major(o).astype(out_dtype)
  return o, ((finals if cu is not None else h) if final else None)


def chunk_gated_oja_rule(q, k, v, gv, beta, scale: Optional[float] = None, initial_state=None,
                         output_final_state: bool = False, use_q_l2norm: bool = False,
                         use_k_l2norm: bool = False,
                         cu_seqlens=None, cu_seqlens_cpu=None, *, segment_ids=None, chunk_size: int = 64):
  """fla's ``chunk_gated_oja_rule``: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``gv`` (module docstring:
  ``[B, T, HV]`` runs the chunked (UT / WY) form, fla's ``[B, T, HV, V]`` a scan), ``beta [B, T, HV]``; returns
  ``(o [B, T, HV, V], final state [N, HV, K, V] or None)``. Oja erases along ``v``: ``β‖v‖² <= 2`` is needed
  and, as in fla, not checked."""
  del cu_seqlens_cpu
  return _gated_oja("chunk", q, k, v, gv, beta, scale, initial_state, output_final_state, use_q_l2norm,
                    use_k_l2norm, cu_seqlens, segment_ids, chunk_size, "chunk_gated_oja_rule")


def fused_recurrent_gated_oja_rule(q, k, v, gv=None, beta=None, scale: Optional[float] = None,
                                   initial_state=None,
                                   output_final_state: bool = False, use_q_l2norm: bool = False,
                                   use_k_l2norm: bool = False, cu_seqlens=None, *, segment_ids=None):
  """fla's ``fused_recurrent_gated_oja_rule`` in the recurrent form; arguments as
  :func:`chunk_gated_oja_rule`."""
  return _gated_oja("fused_recurrent", q, k, v, gv, beta, scale, initial_state, output_final_state,
                    use_q_l2norm,
                    use_k_l2norm, cu_seqlens, segment_ids, 64, "fused_recurrent_gated_oja_rule")
