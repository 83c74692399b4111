"""Argument checks for public boundaries.

Every public function validates its inputs here and raises ``ValueError`` naming the
argument and the shapes it saw, so that users never meet a bare XLA shape error from
deep inside a ``lax.scan``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp


def shape_of(x: Any) -> tuple[int, ...]:
  return tuple(getattr(x, "shape", ()))


def is_concrete(x: Any) -> bool:
  """Whether ``x``'s values are known here (not a tracer inside ``jit`` / ``grad`` / ``vmap``): the checks on
  values (ranges, finiteness) run only then; under a transformation they cannot, and each caller documents
  what happens instead."""
  return not isinstance(x, jax.core.Tracer)


def check_rank(name: str, x: Any, rank: int, layout: str) -> tuple[int, ...]:
  """Raises unless ``x`` has ``rank`` dimensions; ``layout`` names them, e.g. 'B, T, H, D'."""
  shape = shape_of(x)
  if len(shape) != rank:
    raise ValueError(
        f"`{name}` must have rank {rank} [{layout}], got shape {shape} (rank {len(shape)})."
    )
  return shape


def check_equal(what: str, **named: int) -> None:
  """Raises unless all named sizes agree, e.g. ``check_equal('heads', q=4, k=2)``."""
  values = set(named.values())
  if len(values) > 1:
    seen = ", ".join(f"{k}={v}" for k, v in named.items())
    raise ValueError(f"mismatched {what}: {seen}.")


@functools.lru_cache(maxsize=None)
def _is_floating(dtype) -> bool:
  """``jnp.issubdtype(dtype, jnp.floating)``, cached: the checks run on every eager call of a kernel."""
  return bool(jnp.issubdtype(dtype, jnp.floating))


def check_floating(**arrays: Any) -> None:
  """Raises unless every named array (None skipped) has a floating dtype, e.g. ``check_floating(q=q, k=k)``.

  Reads dtypes only, so it works on tracers inside ``jit`` as well as on concrete arrays. For the float
  inputs of kernels, which would otherwise compute in, or round their outputs back to, an integer dtype.
  """
  for name, x in arrays.items():
    if x is None:
      continue
    dtype = getattr(x, "dtype", None)
    if dtype is None:
      try:
        dtype = jnp.result_type(x)  # Python scalars
      except TypeError:
        raise ValueError(f"`{name}` must be a floating array, got a {type(x).__name__}.") from None
    if not _is_floating(dtype):
      raise ValueError(
          f"`{name}` must be floating, got dtype {dtype}; pass float32, bfloat16, ... "
          f"(e.g. `{name}.astype(jnp.float32)`)."
      )


def check_positive_int(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
  return value


def check_config_ints(config: Any, names: Sequence[str], *, allow_zero: bool = False) -> None:
  """Raises ``ValueError`` ("Owner.field must be a positive integer, ...") for a config dataclass."""
  owner = type(config).__name__
  for name in names:
    value = getattr(config, name)
    ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    if not ok:
      kind = "a non-negative" if allow_zero else "a positive"
      raise ValueError(f"{owner}.{name} must be {kind} integer, got {value!r}.")


def check_finite_number(name: str, value: Any, *, positive: bool = False) -> float:
  try:
    v = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"`{name}` must be a number, got {value!r}.") from None
  if not math.isfinite(v) or (positive and v <= 0):
    kind = "a finite positive" if positive else "a finite"
    raise ValueError(f"`{name}` must be {kind} number, got {value!r}.")
  return v


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
  if value not in choices:
    raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}.")
  return value
