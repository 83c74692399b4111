"""Flax NNX modules, one file per paper architecture; arithmetic lives in kernels/."""

from jaxmem.models.dnc import DNC, DNCConfig
from jaxmem.models.sdnc import EncoderDecoderConfig, SDNCEncoderDecoder, SDNCTransformer, copy_params
from jaxmem.models.transformer import TransformerConfig, TransformerLM, count_params

__all__ = [
    "DNC", "DNCConfig", "EncoderDecoderConfig", "SDNCEncoderDecoder", "SDNCTransformer",
    "TransformerConfig", "TransformerLM", "copy_params", "count_params",
]
