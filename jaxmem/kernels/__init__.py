"""Pure memory kernels: no Flax, no globals, no Python loops over time.

* :mod:`~jaxmem.kernels.attention` — softmax attention (write-once memory, fast form).
* :mod:`~jaxmem.kernels.sdnc` — the same memory run literally as a stateless DNC.
* :mod:`~jaxmem.kernels.dnc` — the full DNC memory access (Graves et al. 2016).
"""

from jaxmem.kernels import attention, dnc, sdnc
from jaxmem.kernels.attention import softmax_attention
from jaxmem.kernels.dnc import DNCInterface, DNCState, dnc_init, dnc_scan, dnc_step, parse_interface
from jaxmem.kernels.sdnc import sdnc_attention, sdnc_cross_attention

__all__ = [
    "DNCInterface", "DNCState", "attention", "dnc", "dnc_init", "dnc_scan", "dnc_step",
    "parse_interface", "sdnc", "sdnc_attention", "sdnc_cross_attention", "softmax_attention",
]
