"""fla's op surface in JAX: the names, arguments, layouts and returns of flash-linear-attention's
``fla.ops`` for the associative-memory family, over :func:`jaxmem.kernels.assoc.associative_memory`.

========================================== ========================== =========================================
op                                         update (fla's ``h [K, V]``) jaxmem rule
========================================== ========================== =========================================
``chunk_linear_attn`` / ``fused_recurrent_`` ``h + k vᵀ``              ``hebb`` (+ fla's ``normalize``)
``chunk_simple_gla`` / ``fused_recurrent_``  ``e^g h + k vᵀ``           ``decay`` (``g`` or ``g_gamma``)
``chunk_delta_rule`` / ``fused_recurrent_``  ``h + β k (v − hᵀk)ᵀ``     ``delta``
``chunk_gated_delta_rule`` / ``fused_..``    ``e^g h + β k (v − e^g hᵀk)ᵀ`` ``gated_delta``
``chunk_gated_oja_rule`` / ``fused_..``      ``e^g h + β (k − e^g h v) vᵀ`` ``oja`` / ``gated_oja``
========================================== ========================== =========================================

Every op returns ``(o, final_state or None)`` (normalised linear attention: ``(o, (h or None, z))``, as
fla), the final state in float32 for bfloat16 inputs (fla's dtypes), and reads ``o_t = scale · h_tᵀ q_t``
(``scale`` defaults to ``K ** -0.5``) after writing token ``t``. ``chunk_*`` runs jaxmem's chunked (UT / WY)
form and ``fused_recurrent_*`` its recurrent form (a ``lax.scan`` of the update); both are differentiable in
every argument, ``initial_state`` included, on every backend. Varlen: fla's ``cu_seqlens [N + 1]`` (``B = 1``)
or ``segment_ids [B, T]`` (static shapes, ``B > 1``). Layouts, varlen and what is not supported:
:mod:`jaxmem.ops.common`, each module's docstring, and ``docs/porting_from_fla.md``.
"""

from jaxmem.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
from jaxmem.ops.gated_delta_rule import (
  chunk_gated_delta_rule,
  chunk_gdn,
  fused_recurrent_gated_delta_rule,
  fused_recurrent_gdn,
)
from jaxmem.ops.gated_oja_rule import chunk_gated_oja_rule, fused_recurrent_gated_oja_rule
from jaxmem.ops.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn
from jaxmem.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

__all__ = [
    "chunk_delta_rule", "chunk_gated_delta_rule", "chunk_gated_oja_rule", "chunk_gdn", "chunk_linear_attn",
    "chunk_simple_gla", "fused_recurrent_delta_rule", "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_oja_rule", "fused_recurrent_gdn", "fused_recurrent_linear_attn",
    "fused_recurrent_simple_gla",
]
