"""Every MLP op as a *lane* of ReLU units, and lanes side by side (or stacked, for a fused chain) as one
layer's MLP.

MLPs (one lane per op, lanes side by side; ReLU; depth 1–3):

* categorical input → depth 1: one unit per output value, ``relu(Σ_{v: f(v)=y} x_v)``;
* numerical input ``x`` with sorted value set ``u_0 < … < u_m`` → depth 2 (discretise, then
  clean) for a categorical output, 3 for a numerical one: at each point ``c`` where the
  function's output changes, layer 1 has ``relu(L(x−t)+½) − relu(L(x−t)−½)`` with ``t`` the
  midpoint and ``L = 4/gap`` (≈ 0 or 1 when ``|x − t| ≥ gap/8``, up to the float rounding of
  the large slope), layer 2 cleans it to exactly 0 or 1 (``relu(8s−3) − relu(8s−4)``, whose
  two terms are computed without rounding); segment indicators are differences of
  consecutive steps, and a numerical output reads them through one more ReLU layer so each
  output value is written by a single exact product;
* ``SequenceMap`` → one more layer of pair units ``relu(ind_a + ind_b − 1)`` over the
  operands' indicators (raw one-hots for categorical operands: depth 1, as tracr);
* ``LinearSequenceMap`` of numericals → depth 1, ``c_a(relu(a)−relu(−a)) + c_b(…)``: exact.
* an exact integer input (:class:`ModelError` ``(0, 0)``) needs no clean layer: slope 4 and
  half-integer thresholds keep every term a small multiple of ½, so the steps of layer 1 are
  exactly 0 or 1; an affine ``SequenceMap`` ``α·a + β·b + γ`` of exact integers
  (:func:`affine_lane`) discretises the affine form itself, without a pair table.

A lane shallower than its layer's MLP is carried forward by identity units
(``relu(h) = h`` for ``h ≥ 0``). An MLP-only chain in one layer (:func:`fuse_stages`) stacks
its stages in depth, carrying what later stages read (``relu(x)``, ``relu(−x)``) beside them:
every carried value is exact, so each stage computes what it would in a layer of its own.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.craft.residual import (
  CLEAN_SLOPE,
  EXACT_INT,
  MIN_GAP,
  STEP_SLOPE,
  U32,
  ModelError,
  Residual,
  Space,
  _integers,
  encode,
)
from jaxmem.rasp.passes.graph_to_value_sets import ValueSets
from jaxmem.rasp.passes.values import RAISES, call_or_raises, is_number, value_key


@dataclasses.dataclass
class Unit:
  weights: Dict[int, float]   # input index -> weight (residual dims for layer 0, else units)
  bias: float = 0.0
  bos: Optional[float] = None  # layer-0 weight on the bos dim (None: gate off automatically)


class Lane:
  """One op's MLP: ``layers[j]`` is a list of units reading layer ``j−1``'s units (the
  residual for ``j = 0``); ``out`` maps last-layer units to residual dims."""

  def __init__(self, label: str, stage: int = 0):
    self.label = label
    self.stage = stage      # > 0: reads the outputs of lanes of earlier stages of its MLP
    self.cleanup = False
    self.layers: List[List[Unit]] = []
    self.out: Dict[Tuple[int, int], float] = {}   # (unit, residual dim) -> weight

  def add_layer(self) -> List[Unit]:
    self.layers.append([])
    return self.layers[-1]

  @property
  def depth(self) -> int:
    return len(self.layers)


# A functional is a sparse linear form {index: coefficient} over the residual (depth 0) or
# over the units of the lane's current last layer.
Functional = Dict[int, float]


def _indicators_categorical(space: Space, classes: List[List[int]]) -> List[Functional]:
  """Depth-0 indicators: the sum of the one-hot dims of each class of value positions."""
  return [{space.dims[i]: 1.0 for i in cls} for cls in classes]


def _step_layers(lane: Lane, x: Functional, u: np.ndarray, cuts: List[int], label: str,
                 err: Tuple[float, float] = (0.0, U32), x_bias: float = 0.0):
  """The steps of a numerical discretisation at the change points ``cuts`` (indices into the
  sorted values ``u``; a cut ``c`` separates ``u[c−1]`` from ``u[c]``) of the number
  ``x·residual + x_bias``, whose float32 error is bounded by ``err`` (:class:`ModelError`).
  Returns the last layer's functionals: ``alive`` (1 off BOS) and each step ``s_c``.

  Exact integer input (``err`` 0, integer values): one layer, slope 4, where
  ``relu(4(x−t)+½) − relu(4(x−t)−½)`` is exactly 0 or 1 (every term a small multiple of ½).
  Otherwise two: slope ``4/gap``, then a clean layer (see the module docstring); refused when
  ``err`` is not below a quarter of a gap, or a gap is below :data:`MIN_GAP` of the values."""
  exact = err == (0.0, 0.0) and _integers(u) and _integers(np.asarray([x_bias]))
  l1 = lane.add_layer()
  l1.append(Unit({}, bias=1.0, bos=-2.0))  # alive: relu(1 − 2·bos)
  for c in cuts:
    gap = float(u[c] - u[c - 1])
    scale = max(abs(float(u[c])), abs(float(u[c - 1])))
    if not exact and (gap <= MIN_GAP * scale or err[0] + err[1] * scale > gap / 4):
      raise ValueError(
          f"'{label}' must tell apart the values {u[c - 1]!r} and {u[c]!r} (gap {gap:.3g}), closer "
          f"than its float32 value is known (error up to {err[0] + err[1] * scale:.2g}) or a float32 "
          "step can resolve; the compiled model would not be exact.")
    t = 0.5 * float(u[c] + u[c - 1])
    L = STEP_SLOPE if exact else STEP_SLOPE / gap
    w = {k: L * v for k, v in x.items()}
    l1.append(Unit(dict(w), bias=L * (x_bias - t) + 0.5))
    l1.append(Unit(dict(w), bias=L * (x_bias - t) - 0.5))
  if exact:
    return {0: 1.0}, [{1 + 2 * j: 1.0, 2 + 2 * j: -1.0} for j in range(len(cuts))]
  l2 = lane.add_layer()
  l2.append(Unit({0: 1.0}))  # alive, carried
  steps = []
  for j, _ in enumerate(cuts):
    a, b = 1 + 2 * j, 2 + 2 * j
    # coarse s = h_a − h_b ≈ 0 or 1 (±1e-3: rounding of the large slope). Clean step
    # relu(m − 3) − relu(m − 4) with m = 8s: where s ≈ 1, m ∈ [4, 16) and m − 3, m − 4 are
    # computed exactly (their magnitude is below m's), so the step is exactly 1; where
    # s ≈ 0 both units are off, so it is exactly 0.
    l2.append(Unit({a: CLEAN_SLOPE, b: -CLEAN_SLOPE}, bias=-3.0))
    l2.append(Unit({a: CLEAN_SLOPE, b: -CLEAN_SLOPE}, bias=-4.0))
    steps.append({1 + 2 * j: 1.0, 2 + 2 * j: -1.0})
  return {0: 1.0}, steps


def _segments(u_len: int, cuts: List[int], alive: Functional, steps: List[Functional]):
  """Indicator functionals of the segments between cuts: [0, c_0), [c_0, c_1), …"""
  bounds = [alive] + steps + [{}]
  out = []
  for i in range(len(cuts) + 1):
    f = dict(bounds[i])
    for k, w in bounds[i + 1].items():
      f[k] = f.get(k, 0.0) - w
    out.append(f)
  return out


def _runs(keys: Sequence[Any]) -> Tuple[List[int], List[List[int]]]:
  """Cut points between runs of equal consecutive keys, and the runs."""
  cuts, runs = [], [[0]]
  for i in range(1, len(keys)):
    if keys[i] != keys[i - 1]:
      cuts.append(i)
      runs.append([i])
    else:
      runs[-1].append(i)
  return cuts, runs


def _carry(lane: Lane, fs: List[Functional]) -> List[Functional]:
  """Carries non-negative functionals one layer deeper: one unit ``relu(f)`` each."""
  layer = lane.add_layer()
  out = []
  for f in fs:
    layer.append(Unit(dict(f)))
    out.append({len(layer) - 1: 1.0})
  return out


def _emit(lane: Lane, last: List[Functional], outputs: List[Any], space: Space, direct: bool):
  """Output layer: indicator ``i`` of ``last`` writes ``encode(outputs[i])``. ``direct``:
  the indicators are already last-layer outputs (linear readout); else one ReLU layer of
  ``relu(indicator)`` units is added first."""
  if not direct:
    layer = lane.add_layer()
    keep = []
    for f, y in zip(last, outputs, strict=True):
      enc = encode(space, y)
      if not enc:
        continue
      layer.append(Unit(dict(f)))
      keep.append(({len(layer) - 1: 1.0}, enc))
  else:
    keep = [(f, encode(space, y)) for f, y in zip(last, outputs, strict=True)]
  for f, enc in keep:
    for unit, a in f.items():
      for dim, b in enc.items():
        lane.out[(unit, dim)] = lane.out.get((unit, dim), 0.0) + a * b


class _Operand:
  """How a lane sees one input SOp: its sorted values and a way to build indicators of
  classes of them."""

  def __init__(self, e: rasp.SOp, vs: ValueSets, res: Residual, errors: ModelError):
    self.e, self.space = e, res.spaces[e.unique_id]
    self.err = errors(e) if rasp.is_numerical(e) else (0.0, 0.0)
    if rasp.is_numerical(e):
      raw = vs[e]
      byval: Dict[float, Any] = {}
      for v in raw:
        x = 0.0 if v is None else float(v)
        if x in byval and value_key(byval[x]) != value_key(v) and not (v is None or byval[x] is None):
          raise ValueError(
              f"numerical SOp '{e.label}' holds the values {byval[x]!r} and {v!r}, which are one number "
              f"as floats ({x!r}): a numerical dimension cannot tell them apart. Keep such numbers "
              "categorical, or below 2**53.")
        byval.setdefault(x, v)
      self.u = np.asarray(sorted(byval))
      self.values = [byval[x] for x in self.u]
    else:
      self.values = list(self.space.values)
      self.u = None

  @property
  def numerical(self):
    return self.u is not None


def _operand_indicators(lane: Lane, op: _Operand, keys: List[Any]):
  """Indicators of the classes of ``op``'s values with equal ``keys`` (for categorical
  operands, arbitrary classes; for numerical, runs of the sorted values). Returns
  (depth, indicator functionals, class representative value positions)."""
  if not op.numerical:
    classes: Dict[Any, List[int]] = {}
    order = []
    for i, k in enumerate(keys):
      kk = value_key(k)
      if kk not in classes:
        classes[kk] = []
        order.append(kk)
      classes[kk].append(i)
    cls = [classes[k] for k in order]
    return 0, _indicators_categorical(op.space, cls), [c[0] for c in cls]
  if not keys:   # an empty value set (a function raising on every value): nothing to tell apart
    lane.add_layer().append(Unit({}, bias=1.0, bos=-2.0))
    return 1, [], []
  cuts, runs = _runs([value_key(k) for k in keys])
  if not cuts:
    l1 = lane.add_layer()
    l1.append(Unit({}, bias=1.0, bos=-2.0))
    return 1, [{0: 1.0}], [0]
  alive, steps = _step_layers(lane, {op.space.dims[0]: 1.0}, op.u, cuts, op.e.label, op.err)
  return lane.depth, _segments(len(op.u), cuts, alive, steps), [r[0] for r in runs]


def _raise_dim(e: rasp.SOp, outs, res: Residual) -> None:
  """Gives ``e``'s space a raises dim when its function raises on some input of its lane."""
  sp = res.spaces[e.unique_id]
  if sp.raises is None and any(y is RAISES for y in outs):
    sp.raises = res.add(f"{sp.label}:raises")


