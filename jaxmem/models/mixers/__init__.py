"""Token mixers: one NNX module per memory, found by name.

=============== =============================== ============================================
name            config / module                 arithmetic
=============== =============================== ============================================
``softmax``     ``SoftmaxConfig`` /             :func:`jaxmem.kernels.attention.softmax_attention`
                ``SoftmaxAttention``
``ahat``        ``AHATConfig`` /                :func:`jaxmem.kernels.ahat.ahat_attention` (hard) or
                ``AHATAttention``               :func:`jaxmem.kernels.ahat.soft_attention` (``beta`` set)
``sdnc``        ``SDNCConfig`` / ``SDNCRead``   :func:`jaxmem.kernels.sdnc.sdnc_attention`
``sdnc_hybrid`` ``SDNCHybridConfig`` /          :func:`jaxmem.kernels.sdnc.sdnc_hybrid_attention`
                ``SDNCHybrid``
``assoc``       ``AssocConfig`` /               :func:`jaxmem.kernels.assoc.associative_memory`
                ``AssociativeMemory``
``matrix_state`` ``MatrixStateConfig`` /        :func:`jaxmem.kernels.matrix_state.matrix_state`
                ``MatrixStateMixer``            (UniMatrix's gated matrix state)
``topk_memory`` ``TopKMemoryConfig`` /          :func:`jaxmem.kernels.topk_memory.topk_memory_read`
                ``TopKMemory``                  (UniMatrix-Assoc's dense memory)
=============== =============================== ============================================

Adding a memory is adding one file here: a frozen config dataclass subclassing
:class:`MixerConfig` (with ``name = dataclasses.field(default="<name>", init=False)``), a
module ``(cfg, *, d_model, n_heads, n_layers, dtype, rngs)`` mapping ``[B, T, d_model]`` to
``[B, T, d_model]`` causally (subclass :class:`~jaxmem.models.mixers.qkv.QKVMixer` for the
q/k/v projections), and ``register("<name>", ConfigCls, ModuleCls)`` at the bottom. Every
module in this package is imported below, so nothing else needs editing:
``TransformerConfig(mixer=MyConfig())`` and config files (``model.mixer.name = "<name>"``)
find it by name.
"""

from __future__ import annotations

import importlib
import pkgutil

from jaxmem.models.mixers.registry import REGISTRY, MixerConfig, build, default_dict, lookup, names, register

for _m in pkgutil.iter_modules(__path__):  # each mixer module registers itself
  importlib.import_module(f"{__name__}.{_m.name}")

from jaxmem.models.mixers.ahat import AHATAttention, AHATConfig  # noqa: E402
from jaxmem.models.mixers.assoc import AssocConfig, AssociativeMemory  # noqa: E402
from jaxmem.models.mixers.matrix_state import MatrixStateConfig, MatrixStateMixer  # noqa: E402
from jaxmem.models.mixers.qkv import QKVMixer, ShortConv  # noqa: E402
from jaxmem.models.mixers.sdnc import SDNCConfig, SDNCHybrid, SDNCHybridConfig, SDNCRead  # noqa: E402
from jaxmem.models.mixers.softmax import SoftmaxAttention, SoftmaxConfig  # noqa: E402
from jaxmem.models.mixers.topk_memory import TopKMemory, TopKMemoryConfig  # noqa: E402

__all__ = [
    "REGISTRY", "AHATAttention", "AHATConfig", "AssocConfig", "AssociativeMemory", "MatrixStateConfig",
    "MatrixStateMixer", "MixerConfig", "QKVMixer", "SDNCConfig", "SDNCHybrid", "SDNCHybridConfig", "SDNCRead",
    "ShortConv", "SoftmaxAttention", "SoftmaxConfig", "TopKMemory", "TopKMemoryConfig", "build", "default_dict",
    "lookup", "names", "register",
]
