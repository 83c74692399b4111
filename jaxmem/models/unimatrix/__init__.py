"""The UniMatrix family (Liu Xiao 2026, arXiv:2604.25930; ``docs/papers/unimatrix.md``).

* :class:`UniMatrixConfig` / :class:`UniMatrixLM` — the shared-depth matrix-state LM with
  variants ``core``, ``rosa``, ``discovery``, ``dense_memory`` (the paper's UniMatrix-Assoc),
  ``sparse_pointer`` as presets (:mod:`.config`, :mod:`.model`);
* :class:`TypedLatentCompressor` and :func:`triple_latent` — the three-token benchmark's
  typed (benchmark-aware) and generic latent models (:mod:`.latent`; the generic one is a
  :class:`~jaxmem.models.TransformerConfig`);
* :func:`recurrent_ffn_hybrid` — the baseline Transformer with its FFN replaced by a
  recurrent memory block: a :class:`~jaxmem.models.TransformerConfig` (:mod:`.hybrid`).
"""

from jaxmem.models.unimatrix.config import PRESETS, ROSA_SOURCES, VARIANTS, UniMatrixConfig
from jaxmem.models.unimatrix.hybrid import recurrent_ffn_hybrid
from jaxmem.models.unimatrix.latent import (
    TypedLatentCompressor,
    TypedLatentConfig,
    triple_latent,
    triple_latent_params_from_legacy,
)
from jaxmem.models.unimatrix.model import UniMatrixBlock, UniMatrixLM, param_breakdown

__all__ = [
    "PRESETS", "ROSA_SOURCES", "VARIANTS", "TypedLatentCompressor", "TypedLatentConfig", "UniMatrixBlock",
    "UniMatrixConfig", "UniMatrixLM", "param_breakdown", "recurrent_ffn_hybrid", "triple_latent",
    "triple_latent_params_from_legacy",
]