def _same(a, b, numerical: bool) -> bool:
  if numerical and a is not RAISES and b is not RAISES and a is not None and b is not None:
    return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
  return value_key(a) == value_key(b) and (a is RAISES) == (b is RAISES)


MAX_ROUNDING_CALLS = 200_000   # calls of a function to prove it constant within its inputs' rounding

_SIGN = np.int64(-2 ** 63)


def _ordered(x: np.ndarray) -> np.ndarray:
  """float64 → int64 keys in the order of the values (consecutive floats, consecutive keys)."""
  i = np.asarray(x, np.float64).view(np.int64)
  return np.where(i < 0, -(i & ~_SIGN), i)


def floats_within(x: float, eps: float, limit: int) -> Optional[np.ndarray]:
  """Every float64 in ``[x − eps, x + eps]`` (ends rounded outwards), or None when more than
  ``limit``: every value the interpreter may hold for a SOp whose exact value is ``x`` and
  whose float error is at most ``eps``."""
  span = _float_span(x, eps)
  if span is None or int(span[1]) - int(span[0]) + 1 > limit:
    return None
  k = np.arange(span[0], span[1] + 1, dtype=np.int64)
  return np.where(k < 0, (-k) | _SIGN, k).view(np.float64)


def _float_span(x: float, eps: float):
  """The ordered keys of the first and last float64 in ``[x − eps, x + eps]`` (None: not finite)."""
  lo = np.nextafter(np.float64(x) - np.float64(eps), -np.inf)
  hi = np.nextafter(np.float64(x) + np.float64(eps), np.inf)
  if not (np.isfinite(lo) and np.isfinite(hi)):
    return None
  klo, khi = _ordered(np.asarray([lo, hi]))
  return int(klo), int(khi)


