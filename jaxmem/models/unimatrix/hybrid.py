"""Recurrent-FFN-Hybrid: the baseline Transformer with each block's FFN replaced by a recurrent
matrix-state memory block (Liu Xiao 2026, arXiv:2604.25930, ``docs/papers/unimatrix.md``).

Pre-LN blocks ``x + Attention(LN x)`` then ``x + MatrixState(LN x)``: attention keeps exact
lookup; the position-wise FFN slot becomes a compact causal recurrence
(:class:`~jaxmem.models.mixers.matrix_state.MatrixStateMixer`, Core's gated outer-product
state). It is a configuration of the one body, :class:`~jaxmem.models.TransformerLM`
(``TransformerConfig(ffn=MatrixStateConfig(...))``): same embedding, positions, final norm and tied
read-out.
"""

from __future__ import annotations

from jaxmem.models.mixers.matrix_state import MatrixStateConfig
from jaxmem.models.mixers.softmax import SoftmaxConfig
from jaxmem.models.transformer import TransformerConfig


def recurrent_ffn_hybrid(*, vocab_size: int = 259, d_model: int = 64, n_layers: int = 3, n_heads: int = 4,
                         state_dim: int = 16, max_len: int = 128, updates: str = "outer", mode: str = "auto",
                         chunk_size: int = 64) -> TransformerConfig:
  """The :class:`~jaxmem.models.TransformerConfig` of the Recurrent-FFN-Hybrid: softmax attention (float32
  matmuls) and, in each block's FFN slot, a matrix-state memory with ``state_dim`` (0: ``d_model //
  n_heads``), ``updates`` ("outer" / "hybrid"), ``mode`` and ``chunk_size``; tied embeddings, learned
  positions. Build it with ``TransformerLM(recurrent_ffn_hybrid(...), rngs=...)``; bad values raise
``ValueError`` from the configs."""
  return TransformerConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                           max_len=max_len, mixer=SoftmaxConfig(precision="highest"),
                           ffn=MatrixStateConfig(state_dim=state_dim, updates=updates, mode=mode,
                                                 chunk_size=chunk_size))


def params_from_legacy(params: dict) -> dict:
  """Parameters saved by the former ``RecurrentFFNHybrid`` module (a nested dict, e.g. restored with Orbax
  without a target) as this configuration's: its ``blocks/memory/...`` are ``blocks/ffn/...``; every other
  path and every value is unchanged (the same initialisation draws, in the same order)."""
  if not isinstance(params, dict) or not isinstance(params.get("blocks"), dict) or \
      "memory" not in params["blocks"]:
    raise ValueError("`params` must be a nested dict with a 'blocks/memory' subtree (a RecurrentFFNHybrid's).")
  blocks = {("ffn" if k == "memory" else k): v for k, v in params["blocks"].items()}
  return {**params, "blocks": blocks}


__all__ = ["params_from_legacy", "recurrent_ffn_hybrid"]
