"""Parameter helpers the model tests share."""

import jax
import numpy as np
from flax import nnx

from jaxmem.arrays import device_array


def perturb(model, seed: int, scale: float = 0.3) -> None:
  """Adds N(0, scale²) noise to every parameter: non-zero biases and LayerNorm shifts, and no
  zero- or identity-initialised weight (a gate, a convolution's taps) that could hide a path, so that each
  sub-computation visibly moves the outputs."""
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten(state)
  rng = np.random.default_rng(seed)   # on the host: one device program per leaf shape would compile otherwise
  nnx.update(model, jax.tree.unflatten(
      treedef, [device_array(np.asarray(x) + scale * rng.normal(size=x.shape), x.dtype) for x in leaves]))
