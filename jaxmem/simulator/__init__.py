"""The universal simulator of attention (Dutta, Chakrabarty, Ansari & Das, arXiv:2506.18739 v2).

A transformer ``U`` of average-hard-attention (AHAT) layers with fixed weights that takes the
parameters of any single-layer attention (Theorem 6) or encoder layer (Corollary 6.1) ``T``
*as data*, together with an input ``X [n, D]``, and outputs ``T(X)``; one ``U`` serves every
``n <= max_len``. See ``jaxmem/simulator/README.md`` for the construction, the layer table,
the input layout, sizes and measured errors.

* :func:`build_simulator` → :class:`Simulator` (``sim(params, X)``, ``sim.encode``,
  ``sim.run_sequence``, ``sim.weights``, ``sim.layers``, ``sim.layout``, ...).
* :class:`AttentionParams`, :func:`attention_layer`; :class:`EncoderParams`,
  :func:`encoder_layer` — the layers simulated, computed directly.
* :func:`error_table` — U's measured error against the direct computation.
* :mod:`~jaxmem.simulator.constructions` — the paper's exact building blocks (transpose,
  matrix product, softmax, ReLU, MaxMin, 3×3 determinant and inverse) as AHAT programs.
* :mod:`~jaxmem.machine` — the residual-stream machine both are written in.
"""

from jaxmem.simulator import constructions
from jaxmem.simulator.reference import (
    AttentionParams,
    EncoderParams,
    attention_layer,
    attention_layer_numpy,
    encoder_layer,
    encoder_layer_numpy,
)
from jaxmem.simulator.universal import (
    ErrorRow,
    Simulator,
    SimulatorLayout,
    build_simulator,
    error_table,
    random_params,
)

__all__ = [
    "AttentionParams", "EncoderParams", "ErrorRow", "Simulator", "SimulatorLayout", "attention_layer",
    "attention_layer_numpy", "build_simulator", "constructions", "encoder_layer", "encoder_layer_numpy",
    "error_table", "random_params",
]
