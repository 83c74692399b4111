"""The residual space (:class:`Residual`: named dimensions and each SOp's :class:`Space`; the layout
and its BOS invariant are described in :mod:`jaxmem.rasp.craft`), how a value is written into it
(:func:`encode`), and the float32 error bound of every numerical SOp (:class:`ModelError`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.passes.graph_to_value_sets import ValueSets
from jaxmem.rasp.passes.values import RAISES, value_key

TIE_TOL = 0.25
STEP_SLOPE = 4.0       # L·gap: the step is saturated at ±2 at the neighbouring values
CLEAN_SLOPE = 8.0
MIN_GAP = 1e-5         # relative: closer values cannot be told apart by a float32 step
U32 = 2.0 ** -24       # float32 unit roundoff
EXACT_INT = 2 ** 20    # integers below this, times 4 and plus ½, stay exact in float32


@dataclasses.dataclass
class Space:
  """How one SOp is laid out in the residual."""
  label: str
  encoding: str               # "categorical" | "numerical"
  dims: List[int]
  values: List[Any]           # categorical: the value of each dim; numerical: []
  raises: Optional[int] = None  # a dim set to 1 where the SOp's function raises (see passes.RAISES)

  def position(self, value: Any) -> Optional[int]:
    if not hasattr(self, "_index"):
      self._index = {value_key(v): i for i, v in enumerate(self.values)}
    return self._index.get(value_key(value))


class Residual:
  def __init__(self):
    self.names: List[str] = []
    self.spaces: Dict[int, Space] = {}
    self._labels: set = set()

  def add(self, name: str) -> int:
    self.names.append(name)
    return len(self.names) - 1

  def add_sop(self, e: rasp.SOp, values: Optional[list]) -> Space:
    label = e.label
    if label in self._labels:  # two SOps of one name: keep residual names unique
      label = f"{label}#{e.unique_id}"
    self._labels.add(label)
    if rasp.is_numerical(e):
      sp = Space(label, "numerical", [self.add(label)], [])
    else:
      values = [v for v in values if v is not None]  # None is the zero vector
      sp = Space(label, "categorical", [self.add(f"{label}:{v}") for v in values], list(values))
    self.spaces[e.unique_id] = sp
    return sp

  @property
  def width(self) -> int:
    return len(self.names)


def encode(space: Space, value: Any) -> Dict[int, float]:
  """The residual vector of ``value`` in ``space`` (None: zero; RAISES: the raises dim)."""
  if value is None:
    return {}
  if value is RAISES:
    return {space.raises: 1.0}
  if space.encoding == "numerical":
    if not (isinstance(value, (int, float, bool, np.number))):
      raise ValueError(f"numerical SOp '{space.label}' takes the non-numerical value "
                       f"{value!r}; numerical SOps must be numbers (or bools).")
    v = float(value)
    return {space.dims[0]: v} if v != 0.0 else {}
  i = space.position(value)
  if i is not None:
    return {space.dims[i]: 1.0}
  raise ValueError(f"value {value!r} is not in the value set of '{space.label}'.")


def _integers(u: np.ndarray) -> bool:
  return bool(u.size == 0 or (np.all(u == np.round(u)) and np.max(np.abs(u)) < EXACT_INT))


class ModelError:
  """A bound ``(a, r)`` on how far a numerical SOp's float32 value in the compiled model can
  be from its exact value ``x``: ``|x̃ − x| ≤ a + r·|x|``. ``(0, 0)`` means exact (integers
  written by one product, or sums of such below :data:`EXACT_INT`).

  * indices, SelectorWidth: exact integers; tokens, Full, Map / SequenceMap tables: the value
    written by one product ``1·y``, so ``y`` rounded to float32 once (exact for integers);
  * ``LinearSequenceMap`` ``c_a·a + c_b·b``: the inputs' errors times ``|c|``, plus three
    roundings of the terms (exact for integer coefficients and exact integer inputs);
  * numerical ``Aggregate``: the mean of exact integers is one rounded division; otherwise the
    input's error, plus a float32 sum of up to ``N`` terms (``N·u·max|v|``) and the division.

  The discretising steps of :func:`_step_layers` use it: a step between two values is built
  only if this error stays below a quarter of their gap (and the gap is at least
  :data:`MIN_GAP` relative, for the step's own rounding)."""

  def __init__(self, vs: ValueSets):
    self.vs = vs
    self.memo: Dict[int, Tuple[float, float]] = {}

  def _values(self, e) -> np.ndarray:
    if rasp.is_numerical(e):
      return self.vs.numbers(e)
    return np.asarray([float(v) for v in self.vs[e] if v is not None and not isinstance(v, str)
                       and isinstance(v, (int, float, np.number))], np.float64)

  def __call__(self, e: rasp.SOp) -> Tuple[float, float]:
    if e.unique_id not in self.memo:
      self.memo[e.unique_id] = self._bound(e)
    return self.memo[e.unique_id]

  def _bound(self, e: rasp.SOp) -> Tuple[float, float]:
    if isinstance(e, (rasp.IndicesType, rasp.SelectorWidth)):
      return (0.0, 0.0)
    if isinstance(e, rasp.LinearSequenceMap) and rasp.is_numerical(e.fst) and rasp.is_numerical(e.snd):
      total, exact, mag = 0.0, True, 0.0
      for c, fac in ((e.fst, e.fst_fac), (e.snd, e.snd_fac)):
        a, r = self(c)
        m = float(np.max(np.abs(self._values(c)), initial=0.0))
        total += abs(fac) * (a + r * m)
        mag += abs(fac) * m
        exact &= (a, r) == (0.0, 0.0) and float(fac) == round(float(fac)) and _integers(self._values(c))
      if exact and mag < EXACT_INT:
        return (0.0, 0.0)
      return (total + 3 * U32 * mag, 0.0)
    if isinstance(e, rasp.Aggregate):
      src = self._values(e.sop)
      m = float(np.max(np.abs(src), initial=0.0))
      a, r = self(e.sop) if rasp.is_numerical(e.sop) else (0.0, 0.0 if _integers(src) else U32)
      if (a, r) == (0.0, 0.0) and _integers(src) and self.vs.N * m < 2 ** 24:
        return (0.0, 2 * U32)       # an exact integer sum, one division (two roundings, to be safe)
      return (a + r * m + (self.vs.N + 1) * U32 * m, 2 * U32)
    return (0.0, 0.0 if _integers(self._values(e)) else U32)


__all__ = ["CLEAN_SLOPE", "EXACT_INT", "encode", "MIN_GAP", "ModelError", "Residual", "STEP_SLOPE", "Space",
           "TIE_TOL", "U32"]
