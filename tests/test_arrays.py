"""jaxmem.arrays.device_array: what ``jnp.asarray`` returns (dtype, weak type, values), without
compiling a program for host values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.arrays import device_array
from tests.conftest import CompileCounter

HOST_VALUES = [
    np.linspace(-2.5, 3.5, 12).reshape(3, 4),          # float64
    np.arange(7, dtype=np.int64) - 3,
    np.array([True, False, True]),
    np.array([[0.5, -1.25]], np.float16),
    [[1, 2, 3], [4, 5, 6]],                            # nested Python ints
    [0.25, 1.5],
    np.float32(2.5),
    3.0, 2, True,                                      # Python scalars: weakly typed
]
DTYPES = [None, jnp.float32, jnp.int32, bool, jnp.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_same_array_as_jnp_asarray(dtype):
  for x in HOST_VALUES + [jnp.arange(3.0), jnp.ones((2, 2), jnp.int32)]:
    want, got = jnp.asarray(x, dtype), device_array(x, dtype)
    assert isinstance(got, jax.Array)
    assert (got.dtype, got.shape, got.weak_type) == (want.dtype, want.shape, want.weak_type), (x, dtype)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_host_arrays_compile_nothing_and_tracers_pass_through():
  shapes = [(5, 7), (11,), (2, 3, 13)]   # shapes no other test uses: jnp.asarray has not compiled them
  with CompileCounter() as c:
    for shape in shapes:
      for dtype in (None, jnp.float32, jnp.int32, bool):
        device_array(np.ones(shape), dtype)
  assert c.n == 0
  with CompileCounter() as c:   # the counter sees what device_array avoids
    jnp.asarray(np.ones((5, 7)), jnp.float32)
  assert c.n >= 1
  f = jax.jit(lambda x: device_array(x, jnp.float32) * 2)
  np.testing.assert_array_equal(f(np.arange(3)), [0.0, 2.0, 4.0])
