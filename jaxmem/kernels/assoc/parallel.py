"""Parallel form: the whole sequence at once (masked quadratic form; one UT chunk for delta).

Per head, ``Q, K [T, D_k]``, ``V [T, D_v]``, ``β, log γ [T]``, in the key×value layout
``S̃ = Sᵀ [D_k, D_v]``. hebb / decay::

    O = ((Q Kᵀ) ⊙ M ⊙ causal)(β ⊙ V) + diag(G) Q S̃_0,   M_ti = Π_{i<s≤t} γ_s,  G_t = Π_{s≤t} γ_s
    S̃_T = G_T S̃_0 + (diag(G_T / G) K)ᵀ (β ⊙ V)

with ``M`` and ``G`` from segment sums of ``log γ`` (:func:`jaxmem.kernels.assoc.common.decay_mask`;
hebb is ``γ = 1``). delta / gated_delta: the chunked UT form with one chunk spanning the sequence
(``O(T²)`` memory, ``O(T³)`` inverse; its rounding error grows with ``T``, see the README). oja and
gated_oja have no parallel form (``ValueError``).

Tested: ``tests/kernels/test_assoc_numerics.py::test_parallel_head_computes_its_rule`` (against
the recurrent form), ``test_assoc.py::test_hebb_parallel_is_causal_linear_attention``,
``test_assoc_numerics.py::test_parallel_decay_keeps_float32_accuracy_on_long_sequences`` and
``::test_parallel_delta_rules_at_T_2048``.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmem.checks import check_choice
from jaxmem.kernels.assoc.chunked import chunked_head
from jaxmem.kernels.assoc.common import HIGHEST, OJA_RULES, RULES, decay_mask
from jaxmem.kernels.precision import Matmul


def parallel_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, *, rule: str, dot: Matmul = HIGHEST):
  """One head in the parallel form; returns ``(o [T, D_v], S_T [D_v, D_k])``.

  hebb/decay: ``O = ((Q Kᵀ) ⊙ M ⊙ causal)(β ⊙ V) + diag(G) Q S̃_0``; delta/gated_delta:
  the UT form with one chunk of length ``T`` (see :mod:`jaxmem.kernels.assoc.chunked`); oja
  has none (``ValueError``). Inputs in the accumulation dtype; no argument checks.
  """
  check_choice("rule", rule, RULES)
  if rule in OJA_RULES:
    raise ValueError(f"rule={rule!r} has no parallel form; use chunked_head(..., chunk_size=T).")
  T = q_TK.shape[0]
  if rule in ("delta", "gated_delta"):
    return chunked_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, rule=rule, chunk_size=T, dot=dot)
  St_KV = S_VK.T
  causal_TT = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
  scores_TT = dot(q_TK, k_TK.T)
  bv_TV = beta_T[:, None] * v_TV
  if rule == "hebb":
    o_TV = dot(jnp.where(causal_TT, scores_TT, 0.0), bv_TV) + dot(q_TK, St_KV)
    return o_TV, (St_KV + dot(k_TK.T, bv_TV)).T
  m_TT, G_T, kend_T, G_end = decay_mask(logg_T)  # M is 0 above the diagonal
  o_TV = dot(scores_TT * m_TT, bv_TV) + G_T[:, None] * dot(q_TK, St_KV)
  return o_TV, (G_end * St_KV + dot((kend_T[:, None] * k_TK).T, bv_TV)).T