def _count_all_within(vals: Sequence, bound: Tuple[float, float]) -> float:
  """How many float64 lie within ``bound[0] + bound[1]·|x|`` of each of ``vals``, summed (inf: some
  end is not finite); :func:`floats_within`'s counts, computed for all values at once."""
  if len(vals) > MAX_ROUNDING_CALLS:
    return float(len(vals))   # at least one candidate each: over the limit already
  x = np.asarray([float(v) for v in vals], np.float64)
  eps = np.float64(bound[0]) + np.float64(bound[1]) * np.abs(x)
  with np.errstate(over="ignore", invalid="ignore"):
    lo = np.nextafter(x - eps, -np.inf)
    hi = np.nextafter(x + eps, np.inf)
  if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
    return np.inf
  khi, klo = _ordered(hi), _ordered(lo)
  approx = khi.astype(np.float64) - klo.astype(np.float64)
  with np.errstate(over="ignore"):
    exact = (khi - klo).astype(np.float64)   # wraps only where the span is huge: approx is used there
  return float(np.sum(np.where(approx < 2.0 ** 52, exact, approx) + 1.0))


def check_rounding(e: rasp.SOp, f, ops: Sequence["_Operand"], vs: ValueSets) -> None:
  """A function of SOps whose interpreter values are known only to within rounding (a
  numerical mean of non-integer values, summed left to right in floats; what is computed from
  one) must not change within that rounding. Proved by exhaustion: ``f`` is called on every
  float64 each operand may hold (:func:`floats_within` its bound around each of its values),
  with every value of the other operands, and must give the output it gives at the exact
  values (a numerical ``e``: within 1e-9 relative; the largest change becomes ``e``'s own
  rounding). Raises ``ValueError`` when it changes, or when more than
  :data:`MAX_ROUNDING_CALLS` calls would be needed: the compiled model's exactness cannot be
  proved then, and a compiled model that might disagree with the interpreter is refused."""
  bounds = [vs.rounding.get(op.e.unique_id) if op.numerical else None for op in ops]
  if not any(bounds):
    return
  numerical = rasp.is_numerical(e)
  calls = 1.0   # counted before any candidate is built
  for op, bound in zip(ops, bounds, strict=True):
    vals = [x for x in op.values if x is not None]
    calls *= max(_count_all_within(vals, bound) if bound else len(vals), 1)
  if calls > MAX_ROUNDING_CALLS:
    rounded = next(op for op, b in zip(ops, bounds, strict=True) if b)
    raise _unprovable(e, rounded, None, None, calls)
  per_op = []   # for each operand: [(exact value, candidate floats)]
  calls = 1
  for op, bound in zip(ops, bounds, strict=True):
    rows = []
    n_op = 0
    for x in op.values:
      if x is None:
        continue
      if bound:
        eps = bound[0] + bound[1] * abs(float(x))
        cands = floats_within(float(x), eps, MAX_ROUNDING_CALLS)
        if cands is None:
          raise _unprovable(e, op, x, eps)
        cands = cands.tolist()
      else:
        cands = [x]
      rows.append((x, cands))
      n_op += len(cands)
    per_op.append(rows)
    calls *= max(n_op, 1)
  if calls > MAX_ROUNDING_CALLS:
    rounded = next(op for op, b in zip(ops, bounds, strict=True) if b)
    raise _unprovable(e, rounded, None, None, calls)
  worst = 0.0
  for combo in itertools.product(*per_op):
    exact = [x for x, _ in combo]
    ref = call_or_raises(f, *exact)
    for ts in itertools.product(*[c for _, c in combo]):
      y = call_or_raises(f, *ts)
      if not _same(y, ref, numerical):
        raise ValueError(
            f"'{e.label}' gives {ref!r} at {tuple(exact)!r} but {y!r} at {tuple(ts)!r}, within the float "
            f"rounding of its input(s) {[op.e.label for op, b in zip(ops, bounds, strict=True) if b]} (a "
            "mean of non-integer values, which the interpreter sums in floats): the compiled model and "
            "the interpreter could disagree. Round the input first, or compare with a margin.")
      if numerical and ref is not RAISES and ref is not None and y is not None:
        worst = max(worst, abs(float(y) - float(ref)))
  if numerical and worst:
    vs.rounding[e.unique_id] = (max(vs.rounding.get(e.unique_id, (0.0, 0.0))[0], 2.0 * worst), 0.0)


