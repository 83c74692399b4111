"""RASP values as the compiler's passes see them: a deterministic order for mixed types, dict keys
that keep ``"1"`` apart from ``1`` (and ``1`` with ``1.0``, as Python does), and calls to
user functions that record a raise instead of failing the compile.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Dict

import numpy as np

MAX_VALUE_SET = 50_000   # larger numerical value sets are refused, not discretised
MAX_PAIRS = 300_000      # a SequenceMap is called on at most this many pairs of input values
MAX_SUMSET_WORK = 1_000_000  # one step of a mean's sum-set adds at most this many pairs


def sort_values(values) -> list:
  """A deterministic order for a value set of mixed types."""
  def key(v):
    if isinstance(v, (bool, int, float, np.number)):   # exact order: 2**53 + 1 after 2**53
      return (0, v.item() if isinstance(v, np.number) else v, "")
    return (1, 0.0, f"{type(v).__name__}:{v!r}")
  return sorted(values, key=key)


def value_key(v: Any):
  """A dict key for a RASP value: strings apart from numbers (``"1"`` is not ``1``), numbers
  by value (``1 == 1.0``: one slot, see :func:`unique_values`), and
  unhashable values (a function's table entries) by ``repr``."""
  try:
    hash(v)
  except TypeError:
    return ("repr", repr(v))
  return ("str", v) if isinstance(v, str) else ("", v)


def unique_values(values, label: str) -> list:
  """The distinct values, sorted. Values that Python calls equal (``True == 1 == 1.0``,
  ``0 == 0.0``) are one value, kept as the first one seen: they share one one-hot slot, as
  they share one key of a dict and behave alike under ``==`` and arithmetic."""
  seen: Dict[Any, Any] = {}
  for v in values:
    try:
      hash(v)
    except TypeError as exc:
      raise ValueError(f"'{label}' takes the unhashable value {v!r}; categorical values must be "
                       "hashable (use a tuple, not a list).") from exc
    seen.setdefault(v, v)
  return sort_values(seen.values())


class _Raises:
  """The value of a function at an input where it raises (treated as unreachable when
  inferring value sets, as tracr does for arithmetic errors; a compiled model that meets
  one at run time raises as the interpreter does)."""

  def __repr__(self):
    return "<raises>"


RAISES = _Raises()


def call_or_raises(f: Callable, *args):
  """``f(*args)``, or :data:`RAISES` when it raises."""
  try:
    return f(*args)
  except Exception:  # noqa: BLE001 - any error of a user function marks the input unreachable
    return RAISES


def is_number(v: Any) -> bool:
  return isinstance(v, (numbers.Real, np.number)) and not isinstance(v, complex)


__all__ = ["MAX_PAIRS", "MAX_SUMSET_WORK", "MAX_VALUE_SET", "RAISES", "call_or_raises", "is_number",
           "sort_values", "unique_values", "value_key"]
