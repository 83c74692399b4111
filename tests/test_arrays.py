"""jaxmem.arrays.device_array: what ``jnp.asarray`` returns (dtype, weak type, values), without
compiling a program for NumPy values; and associative_memory, which uses it, compiling one program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.arrays import device_array
from jaxmem.kernels.assoc import associative_memory
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


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype")   # jnp.asarray on int64 / float64 without x64
@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("dtype", DTYPES + [jnp.int64, jnp.float64], ids=str)
def test_same_array_as_jnp_asarray(dtype, x64):
  with jax.enable_x64(x64):
    for x in HOST_VALUES + [jnp.arange(3.0), jnp.ones((2, 2), jnp.int32), [np.float16(0.5), 1.0]]:
      want, got = jnp.asarray(x, dtype), device_array(x, dtype)
      assert isinstance(got, jax.Array)
      assert (got.dtype, got.shape, got.weak_type) == (want.dtype, want.shape, want.weak_type), (x, dtype)
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_result_is_a_copy():
  for _ in range(10):   # the transfer may still be reading x when the call returns: a race, so repeated
    x = np.ones((1 << 20,), np.float32)
    got = device_array(x)
    x[:] = 7.0
    assert np.all(np.asarray(got) == 1.0)


def test_host_arrays_compile_nothing_and_tracers_pass_through():
  shapes = [(5, 7), (11,), (2, 3, 13)]
  with CompileCounter() as c:
    for shape in shapes:
      for dtype in (None, jnp.float32, jnp.int32, bool):
        device_array(np.ones(shape), dtype)
  assert c.n == 0
  with CompileCounter() as c:   # the counter is live: a fresh function always compiles
    jax.jit(lambda x: x * 3)(np.ones((5, 7)))
  assert c.n >= 1
  f = jax.jit(lambda x: device_array(x, jnp.float32) * 2)
  np.testing.assert_array_equal(f(np.arange(3)), [0.0, 2.0, 4.0])


def test_an_eager_associative_memory_call_is_one_program():
  """Defaults, broadcasts and casts run inside the kernel's one jitted program: an eager call with
  NumPy inputs compiles at most that program, and new values of the same shapes compile nothing."""
  r = np.random.default_rng(0)
  B, T, H, Dk, Dv = 1, 7, 3, 5, 6    # odd sizes, so that no earlier test has compiled them
  q, k = (r.normal(size=(B, T, H, Dk)).astype(np.float32) for _ in range(2))
  v = r.normal(size=(B, T, H, Dv)).astype(np.float32)
  beta, decay = r.uniform(0.1, 0.9, (B, T, H)), r.uniform(0.5, 1.0, (B, T, H))
  kw = dict(rule="gated_delta", mode="chunked", chunk_size=4, normalize_keys=True)
  for S0 in (None, np.zeros((B, H, Dv, Dk))):
    with CompileCounter() as first:
      associative_memory(q, k, v, beta, decay=decay, initial_state=S0, **kw)
    with CompileCounter() as again:
      S1 = None if S0 is None else S0 + 1
      associative_memory(q, k, v, beta / 2, decay=decay ** 2, initial_state=S1, **kw)
    assert first.n <= 1 and again.n == 0, (first.n, again.n)