def _unprovable(e, op, x, eps, calls=None) -> ValueError:
  where = (f"{calls:,.0f} calls" if calls is not None else
           f"more than {MAX_ROUNDING_CALLS:,} floats within ±{eps:.2g} of {x!r}")
  return ValueError(
      f"'{e.label}' reads '{op.e.label}', whose interpreter value is known only to within float "
      f"rounding (a mean of non-integer values, summed in floats); proving '{e.label}' constant "
      f"there takes {where}, so the compiled model cannot be shown to agree with the interpreter. "
      "Round the input first (e.g. Map(lambda x: round(x, 6))), or average integers.")


def map_lane(e: rasp.Map, vs: ValueSets, res: Residual, errors: ModelError) -> Lane:
  lane = Lane(e.label)
  op = _Operand(e.inner, vs, res, errors)
  check_rounding(e, e.f, [op], vs)
  outs = [None if v is None else call_or_raises(e.f, v) for v in op.values]
  _raise_dim(e, outs, res)
  depth, inds, reps = _operand_indicators(lane, op, outs)
  space = res.spaces[e.unique_id]
  # categorical input: one ReLU layer of class indicators. Numerical input: the segment
  # indicators are exact 0/1 already; a categorical output reads them linearly, a
  # numerical one through one more ReLU layer so that each output is one product g·1
  # (exact) rather than a sum of many steps (rounding accumulates).
  _emit(lane, inds, [outs[r] for r in reps], space,
        direct=depth > 0 and space.encoding == "categorical")
  return lane


