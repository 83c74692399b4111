"""The eager stability check of ``associative_memory`` / ``step`` (``check_stability``): large device arrays are
reduced on the device (one small program, one read-back of four numbers), numpy inputs and small device arrays
in numpy, and every path refuses the same inputs with the same ``ValueError``.

Inputs: unit keys and values ``[1, T, 2, 32]``, ``T = 512`` (32,768 elements: the device path) or ``T = 4`` (the
numpy path), as device arrays and as numpy arrays; grouped value heads (``β`` with 4 heads for 2 key heads)."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.assoc import _DEVICE_CHECK_SIZE, check_stability


def unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def make(T, kind):
  r = np.random.default_rng(3)
  k = unit(r.normal(size=(1, T, 2, 32))).astype(np.float32)
  beta = r.uniform(0.1, 1.9, (1, T, 4)).astype(np.float32)
  return (k, beta) if kind == "numpy" else (jnp.asarray(k), jnp.asarray(beta))


PATHS = [(512, "device"), (4, "device"), (512, "numpy")]  # device arrays large and small, numpy arrays


def test_the_large_case_takes_the_device_path():
  assert 512 * 2 * 32 >= _DEVICE_CHECK_SIZE > 4 * 2 * 32


@pytest.mark.parametrize("T,kind", PATHS)
def test_every_path_passes_the_stable_and_refuses_the_same_inputs(T, kind):
  k, beta = make(T, kind)

  def at(x, value):  # x with one entry set to value
    if kind == "device":
      return x.at[0, 1, 1].set(value)
    x = x.copy()
    x[0, 1, 1] = value
    return x

  check_stability("delta", beta, k, k, False)  # β‖k‖² in (0.1, 1.9): passes
  check_stability("oja", 2.0, k, k, False)  # β = 2, unit values: the edge passes
  check_stability("delta", beta, 10.0 * k, k, True)  # normalize_keys: ‖k‖² read as 1
  # the worst β_t‖k_t‖² in float64 (unit keys: ‖k‖² = 1 up to rounding), as the message prints it
  b64 = np.asarray(beta, np.float64)
  cases = [
      (("delta", 1.5 * beta, k, k, False),
       rf"rule 'delta' diverges unless 0 <= beta_t·‖k_t‖² <= 2 .* got {1.5 * b64.max():.4g} "),
      (("gated_delta", -beta, k, k, False), rf"diverges .* got {-b64.max():.4g} "),
      (("oja", beta, k, 1.5 * k, False), r"rule 'oja' diverges unless 0 <= beta_t·‖v_t‖² <= 2"),
      (("delta", at(beta, np.nan), k, k, False), r"`beta` must be finite, got value\(s\) such as \[nan"),
      (("delta", beta, at(k, np.inf), k, False), r"`k` must be finite for rule 'delta'"),
      (("gated_oja", beta, k, at(k, np.nan), False), r"`v` must be finite for rule 'gated_oja'"),
      (("delta", beta, 1e20 * k, k, False), r"diverges"),  # a finite key whose square overflows float32
      (("hebb", at(beta, np.inf), k, k, False), r"`beta` must be finite"),  # every rule checks β
  ]
  for args, match in cases:
    with pytest.raises(ValueError, match=match):
      check_stability(*args)
