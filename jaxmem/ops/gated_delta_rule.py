"""fla's ``gated_delta_rule`` ops (Gated DeltaNet): ``h_t = γ_t h_{t−1} + β_t k_t (v_t − γ_t h_{t−1}ᵀ k_t)ᵀ``,
read ``o_t = scale · h_tᵀ q_t``, ``γ_t = exp(g_t)`` (jaxmem's ``gated_delta`` rule).

fla's options, same names and meanings:

* grouped value heads: ``v, g, beta`` with ``HV`` heads, a multiple of the ``H`` heads of ``q, k``; value head
  ``j`` uses key head ``j // (HV / H)``;
* ``use_qk_l2norm_in_kernel``: ``q`` and ``k`` L2-normalised (``x / sqrt(Σ x² + 1e-6)``);
* ``use_gate_in_kernel`` with ``A_log [HV]`` and optional ``dt_bias [HV]``: ``g`` is the raw gate and the decay
  ``−exp(A_log) · softplus(g + dt_bias)``;
* ``use_beta_sigmoid_in_kernel``: ``beta`` are logits, ``β = σ(beta)``; with ``allow_neg_eigval``,
  ``β = 2σ(beta) ∈ (0, 2)`` (the erase factor ``1 − β‖k‖²`` may be negative);
* ``state_v_first``: the state ``[N, HV, V, K]`` (jaxmem's layout) instead of ``[N, HV, K, V]``.

fla's per-channel decays ``gk`` / ``gv`` of the recurrent op are not supported (ValueError).

Stable when ``0 <= β_t‖k_t‖² <= 2``: ``use_qk_l2norm_in_kernel=True`` (``‖k_t‖ < 1``) with
``use_beta_sigmoid_in_kernel=True`` (``β < 1``, or ``< 2`` with ``allow_neg_eigval``) guarantees it, as in fla's
``GatedDeltaNet`` layer. Like fla, the op does not check it, eagerly or under ``jit``; the final state is
float32 for bfloat16 inputs (:mod:`jaxmem.ops.common`).
"""

from __future__ import annotations

from typing import Optional

from jaxmem.ops.common import run


def _gated_delta(form, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                 use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                 state_v_first,
                 cu_seqlens, segment_ids, chunk_size, op):
  if use_gate_in_kernel and A_log is None:
    raise ValueError(f"{op}: use_gate_in_kernel=True needs `A_log` [HV].")
  if not use_gate_in_kernel and (A_log is not None or dt_bias is not None):
    raise ValueError(f"{op}: `A_log` / `dt_bias` are only used with use_gate_in_kernel=True.")
  if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
    raise ValueError(f"{op}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (as in fla).")
  if beta is None:
    raise ValueError(f"{op}: `beta` [B, T, HV] is required.")
  return run("gated_delta", form, q, k, v, beta=beta, g=g, scale=scale, initial_state=initial_state,
             output_final_state=output_final_state, cu_seqlens=cu_seqlens, segment_ids=segment_ids,
             chunk_size=chunk_size, state_v_first=state_v_first, q_l2norm=use_qk_l2norm_in_kernel,
             k_l2norm=use_qk_l2norm_in_kernel, beta_sigmoid=use_beta_sigmoid_in_kernel,
             beta_max=2.0 if allow_neg_eigval else 1.0, A_log=A_log if use_gate_in_kernel else None,
             dt_bias=dt_bias, op=op)


def chunk_gated_delta_rule(q, k, v, g, beta, scale: Optional[float] = None, initial_state=None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                           state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None, *,
                           use_gate_in_kernel: bool = False, A_log=None, dt_bias=None, segment_ids=None,
                           chunk_size: int = 64):
  """fla's ``chunk_gated_delta_rule`` in the chunked (UT / WY) form: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``,
  ``g, beta [B, T, HV]`` (``g`` in log space), ``initial_state [N, HV, K, V]``; returns
  ``(o [B, T, HV, V], final state [N, HV, K, V] or None)``. Options: module docstring. Varlen:
  ``cu_seqlens [N + 1]`` (``B = 1``) or ``segment_ids [B, T]`` (:mod:`jaxmem.ops.common`). ``cu_seqlens_cpu``
  is accepted and unused (the shapes depend on ``T`` and ``N`` only; nothing needs the lengths on the host)."""
  del cu_seqlens_cpu
  return _gated_delta("chunk", q, k, v, g, beta, scale, initial_state, output_final_state,
                      use_qk_l2norm_in_kernel,
                      use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                      state_v_first, cu_seqlens, segment_ids, chunk_size, "chunk_gated_delta_rule")


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None,
                                     scale: Optional[float] = None,
                                     initial_state=None, output_final_state: bool = False,
                                     use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel: bool = False,
                                     allow_neg_eigval: bool = False, state_v_first: bool = False,
                                     cu_seqlens=None,
                                     *, segment_ids=None):
  """fla's ``fused_recurrent_gated_delta_rule`` in the recurrent form (a ``lax.scan`` of the update);
  arguments as :func:`chunk_gated_delta_rule`. ``gk`` / ``gv`` (per-channel decays) raise ValueError."""
  if gk is not None or gv is not None:
    raise ValueError("fused_recurrent_gated_delta_rule: the per-channel decays `gk` / `gv` are not supported; "
                     "pass one decay per head, `g` [B, T, HV].")
  return _gated_delta("fused_recurrent", q, k, v, g, beta, scale, initial_state, output_final_state,
                      use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                      allow_neg_eigval, state_v_first, cu_seqlens, segment_ids, 64,
                      "fused_recurrent_gated_delta_rule")


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
