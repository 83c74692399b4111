"""The Transformer baselines UniMatrix is compared with: the paper's, and one of equal parameters.

Used by the UniMatrix experiments (``jaxmem/experiments/unimatrix``) and ``jaxmem bench unimatrix``,
so "the equal-parameter Transformer" means one thing everywhere.
"""

from __future__ import annotations

import math
from typing import Sequence

from jaxmem.models.transformer import TransformerConfig


def paper_transformer_config(vocab_size: int, max_len: int, d_model: int = 64, n_layers: int = 3,
                             n_heads: int = 4) -> TransformerConfig:
  """The paper's baseline (``docs/papers/unimatrix.md``): a pre-LN GELU Transformer, 3 layers at
  ``d_model`` 64, 4 heads, ``d_ff = 4 · d_model`` (174,080 parameters at vocab 259 and T 128; the
  paper's 174,848 adds attention biases)."""
  return TransformerConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                           d_ff=4 * d_model, max_len=max_len)


def transformer_params(cfg: TransformerConfig) -> int:
  """Closed-form parameter count of :class:`~jaxmem.models.TransformerLM` (token inputs, tied read-out,
  learned positions, attention without biases): embeddings, per layer two LayerNorms, ``W_QKV``, ``W_O``
  and the biased FFN, the final LayerNorm."""
  if cfg.input_dim or cfg.output_dim or not cfg.tie_embeddings or cfg.positions != "learned":
    raise ValueError("transformer_params covers token inputs, tied embeddings and learned positions only, "
                     f"got {cfg}.")
  d, f, L = cfg.d_model, cfg.d_ff, cfg.n_layers
  return cfg.vocab_size * d + cfg.max_len * d + L * (4 * d + 4 * d * d + d * f + f + f * d + d) + 2 * d


def matched_transformer(target: int, *, vocab_size: int, max_len: int, d_model: int = 64, n_heads: int = 4,
                        layers: Sequence[int] = (1, 2, 3, 4), d_ff_min: int = 0,
                        d_ff_max: int = 0) -> tuple[TransformerConfig, int]:
  """The Transformer of width ``d_model`` whose parameter count is closest to ``target``.

  Searches ``n_layers`` in ``layers`` and every integer ``d_ff`` in ``[d_ff_min, d_ff_max]`` (defaults
  ``d_model`` and ``8 · d_model``); the count is affine in ``d_ff`` at fixed depth, so the best width
  per depth is one of the two integers around the exact solution. Ties go to the deeper model.
  Returns ``(config, n_params)``.
  """
  d_ff_min = d_ff_min or d_model
  d_ff_max = d_ff_max or 8 * d_model
  base = dict(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, max_len=max_len)
  best = None
  for n_layers in layers:
    p0 = transformer_params(TransformerConfig(n_layers=n_layers, d_ff=d_ff_min, **base))
    slope = transformer_params(TransformerConfig(n_layers=n_layers, d_ff=d_ff_min + 1, **base)) - p0
    ideal = d_ff_min + (target - p0) / slope
    for d_ff in sorted({math.floor(ideal), math.ceil(ideal)}):
      d_ff = min(max(d_ff, d_ff_min), d_ff_max)
      cfg = TransformerConfig(n_layers=n_layers, d_ff=d_ff, **base)
      n = transformer_params(cfg)
      key = (abs(n - target), -n_layers)
      if best is None or key < best[0]:
        best = (key, cfg, n)
  return best[1], best[2]
