"""Pure memory kernels: no Flax, no globals, no Python loops over time. One module (or package) per
memory, listed in ``jaxmem/kernels/README.md``; every module here is imported below, so a new kernel file is
``jaxmem.kernels.<name>`` with no other edit.

Inference has one shape for every memory that has one: ``state = <module>.init(...)``, then
``state, out = <module>.step(state, ...)`` per token (``assoc``, ``dnc``, ``ssd``, ...).
"""

import importlib
import pkgutil

for _m in pkgutil.iter_modules(__path__):  # every kernel module, also ones added later
  importlib.import_module(f"{__name__}.{_m.name}")

from jaxmem.kernels.ahat import ahat_attention, soft_attention  # noqa: E402
from jaxmem.kernels.assoc import associative_memory  # noqa: E402
from jaxmem.kernels.attention import softmax_attention  # noqa: E402
from jaxmem.kernels.dnc import DNCInterface, DNCState, parse_interface  # noqa: E402
from jaxmem.kernels.sdnc import sdnc_attention, sdnc_cross_attention  # noqa: E402

__all__ = [
    "DNCInterface", "DNCState", "ahat_attention", "associative_memory", "parse_interface", "sdnc_attention",
    "sdnc_cross_attention", "soft_attention", "softmax_attention",
]
