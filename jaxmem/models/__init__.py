"""Flax NNX modules: the Transformer body (``transformer``), its token mixers (``mixers/``,
one file per memory), and one file (or package) per paper architecture (``dnc``, ``sdnc``,
``unimatrix``); arithmetic lives in ``jaxmem/kernels/``. ``bodies`` registers the language models an LM
config can name (``model.body``)."""

from jaxmem.models import bodies, mixers
from jaxmem.models.dnc import DNC, DNCLM, DNCConfig, DNCLMConfig
from jaxmem.models.layers import count_params
from jaxmem.models.mixers import AssocConfig, MixerConfig, SDNCConfig, SDNCHybridConfig, SoftmaxConfig
from jaxmem.models.sdnc import EncoderDecoderConfig, SDNCEncoderDecoder, SDNCTransformer, copy_params
from jaxmem.models.transformer import TransformerConfig, TransformerLM
from jaxmem.models.unimatrix import (
    TypedLatentCompressor,
    UniMatrixConfig,
    UniMatrixLM,
)

__all__ = [
    "DNC", "DNCLM", "AssocConfig", "DNCConfig", "DNCLMConfig", "bodies", "EncoderDecoderConfig", "MixerConfig",
    "SDNCConfig", "SDNCEncoderDecoder",
    "SDNCHybridConfig", "SDNCTransformer", "SoftmaxConfig", "TransformerConfig", "TransformerLM", "copy_params",
    "count_params", "mixers",
    "TypedLatentCompressor", "UniMatrixConfig", "UniMatrixLM",
]
