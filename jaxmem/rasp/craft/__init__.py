"""The building blocks of a compiled model, as numpy arrays (tracr's ``craft/``): the residual space
and the float32 error bounds (:mod:`~jaxmem.rasp.craft.residual`), one AHAT head per attention op
(:mod:`~jaxmem.rasp.craft.attention`), one lane of ReLU units per MLP op and the lanes of a layer as
one MLP (:mod:`~jaxmem.rasp.craft.mlp`). :mod:`jaxmem.rasp.passes.schedule_to_craft` puts them
together.

Residual space (named dimensions, fixed order): ``one`` (1 everywhere), ``bos`` (1 at the
BOS position only), then every SOp in graph order — a categorical SOp ``s`` gets one
dimension ``s:v`` per value ``v`` (one-hot; all zero means ``None``), a numerical SOp one
dimension ``s`` — and the scratch dimension ``s:1/(w+1)`` of each SelectorWidth.
**Invariant**: after every layer, every SOp dimension is exactly 0 at the BOS position
(embeddings write nothing there; every head's BOS query reads the BOS key, whose value is
the op's default, removed again by the same layer's MLP when non-zero; every first-layer
MLP unit gets a ``bos`` weight that holds its pre-activation at BOS at −1 or below, computed
from the exact residual that MLP sees at BOS, so no MLP writes there).
"""
