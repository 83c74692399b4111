"""Host values onto the device without compiling a program.

Outside ``jit``, ``jnp.asarray(np_array)`` binds a primitive (``stage``, or
``convert_element_type`` when a dtype is given) that JAX compiles once per shape and dtype:
building a model from NumPy weights of 30 shapes runs 30 XLA compilations.
:func:`device_array` converts on the host with NumPy and transfers the result
(``jax.device_put``), which compiles nothing. JAX arrays and tracers go through
``jnp.asarray`` unchanged, so the function is safe inside ``jit``.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np


def device_array(x: Any, dtype: Optional[Any] = None) -> jax.Array:
  """``x`` as a ``jax.Array`` (of ``dtype`` if given), as ``jnp.asarray(x, dtype)`` returns it.

  NumPy arrays, NumPy scalars and nested lists are converted on the host and transferred;
  JAX arrays, tracers and Python scalars are passed to ``jnp.asarray`` (a cast of a JAX array
  to another dtype is a device computation; a Python scalar stays weakly typed). The dtype
  follows JAX's rules: with 64-bit mode off a float64 or int64 host value becomes float32 /
  int32, as ``jnp.asarray`` would make it.
  """
  if isinstance(x, (jax.Array, jax.core.Tracer, bool, int, float, complex)):
    return jnp.asarray(x, dtype)   # Python scalars stay weakly typed, as JAX types them
  # device_put makes the dtype canonical (64-bit host values become 32-bit unless x64), as jnp.asarray does
  return jax.device_put(np.asarray(x, dtype=None if dtype is None else jnp.dtype(dtype)))