def width_lane(e: rasp.SelectorWidth, scratch: int, vs: ValueSets, res: Residual,
               N: int) -> Lane:
  lane = Lane(e.label)
  u = np.asarray([1.0 / (w + 1) for w in range(N, -1, -1)])  # ascending: w = N … 0
  ws = list(range(N, -1, -1))
  cuts = list(range(1, len(u)))
  # the head writes 1/(w+1) as one float32 division: one rounding (two, to be safe)
  alive, steps = _step_layers(lane, {scratch: 1.0}, u, cuts, e.label, (0.0, 2 * U32))
  inds = _segments(len(u), cuts, alive, steps)
  space = res.spaces[e.unique_id]
  _emit(lane, inds, ws, space, direct=space.encoding == "categorical")
  return lane


def linear_lane(e: rasp.LinearSequenceMap, res: Residual) -> Lane:
  lane = Lane(e.label)
  layer = lane.add_layer()
  out_dim = res.spaces[e.unique_id].dims[0]
  for sop, c in ((e.fst, e.fst_fac), (e.snd, e.snd_fac)):
    d = res.spaces[sop.unique_id].dims[0]
    layer.append(Unit({d: 1.0}))
    lane.out[(len(layer) - 1, out_dim)] = lane.out.get((len(layer) - 1, out_dim), 0.0) + float(c)
    layer.append(Unit({d: -1.0}))
    lane.out[(len(layer) - 1, out_dim)] = lane.out.get((len(layer) - 1, out_dim), 0.0) - float(c)
  return lane


def sequence_map_lane(e: rasp.SequenceMap, vs: ValueSets, res: Residual, errors: ModelError,
                      budget=None) -> Lane:
  """The table lane: one pair unit ``relu(ind_a + ind_b − 1)`` per pair of operand classes.
  ``budget(n)`` is called with the number of pair units before they are built (it raises
  when the model would be too large)."""
  lane = Lane(e.label)
  a, b = _Operand(e.fst, vs, res, errors), _Operand(e.snd, vs, res, errors)
  check_rounding(e, e.f, [a, b], vs)
  table = [[None if (x is None or y is None) else call_or_raises(e.f, x, y) for y in b.values]
           for x in a.values]
  _raise_dim(e, [y for row in table for y in row], res)
  rows = [tuple(value_key(t) for t in r) for r in table]
  cols = [tuple(value_key(table[i][j]) for i in range(len(a.values))) for j in range(len(b.values))]
  # Operand a's lane layers first, then b's are built in a separate lane and merged.
  lane_b = Lane(e.label)
  da, ia, ra = _operand_indicators(lane, a, rows)
  db, ib, rb = _operand_indicators(lane_b, b, cols)
  depth = max(da, db)
  ia = _pad(lane, ia, da, depth)
  ib = _pad(lane_b, ib, db, depth)
  offset = _merge(lane, lane_b)
  ib = [{k + offset: w for k, w in f.items()} for f in ib] if depth > 0 else ib
  if budget is not None:
    budget(len(ra) * len(rb))
  # pair layer
  layer = lane.add_layer()
  space = res.spaces[e.unique_id]
  for fi, i in zip(ia, ra, strict=True):
    for fj, j in zip(ib, rb, strict=True):
      enc = encode(space, table[i][j])
      if not enc:
        continue
      f = dict(fi)
      for k, w in fj.items():
        f[k] = f.get(k, 0.0) + w
      layer.append(Unit(f, bias=-1.0))
      for dim, val in enc.items():
        lane.out[(len(layer) - 1, dim)] = val
  return lane


