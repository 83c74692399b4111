"""Host values onto the device without compiling a program.

Outside ``jit``, ``jnp.asarray(np_array, dtype)`` binds a primitive (``stage``, or
``convert_element_type`` when the dtype changes) that JAX compiles once per shape and dtype:
building a model from NumPy weights of 30 shapes runs 30 XLA compilations.
:func:`device_array` casts NumPy values on the host and transfers the result
(``jax.device_put``), which compiles nothing. Everything else goes through ``jnp.asarray``
unchanged, so the function is safe inside ``jit``.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np


def device_array(x: Any, dtype: Optional[Any] = None) -> jax.Array:
  """``x`` as a ``jax.Array`` (of ``dtype`` if given), as ``jnp.asarray(x, dtype)`` returns it.

  NumPy arrays and NumPy scalars (numeric or bool) are cast on the host and transferred to the
  default device, uncommitted. Anything else — JAX arrays, tracers, Python scalars (weakly
  typed), lists, objects with ``__jax_array__`` — is passed to ``jnp.asarray``. The dtype follows
  JAX's rules: with 64-bit mode off a float64 or int64 value or ``dtype`` becomes float32 / int32.
  The result is a copy: later writes to ``x`` do not reach it. One difference from ``jnp.asarray``:
  under ``jax.set_mesh`` with explicit axes, ``jnp.asarray`` places a NumPy value replicated over
  the mesh, while this places it on the default device (both feed a ``jit`` the same way).
  """
  if not isinstance(x, (np.ndarray, np.generic)) or np.asarray(x).dtype.kind not in "biufc":
    return jnp.asarray(x, dtype)
  want = None if dtype is None else jax.dtypes.canonicalize_dtype(jnp.dtype(dtype))
  a = np.asarray(x, dtype=want)
  if np.may_share_memory(a, x):
    a = a.copy()   # device_put may read the buffer after returning: the caller may write to x
  return jax.device_put(a)   # 64-bit host values become 32-bit unless x64, as in jnp.asarray
