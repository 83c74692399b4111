"""fla's ``gated_oja_rule`` ops: ``h_t = D_t h_{t−1} + β_t (k_t − (D_t h_{t−1}) v_t) v_tᵀ``, read
``o_t = scale · h_tᵀ q_t``, on ``h [K, V]`` with ``D_t`` fla's decay of the state's value columns (``gv``).

In jaxmem's layout ``S = hᵀ [V, K]`` this is ``S_t = γ_t (I − β_t v_t v_tᵀ) S_{t−1} + β_t v_t k_tᵀ``: Oja's rule
with the value as post-synaptic signal (``oja``, and ``gated_oja`` with a decay). The semantics map onto
jaxmem's for one decay per value head: ``gv [B, T, HV]`` (log space), or ``gv`` None (no decay). fla's
``gv [B, T, HV, V]``, a decay per value channel, has no jaxmem form yet: it is accepted when its ``V`` entries
are equal (checked when concrete) and refused otherwise. ``beta [B, T, HV]``, one per head (fla's per-channel
``beta`` is refused). ``use_q_l2norm`` / ``use_k_l2norm`` as in fla. The state is ``[N, HV, K, V]`` (fla's).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from jaxmem.checks import is_concrete, shape_of
from jaxmem.ops.common import run


def _gated_oja(form, q, k, v, gv, beta, scale, initial_state, output_final_state, use_q_l2norm, use_k_l2norm,
               cu_seqlens, segment_ids, chunk_size, op):
  if beta is None:
    raise ValueError(f"{op}: `beta` [B, T, HV] is required.")
  if gv is not None and len(shape_of(gv)) == 4:
    if shape_of(gv) != shape_of(v):
      raise ValueError(f"`gv` must have shape [B, T, HV] or [B, T, HV, V] = {shape_of(v)}, got {shape_of(gv)}.")
    if not is_concrete(gv):
      raise ValueError(f"{op}: `gv` [B, T, HV, V] (a decay per value channel) is not supported under jit; pass "
                       "one decay per head, `gv` [B, T, HV].")
    a = np.asarray(gv)
    if not np.all(a == a[..., :1]):
      raise ValueError(f"{op}: a decay per value channel (`gv` [B, T, HV, V] with unequal entries) has no "
                       "jaxmem form yet; pass one decay per head, `gv` [B, T, HV].")
    gv = gv[..., 0]
  return run("gated_oja" if gv is not None else "oja", form, q, k, v, beta=beta, g=gv, scale=scale,
             initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
             segment_ids=segment_ids, chunk_size=chunk_size, q_l2norm=use_q_l2norm, k_l2norm=use_k_l2norm,
             op=op)


def chunk_gated_oja_rule(q, k, v, gv, beta, scale: Optional[float] = None, initial_state=None,
                         output_final_state: bool = False, use_q_l2norm: bool = False,
                         use_k_l2norm: bool = False,
                         cu_seqlens=None, cu_seqlens_cpu=None, *, segment_ids=None, chunk_size: int = 64):
  """fla's ``chunk_gated_oja_rule`` in the chunked (UT / WY) form: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``,
  ``gv`` (module docstring), ``beta [B, T, HV]``; returns ``(o [B, T, HV, V], final state [N, HV, K, V] or
  None)``. Oja erases along ``v``: concrete inputs need ``β‖v‖² <= 2`` (ValueError otherwise)."""
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