def _exact_integer_form(e: rasp.SOp, vs: ValueSets, res: Residual, errors: ModelError):
  """``(values, form)``: ``e``'s integer values and the linear form over the residual that
  holds its value exactly (a numerical dim; ``Σ v·onehot_v`` for a categorical one), or None."""
  sp = res.spaces[e.unique_id]
  if sp.encoding == "numerical":
    vals = [v for v in vs[e] if v is not None]
    form = {sp.dims[0]: 1.0}
    if errors(e) != (0.0, 0.0):
      return None
  else:
    vals, form = list(sp.values), {}
  if not vals or not all(is_number(v) and not isinstance(v, bool) for v in vals) or \
      not _integers(np.asarray([float(v) for v in vals])):
    return None
  if sp.encoding == "categorical":
    form = {dim: float(v) for dim, v in zip(sp.dims, vals, strict=True)}
  return vals, form


def affine_lane(e: rasp.SequenceMap, vs: ValueSets, res: Residual, errors: ModelError,
                maybe_none: Dict[int, bool]) -> Optional[Lane]:
  """A SequenceMap that is ``α·a + β·b + γ`` with integer ``α, β, γ`` on integer operands held
  exactly (``length − 1 − indices``), as one lane over that affine form instead of a table of
  ``|A|·|B|`` pair units: a numerical output is ``relu(z) − relu(−z)``; a categorical one the
  exact one-layer integer steps of :func:`_step_layers` at its ``K`` values (``2K − 1``
  units). None when the function is not such a map (checked on every pair of values, where
  it must not raise), an operand may be None, or the table is cheaper."""
  if maybe_none.get(e.fst.unique_id) or maybe_none.get(e.snd.unique_id):
    return None
  fa, fb = _exact_integer_form(e.fst, vs, res, errors), _exact_integer_form(e.snd, vs, res, errors)
  if fa is None or fb is None or len(fa[0]) < 2 or len(fb[0]) < 2:
    return None
  (va, form_a), (vb, form_b) = fa, fb
  table = [[call_or_raises(e.f, x, y) for y in vb] for x in va]
  flat = [t for row in table for t in row]
  if not all(is_number(t) and not isinstance(t, bool) for t in flat if t is not RAISES) or RAISES in flat:
    return None
  T = np.asarray(table, np.float64)
  xa, xb = np.asarray(va, np.float64), np.asarray(vb, np.float64)
  alpha = (T[1, 0] - T[0, 0]) / (xa[1] - xa[0])
  beta = (T[0, 1] - T[0, 0]) / (xb[1] - xb[0])
  gamma = T[0, 0] - alpha * xa[0] - beta * xb[0]
  if not _integers(np.asarray([alpha, beta, gamma])) or not np.array_equal(
      T, alpha * xa[:, None] + beta * xb[None, :] + gamma):
    return None
  if abs(alpha) * np.max(np.abs(xa)) + abs(beta) * np.max(np.abs(xb)) + abs(gamma) >= EXACT_INT:
    return None
  byval: Dict[float, Any] = {}
  for i in range(len(va)):
    for j in range(len(vb)):
      byval.setdefault(float(T[i, j]), table[i][j])
  u = np.asarray(sorted(byval))
  space = res.spaces[e.unique_id]
  if space.encoding == "categorical" and 2 * len(u) >= len(va) * len(vb):
    return None
  form: Functional = {}
  for f, c in ((form_a, alpha), (form_b, beta)):
    for k, w in f.items():
      form[k] = form.get(k, 0.0) + float(c) * w
  lane = Lane(e.label)
  if space.encoding == "numerical":
    layer = lane.add_layer()
    layer.append(Unit(dict(form), bias=float(gamma)))
    layer.append(Unit({k: -w for k, w in form.items()}, bias=-float(gamma)))
    lane.out[(0, space.dims[0])] = 1.0
    lane.out[(1, space.dims[0])] = -1.0
    return lane
  cuts = list(range(1, len(u)))
  alive, steps = _step_layers(lane, form, u, cuts, e.label, (0.0, 0.0), x_bias=float(gamma))
  _emit(lane, _segments(len(u), cuts, alive, steps), [byval[x] for x in u], space, direct=True)
  return lane


def _pad(lane: Lane, fs: List[Functional], depth: int, target: int) -> List[Functional]:
  while depth < target:
    fs = _carry(lane, fs)
    depth += 1
  return fs


