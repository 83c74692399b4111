"""Pure memory kernels: no Flax, no globals, no Python loops over time."""

from jaxmem.kernels import attention
from jaxmem.kernels.attention import softmax_attention

__all__ = ["attention", "softmax_attention"]
