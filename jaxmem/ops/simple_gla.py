"""fla's ``simple_gla`` ops: ``h_t = exp(g_t) h_{t−1} + k_t v_tᵀ``, ``o_t = scale · q_tᵀ h_t`` (jaxmem's
``decay`` rule; ``hebb`` with neither gate). ``g [B, T, H]`` is a per-token log decay, ``g_gamma [H]`` a
constant one per head (RetNet); at most one of the two. Grouped value heads (``v``, ``g`` with ``HV`` a
multiple of the ``H`` heads of ``q, k``) are a jaxmem addition: fla 0.6's ``simple_gla`` needs ``HV = H``.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp

from jaxmem.checks import check_floating, shape_of
from jaxmem.ops.common import run


def _simple_gla(form, q, k, v, g, g_gamma, scale, initial_state, output_final_state, state_v_first, cu_seqlens,
                segment_ids, reverse, chunk_size, op):
  if reverse:
    raise ValueError(f"{op}: reverse=True is not supported (flip T, and cu_seqlens, before the call).")
  if g is not None and g_gamma is not None:
    raise ValueError(f"{op}: pass `g` [B, T, H] or `g_gamma` [H], not both.")
  if g_gamma is not None:
    H = shape_of(v)[2] if len(shape_of(v)) == 4 else None
    if shape_of(g_gamma) != (H,):
      raise ValueError(f"`g_gamma` must have shape [H] = {(H,)}, got {shape_of(g_gamma)}.")
    check_floating(g_gamma=g_gamma)
    g = jnp.broadcast_to(jnp.asarray(g_gamma), shape_of(v)[:3])
  return run("decay" if g is not None else "hebb", form, q, k, v, g=g, scale=scale, initial_state=initial_state,
             output_final_state=output_final_state, cu_seqlens=cu_seqlens, segment_ids=segment_ids,
             chunk_size=chunk_size, state_v_first=state_v_first, op=op)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale: Optional[float] = None, initial_state=None,
                     output_final_state: bool = False, state_v_first: bool = False, cu_seqlens=None,
                     cu_seqlens_cpu=None, *, segment_ids=None, chunk_size: int = 64):
  """fla's ``chunk_simple_gla`` in the chunked form: ``q, k [B, T, H, K]``, ``v [B, T, H, V]``, ``g [B, T, H]``
  or ``g_gamma [H]`` (log space), ``initial_state [N, H, K, V]`` (``[N, H, V, K]`` with ``state_v_first``);
  returns ``(o [B, T, H, V], final state or None)``. ``cu_seqlens_cpu`` is accepted and unused."""
  del cu_seqlens_cpu
  return _simple_gla("chunk", q, k, v, g, g_gamma, scale, initial_state, output_final_state, state_v_first,
                     cu_seqlens, segment_ids, False, chunk_size, "chunk_simple_gla")


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale: Optional[float] = None, initial_state=None,
                               output_final_state: bool = False, reverse: bool = False,
                               state_v_first: bool = False,
                               cu_seqlens=None, *, segment_ids=None):
  """fla's ``fused_recurrent_simple_gla`` in the recurrent form; arguments as :func:`chunk_simple_gla`
  (``reverse=True`` is refused)."""
  return _simple_gla("fused_recurrent", q, k, v, g, g_gamma, scale, initial_state, output_final_state,
                     state_v_first, cu_seqlens, segment_ids, reverse, 64, "fused_recurrent_simple_gla")
