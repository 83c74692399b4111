"""Token mixers: one NNX module per memory, found by name (``mixers.names()``; the table and the contract
in ``jaxmem/models/mixers/README.md``).

Adding a memory is adding one file here (and its kernel in :mod:`jaxmem.kernels`): a frozen config dataclass
subclassing :class:`MixerConfig` (``name = dataclasses.field(default="<name>", init=False)``, and
:meth:`MixerConfig.state_floats`), a module subclassing :class:`Mixer` built as ``(cfg, *, d_model, n_heads,
n_layers, dtype, rngs)`` that maps ``[B, T, d_model]`` to ``[B, T, d_model]`` causally, its parameters
annotated with logical axes (:mod:`jaxmem.models.layers`, :func:`jaxmem.sharding.param`), and
``register("<name>", ConfigCls, ModuleCls)`` at the bottom. Every module in this package is imported below,
so nothing else needs editing: ``TransformerConfig(mixer=MyConfig())`` and config files
(``model.mixer.name = "<name>"``) find it by name, the mesh layout and weight decay follow its annotations,
and ``tests/models/test_mixer_contract.py`` checks it.
"""

from __future__ import annotations

import importlib
import pkgutil

from jaxmem.models.mixers.registry import (
  REGISTRY,
  Mixer,
  MixerConfig,
  build,
  default_dict,
  lookup,
  names,
  register,
)

for _m in pkgutil.iter_modules(__path__):  # each mixer module registers itself
  importlib.import_module(f"{__name__}.{_m.name}")

from jaxmem.models.mixers.ahat import AHATAttention, AHATConfig  # noqa: E402
from jaxmem.models.mixers.assoc import AssocConfig, AssociativeMemory  # noqa: E402
from jaxmem.models.mixers.matrix_state import MatrixStateConfig, MatrixStateMixer  # noqa: E402
from jaxmem.models.mixers.qkv import QKVMixer  # noqa: E402
from jaxmem.models.mixers.sdnc import SDNCConfig, SDNCHybrid, SDNCHybridConfig, SDNCRead  # noqa: E402
from jaxmem.models.mixers.softmax import SoftmaxAttention, SoftmaxConfig  # noqa: E402
from jaxmem.models.mixers.ssd import Mamba2, SSDConfig  # noqa: E402
from jaxmem.models.mixers.topk_memory import TopKMemory, TopKMemoryConfig  # noqa: E402

__all__ = [
    "REGISTRY", "AHATAttention", "AHATConfig", "AssocConfig", "AssociativeMemory", "Mamba2",
    "MatrixStateConfig", "MatrixStateMixer", "Mixer", "MixerConfig", "QKVMixer", "SDNCConfig", "SDNCHybrid",
    "SDNCHybridConfig", "SDNCRead", "SSDConfig", "SoftmaxAttention", "SoftmaxConfig", "TopKMemory",
    "TopKMemoryConfig", "build", "default_dict", "lookup", "names", "register",
]
