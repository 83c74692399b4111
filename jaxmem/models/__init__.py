"""Flax NNX modules, one file per paper architecture; arithmetic lives in kernels/."""

from jaxmem.models.transformer import TransformerConfig, TransformerLM, count_params

__all__ = ["TransformerConfig", "TransformerLM", "count_params"]