def _merge(lane: Lane, other: Lane) -> int:
  """Puts ``other``'s layers beside ``lane``'s (same depth); returns the unit offset of
  ``other``'s units in the last layer."""
  if other.depth != lane.depth:
    raise AssertionError("lanes of different depths")
  offset = 0
  prev_off = 0
  for j in range(lane.depth):
    off = len(lane.layers[j])
    for unit in other.layers[j]:
      w = unit.weights if j == 0 else {k + prev_off: v for k, v in unit.weights.items()}
      lane.layers[j].append(Unit(w, unit.bias, unit.bos))
    prev_off = off
    offset = off
  return offset


def cleanup_lane(label: str, space: Space, default: Any) -> Lane:
  """Zeroes an aggregate's dims at BOS (its BOS query read the default): ``relu(bos)``."""
  lane = Lane(label + ":bos_cleanup")
  lane.cleanup = True     # adds to dims already in the residual (−default, at BOS only)
  layer = lane.add_layer()
  layer.append(Unit({}, bias=0.0, bos=1.0))
  for dim, val in encode(space, default).items():
    lane.out[(0, dim)] = -val
  return lane


def assemble_mlp(lanes: List[Lane], d: int, x_bos: Optional[np.ndarray] = None
                 ) -> List[Tuple[np.ndarray, np.ndarray]]:
  """Lanes side by side as one dense MLP ``x ↦ W_D relu(… relu(x W_1 + b_1) …) + b_D``.

  ``x_bos`` is the residual this MLP sees at the BOS position (``one``, ``bos``, SelectorWidth
  scratch dims, and the defaults its layer's heads just wrote there): each first-layer unit
  gets the weight on ``bos`` that puts its pre-activation at BOS at exactly −1 or below, so
  every unit is off at BOS and the deeper layers (biases ≤ 0) stay off too."""
  if x_bos is None:
    x_bos = np.zeros(d)
    x_bos[:2] = 1.0
  if not lanes:
    return []
  depth = max(lane.depth for lane in lanes)
  for lane in lanes:  # carry shallow lanes' last layer (non-negative) to the common depth
    while lane.depth < depth:
      last = len(lane.layers[-1])
      layer = lane.add_layer()
      for i in range(last):
        layer.append(Unit({i: 1.0}))
  sizes = [[len(lane.layers[j]) for lane in lanes] for j in range(depth)]
  offs = [np.concatenate([[0], np.cumsum(s)]).astype(int) for s in sizes]
  mats = []
  for j in range(depth):
    n_in = d if j == 0 else int(offs[j - 1][-1])
    W = np.zeros((n_in, int(offs[j][-1])))
    b = np.zeros(int(offs[j][-1]))
    for li, lane in enumerate(lanes):
      in_off = 0 if j == 0 else offs[j - 1][li]
      for ui, unit in enumerate(lane.layers[j]):
        col = offs[j][li] + ui
        for k, w in unit.weights.items():
          W[in_off + k, col] += w
        b[col] = unit.bias
        if j == 0:
          at_bos = unit.bias + sum(w * float(x_bos[k]) for k, w in unit.weights.items())
          W[1, col] += unit.bos if unit.bos is not None else -(max(at_bos, 0.0) + 1.0)
    mats.append((W, b))
  Wout = np.zeros((int(offs[-1][-1]), d))
  for li, lane in enumerate(lanes):
    for (ui, dim), w in lane.out.items():
      Wout[offs[-1][li] + ui, dim] += w
  mats.append((Wout, np.zeros(d)))
  return mats


def _side_by_side(lanes: List[Lane]) -> Tuple[List[List[Unit]], List[int]]:
  """Lanes as one block of layers (shallow lanes carried to the common depth by identity
  units); layer-0 weights are kept as they are (they index what the block reads), deeper
  ones are shifted to the block's unit order. Returns the layers and each lane's offset in
  the last layer."""
  depth = max(ln.depth for ln in lanes)
  layers: List[List[Unit]] = [[] for _ in range(depth)]
  last = []
  for ln in lanes:
    prev = 0
    for j in range(depth):
      off = len(layers[j])
      if j < ln.depth:
        for u in ln.layers[j]:
          w = u.weights if j == 0 else {k + prev: v for k, v in u.weights.items()}
          layers[j].append(Unit(dict(w), u.bias, u.bos))
        n = len(ln.layers[j])
      else:
        n = len(ln.layers[-1])
        layers[j].extend(Unit({prev + i: 1.0}) for i in range(n))
      prev = off
    last.append(prev)
  return layers, last


