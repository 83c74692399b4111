"""fla's ``delta_rule`` ops (DeltaNet): ``h_t = h_{t−1} + β_t k_t (v_t − h_{t−1}ᵀ k_t)ᵀ``, read
``o_t = scale · h_tᵀ q_t`` (jaxmem's ``delta`` rule). ``beta [B, T, HV]``; ``use_qk_l2norm_in_kernel``
L2-normalises ``q`` and ``k`` (``x / sqrt(Σ x² + 1e-6)``, fla's). Grouped value heads (``HV > H``) as in the
gated op are a jaxmem addition: fla 0.6's ``delta_rule`` needs ``HV = H``.

Stable when ``0 <= β_t‖k_t‖² <= 2``: pass ``use_qk_l2norm_in_kernel=True`` (``‖k_t‖ < 1``) with ``β`` in
``[0, 2]``. Like fla, the op does not check it, eagerly or under ``jit`` (:mod:`jaxmem.ops.common`).
"""

from __future__ import annotations

from typing import Optional

from jaxmem.ops.common import run


def chunk_delta_rule(q, k, v, beta, scale: Optional[float] = None, initial_state=None,
                     output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, cu_seqlens=None,
                     cu_seqlens_cpu=None, *, segment_ids=None, state_v_first: bool = False,
                     chunk_size: int = 64):
  """fla's ``chunk_delta_rule`` in the chunked (UT / WY) form: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``,
  ``beta [B, T, HV]``, ``initial_state [N, HV, K, V]``; returns ``(o [B, T, HV, V], final state or None)``.
  Varlen: ``cu_seqlens [N + 1]`` (``B = 1``) or ``segment_ids [B, T]`` (:mod:`jaxmem.ops.common`)."""
  del cu_seqlens_cpu
  return run("delta", "chunk", q, k, v, beta=beta, scale=scale, initial_state=initial_state,
             output_final_state=output_final_state, cu_seqlens=cu_seqlens, segment_ids=segment_ids,
             chunk_size=chunk_size, state_v_first=state_v_first, q_l2norm=use_qk_l2norm_in_kernel,
             k_l2norm=use_qk_l2norm_in_kernel, op="chunk_delta_rule")


def fused_recurrent_delta_rule(q, k, v, beta=None, scale: Optional[float] = None, initial_state=None,
                               output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                               cu_seqlens=None, *, segment_ids=None, state_v_first: bool = False):
  """fla's ``fused_recurrent_delta_rule`` in the recurrent form; arguments as :func:`chunk_delta_rule` (``beta``
  None is 1)."""
  return run("delta", "fused_recurrent", q, k, v, beta=beta, scale=scale, initial_state=initial_state,
             output_final_state=output_final_state, cu_seqlens=cu_seqlens, segment_ids=segment_ids,
             state_v_first=state_v_first, q_l2norm=use_qk_l2norm_in_kernel, k_l2norm=use_qk_l2norm_in_kernel,
             op="fused_recurrent_delta_rule")