def fuse_stages(lanes: List[Lane], x_bos: np.ndarray, nonneg: set) -> Lane:
  """One deeper MLP for lanes in stages: a lane of stage ``k ≥ 1`` reads outputs of lanes of
  earlier stages of the same MLP (an MLP-only chain in one layer). Block ``k`` holds stage
  ``k``'s lanes beside identity carries (``relu(h) = h``, ``h ≥ 0``) of what later blocks and
  the output need: the residual dims later stages read (``relu(x)``, and ``relu(−x)`` unless
  the dim is never negative) and ``bos``, and the last units of earlier lanes. A stage-``k``
  lane's first layer reads those carried values exactly where it read the residual and the
  earlier outputs, and gets a weight on the carried ``bos`` that keeps it off at BOS, from
  the residual at BOS (``x_bos``; earlier stages write 0 there, and a default's cleanup
  cancels it: a dim reads as the carried input plus what earlier stages wrote to it)."""
  K = max(ln.stage for ln in lanes)
  by = [[ln for ln in lanes if ln.stage == k] for k in range(K + 1)]
  produced = {dim for ln in lanes if not ln.cleanup for (_, dim) in ln.out}   # new dims, 0 before
  cleaned = {dim for ln in lanes if ln.cleanup for (_, dim) in ln.out}          # 0 at BOS after
  later_reads = [set() for _ in range(K + 1)]   # residual dims read by stages > k
  for k in range(K - 1, -1, -1):
    later_reads[k] = later_reads[k + 1] | {r for ln in by[k + 1] for u in ln.layers[0] for r in u.weights}
  comp = Lane("+".join(ln.label for ln in lanes))
  # block 0: stage-0 lanes and the residual carries
  carry = Lane("carry")
  c0 = carry.add_layer()
  res_units: Dict[int, Functional] = {}
  for r in sorted((later_reads[0] - produced) | {1}):
    c0.append(Unit({r: 1.0}, bos=0.0))
    f = {len(c0) - 1: 1.0}
    if r not in nonneg:
      c0.append(Unit({r: -1.0}, bos=0.0))
      f[len(c0) - 1] = -1.0
    res_units[r] = f
  layers, offs = _side_by_side(by[0] + [carry])
  res_f = {r: {offs[-1] + i: w for i, w in f.items()} for r, f in res_units.items()}
  outs: Dict[Tuple[int, int], float] = {}   # (unit of the current last layer, dim) -> weight
  for ln, off in zip(by[0], offs, strict=False):
    for (u, dim), w in ln.out.items():
      outs[(off + u, dim)] = outs.get((off + u, dim), 0.0) + w
  comp.layers.extend(layers)
  for k in range(1, K + 1):
    prev_out: Dict[int, Functional] = {}
    for (u, dim), w in outs.items():
      prev_out.setdefault(dim, {})[u] = prev_out.get(dim, {}).get(u, 0.0) + w
    staged = []
    for ln in by[k]:
      copy = Lane(ln.label)
      first = copy.add_layer()
      for u in ln.layers[0]:
        w2: Functional = {}
        at_bos = u.bias
        for r, w in u.weights.items():
          # the dim as the next layer would read it: the carried input plus what earlier
          # stages wrote to it
          if r not in produced and r not in cleaned:
            at_bos += w * float(x_bos[r])
          for src in (res_f.get(r, {}), prev_out.get(r, {})):
            for i, v in src.items():
              w2[i] = w2.get(i, 0.0) + w * v
        gate = u.bos if u.bos is not None else -(max(at_bos, 0.0) + 1.0)
        for i, v in res_f[1].items():
          w2[i] = w2.get(i, 0.0) + gate * v
        first.append(Unit(w2, u.bias))
      copy.layers.extend(ln.layers[1:])
      copy.out = dict(ln.out)
      staged.append(copy)
    # carried: the units behind the residual functionals still needed, and every output unit
    keep_res = {r: f for r, f in res_f.items() if r in later_reads[k] or r == 1}
    carried = sorted({i for f in keep_res.values() for i in f} | {u for (u, _) in outs})
    carry = Lane("carry")
    c = carry.add_layer()
    c.extend(Unit({i: 1.0}) for i in carried)
    where = {i: j for j, i in enumerate(carried)}
    layers, offs = _side_by_side(staged + [carry])
    base = offs[-1]
    res_f = {r: {base + where[i]: w for i, w in f.items()} for r, f in keep_res.items()}
    outs = {(base + where[u], dim): w for (u, dim), w in outs.items()}
    for ln, off in zip(staged, offs, strict=False):
      for (u, dim), w in ln.out.items():
        outs[(off + u, dim)] = outs.get((off + u, dim), 0.0) + w
    comp.layers.extend(layers)
  comp.out = outs
  return comp


__all__ = ["Lane", "Unit", "affine_lane", "assemble_mlp", "check_rounding", "cleanup_lane", "fuse_stages",
           "linear_lane", "map_lane", "sequence_map_lane", "width_lane"]
