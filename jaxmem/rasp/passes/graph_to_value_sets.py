"""Pass 3, the normal-form graph → the finite value set of every SOp that needs one (:class:`ValueSets`:
categorical SOps, and numerical SOps an MLP must discretise), from ``vocab`` and ``max_seq_len``; a
LinearSequenceMap's without calling it on every pair (vectorised, or from the joint sums of two means
over one selector); and which SOps may be None (:func:`maybe_none`, :func:`check_none`).
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.passes.rasp_to_graph import selector_key
from jaxmem.rasp.passes.values import (
  MAX_PAIRS,
  MAX_SUMSET_WORK,
  MAX_VALUE_SET,
  RAISES,
  call_or_raises,
  is_number,
  sort_values,
  unique_values,
  value_key,
)


def _exact_in_float64(v) -> bool:
  return not isinstance(v, (int, np.integer)) or isinstance(v, bool) or abs(int(v)) <= 2 ** 53


class ValueSets:
  """Value sets, computed on demand and memoised: ``vs[node]`` is a sorted list.

  tokens: the vocab; indices: ``0..N−1``; Full: ``{fill}``; Map / SequenceMap: the image of
  the input sets (``f`` is called on every value / pair, once); SelectorWidth: ``0..N``;
  categorical Aggregate: its value's set (plus the default); numerical Aggregate: every
  mean of 1..N values of its input's set (a sum-set recursion on numpy arrays), plus the
  default (0 for None). A declared ``value_set`` annotation is checked, not trusted."""

  def __init__(self, vocab: Sequence[Any], max_seq_len: int, max_pairs: int = MAX_PAIRS):
    self.vocab = list(vocab)
    self.N = max_seq_len
    self.max_pairs = max_pairs   # input pairs a SequenceMap's function is called on, at most
    self.memo: Dict[int, list] = {}
    self.images: Dict[int, Any] = {}   # unchecked value sets (see image), or the ValueError raised
    # numerical SOp -> (a, r): the interpreter's value of exact value x is within a + r·|x|
    self.rounding: Dict[int, tuple] = {}

  def __getitem__(self, e: rasp.SOp) -> list:
    if e.unique_id not in self.memo:
      vs = self._inferred(e)
      declared = e._annotations.get("value_set")
      if declared is not None:
        extra = [v for v in vs if v not in declared]
        if extra:
          raise ValueError(
              f"'{e.label}' takes values {sort_values(extra)[:8]} outside its declared "
              f"value_set {sort_values(declared)[:8]}: its function leaves the value set.")
      if rasp.is_numerical(e):
        bad = [v for v in vs if not is_number(v)]
        if bad:
          raise ValueError(f"numerical SOp '{e.label}' takes non-numerical values {bad[:5]}; "
                           "numerical SOps must be numbers (or bools).")
      self.memo[e.unique_id] = vs
    return self.memo[e.unique_id]

  def image(self, e: rasp.SOp) -> list:
    """``e``'s values, None included, without the checks of ``vs[e]`` (a numerical Map may return
    None: :func:`maybe_none` asks)."""
    if e.unique_id in self.memo:
      return self.memo[e.unique_id]
    return self._inferred(e)

  def _inferred(self, e: rasp.SOp) -> list:
    """``_infer(e)`` once per compile: its result, or the ValueError it raised, is kept."""
    if e.unique_id not in self.images:
      try:
        self.images[e.unique_id] = self._infer(e)
        if isinstance(e, rasp.LinearSequenceMap):
          self._linear_rounding(e)
      except ValueError as exc:
        self.images[e.unique_id] = exc
    out = self.images[e.unique_id]
    if isinstance(out, ValueError):
      raise out
    return out

  def numbers(self, e: rasp.SOp) -> np.ndarray:
    """A numerical SOp's value set as sorted float64 (None counts as 0)."""
    vals = [0.0 if v is None else float(v) for v in self[e]]
    return np.unique(np.asarray(vals, np.float64))

  def _image(self, e, pairs) -> list:
    """The values ``e.f`` takes on ``pairs``; inputs where it raises are left out (value
    sets over-approximate: such an input may never occur, e.g. ``1 / (n − i)`` at ``n = i``)."""
    out = [call_or_raises(e.f, *args) for args in pairs]
    return unique_values([y for y in out if y is not RAISES], e.label)

  def _infer(self, e: rasp.SOp) -> list:
    if isinstance(e, rasp.TokensType):
      return unique_values(self.vocab, "vocab")
    if isinstance(e, rasp.IndicesType):
      return list(range(self.N))
    if isinstance(e, rasp.Full):
      return [e.fill]
    if isinstance(e, rasp.Map):
      return self._image(e, [(x,) for x in self[e.inner] if x is not None])
    if isinstance(e, rasp.LinearSequenceMap):
      out = self._linear(e)
      if out is not None:
        return out
    if isinstance(e, rasp.SequenceMap):
      a, b = self[e.fst], self[e.snd]
      if len(a) * len(b) > self.max_pairs:
        raise ValueError(f"SequenceMap '{e.label}' has {len(a)}×{len(b)} input pairs, more "
                         f"than max_pairs={self.max_pairs:,}; declare smaller value sets (or raise "
                         "rasp.compile's max_pairs, at the cost of slower refusals).")
      return self._image(e, [(x, y) for x in a for y in b if x is not None and y is not None])
    if isinstance(e, rasp.SelectorWidth):
      return list(range(self.N + 1))
    if isinstance(e, rasp.Aggregate):
      if rasp.is_categorical(e):
        values = list(self[e.sop])
        if not at_most_one(e.selector, self):
          _check_equal_means(e, values, self.N)
        return unique_values(values + ([] if e.default is None else [e.default]), e.label)
      return [float(v) for v in self._means(e)]
    raise ValueError(f"no value set for {type(e).__name__} '{e.label}'.")

  def _linear(self, e: rasp.LinearSequenceMap) -> Optional[list]:
    """The values of ``c_a·a + c_b·b`` without calling it on every pair of value sets: for two
    numerical means over the same selector (tracr's ``opens − closes``) from the sums both
    means can have together; for other numbers, one vectorised outer sum. None: not numbers."""
    a, b, ca, cb = e.fst, e.snd, e.fst_fac, e.snd_fac
    # the joint sums hold only for a numerical result: a categorical one is a table over the
    # pairs of the two value sets (its lane's), so its value set is every pair's
    if rasp.is_numerical(e) and all(
        isinstance(x, rasp.Aggregate) and rasp.is_numerical(x) and is_number(x.default)
        for x in (a, b)) and selector_key(a.selector) == selector_key(b.selector):
      out = self._joint_means(e)
      if out is not None:
        return out
    va, vb = self[a], self[b]
    if not all(is_number(v) for v in va + vb) or len(va) * len(vb) > 20 * MAX_VALUE_SET:
      return None
    if not all(_exact_in_float64(v) for v in va + vb + [ca, cb]):
      return None    # Python's exact integers: the generic image calls the function
    xa = np.asarray([float(v) for v in va])[:, None]
    xb = np.asarray([float(v) for v in vb])[None, :]
    out = np.unique((ca * xa + cb * xb).ravel())
    if out.size > MAX_VALUE_SET:
      raise ValueError(f"LinearSequenceMap '{e.label}' takes {out.size} values, more than "
                       f"{MAX_VALUE_SET}; declare smaller value sets.")
    ints = all(isinstance(v, (int, np.integer)) for v in va + vb + [ca, cb])
    if ints and float(np.max(np.abs(out), initial=0.0)) >= 2 ** 53:
      return None    # float64 sums of such integers may round
    return [int(v) for v in out] if ints else [float(v) for v in out]

  def _linear_rounding(self, e: rasp.LinearSequenceMap) -> None:
    """``c_a·a + c_b·b`` of inputs known to the interpreter only within rounding: its own bound
    (absolute), the inputs' scaled by ``|c|`` plus the roundings of the two products and the sum."""
    bounds = [self.rounding.get(c.unique_id) for c in (e.fst, e.snd)]
    if not any(bounds):
      return
    total, mag = 0.0, 0.0
    for c, fac, bound in zip((e.fst, e.snd), (e.fst_fac, e.snd_fac), bounds, strict=True):
      m = float(np.max(np.abs(np.asarray([float(v) for v in self[c] if v is not None])), initial=0.0))
      a, r = bound or (0.0, 0.0)
      total += abs(float(fac)) * (a + r * m)
      mag += abs(float(fac)) * m
    self.rounding[e.unique_id] = (total + 4 * 2.0 ** -53 * mag, 0.0)

  def _joint_means(self, e: rasp.LinearSequenceMap) -> Optional[list]:
    """``c_a·mean(A) + c_b·mean(B)`` where both means select the same positions: over every
    count ``w``, the pairs of integer sums ``(Σa, Σb)`` that ``w`` positions can have
    (a 2-D sum-set of the per-position pairs), each mean rounded as the interpreter's
    ``sum / len``. None when the values are not integers."""
    a, b, ca, cb = e.fst, e.snd, e.fst_fac, e.snd_fac
    pairs = self._pointwise_pairs(a.sop, b.sop)
    if pairs is None or not pairs:
      return None
    P = np.asarray(pairs, np.float64)
    if not np.all(P == np.round(P)) or np.max(np.abs(P)) * self.N >= 2 ** 52:
      return None
    P = P.astype(np.int64)
    out = [np.asarray([ca * float(a.default) + cb * float(b.default)])]
    sums = np.zeros((1, 2), np.int64)
    for w in range(1, self.N + 1):
      self._work(e, sums.shape[0] * P.shape[0])
      sums = np.unique((sums[:, None, :] + P[None, :, :]).reshape(-1, 2), axis=0)
      self._cap(e, sums.shape[0] * (self.N - w + 1))
      out.append(ca * (sums[:, 0] / w) + cb * (sums[:, 1] / w))
    return [float(v) for v in np.unique(np.concatenate(out))]

  def _pointwise_pairs(self, a: rasp.SOp, b: rasp.SOp) -> Optional[list]:
    """The pairs ``(a[i], b[i])`` one position can hold: through the Maps and SequenceMaps
    ``a`` and ``b`` are computed by from the same sources (tokens, indices, …), evaluated on
    every joint value of those sources; the product of the value sets when they share none
    or there are too many."""
    sources: Dict[int, rasp.SOp] = {}

    def collect(x):
      if isinstance(x, (rasp.Map, rasp.SequenceMap)):
        for c in x.children:
          collect(c)
      else:
        sources[x.unique_id] = x
    collect(a)
    collect(b)
    domains = [[v for v in self[s] if v is not None] for s in sources.values()]
    if np.prod([float(len(d)) for d in domains]) > 10_000:
      return [(x, y) for x in self[a] for y in self[b] if x is not None and y is not None]
    out = set()
    for assignment in itertools.product(*domains):
      env = dict(zip(sources, assignment, strict=True))

      def ev(x):
        if x.unique_id not in env:
          args = [ev(c) for c in x.children]
          env[x.unique_id] = RAISES if any(v is RAISES or v is None for v in args) else \
              call_or_raises(x.f, *args)
        return env[x.unique_id]
      pa, pb = ev(a), ev(b)
      if RAISES in (pa, pb) or pa is None or pb is None:
        continue
      if not (is_number(pa) and is_number(pb)):
        return None
      out.add((pa, pb))
    return sorted(out)

  def _means(self, e: rasp.Aggregate) -> np.ndarray:
    """Every mean of 1..N values of the input's set, plus the default: the sum-set of ``w``
    values for every ``w`` on exact integers (floats scaled by their common power of two), each
    mean ``s / w`` rounded once (Python's correctly rounded division; what the interpreter's
    ``sum(ints) / len`` gives for integers). The size cap is checked at every step, and a step
    whose work (sums × values) exceeds :data:`MAX_SUMSET_WORK` is refused before it starts. The
    interpreter's sequential float sums of non-integers can differ from these: the bound is
    recorded in ``rounding``."""
    raw = [v for v in self[e.sop] if v is not None]
    bad = [v for v in raw if not is_number(v)]
    if bad:
      raise ValueError(f"numerical Aggregate '{e.label}' averages non-numerical values {bad[:5]} "
                       f"of '{e.sop.label}'.")
    base = np.unique(np.asarray([float(v) for v in raw], np.float64))
    if not np.all(np.isfinite(base)):
      raise ValueError(f"numerical Aggregate '{e.label}' averages the non-finite values "
                       f"{base[~np.isfinite(base)][:3].tolist()} of '{e.sop.label}'.")
    default = 0.0 if e.default is None else float(e.default)
    inherited = self.rounding.get(e.sop.unique_id)   # the input's own rounding, passed on
    if inherited:
      self.rounding[e.unique_id] = inherited
    integers = bool(np.all(base == np.round(base)))
    if not integers:
      # The interpreter sums floats left to right, so it may return any value within the
      # error bound of a sequential sum (γ_{N−1}·Σ|v| / w) and of the division (u·|mean|) of
      # the exact mean computed here; Maps reading this are checked against that bound. With
      # terms of one sign Σ|v| / w is |mean|, so the bound is relative.
      u = 2.0 ** -53
      a0, r0 = inherited or (0.0, 0.0)
      g = 1.01 * (self.N + 1) * u
      if np.all(base >= 0) or np.all(base <= 0):
        self.rounding[e.unique_id] = (a0, r0 + g + u)
      else:
        self.rounding[e.unique_id] = (a0 + g * float(np.max(np.abs(base))), r0 + u)
    # exact integers k_i = v_i · 2^s (every float64 is an integer times a power of two)
    ratios = [float(v).as_integer_ratio() for v in base]
    den = max((d for _, d in ratios), default=1)
    ks = [n * (den // d) for n, d in ratios]
    means = [default]
    if not ks:
      return np.unique(np.asarray(means))
    if max(abs(k) for k in ks) * self.N < 2 ** 62:    # numpy int64, no overflow
      K = np.asarray(ks, np.int64)
      sums = np.zeros(1, np.int64)
      for w in range(1, self.N + 1):
        self._work(e, sums.size * K.size)
        sums = np.unique((sums[:, None] + K[None, :]).ravel())
        self._cap(e, sums.size * (self.N - w + 1))
        means += [int(s_) / (den * w) for s_ in sums.tolist()]
    else:
      psums = {0}
      for w in range(1, self.N + 1):
        self._work(e, len(psums) * len(ks))
        psums = {s_ + k for s_ in psums for k in ks}
        self._cap(e, len(psums) * (self.N - w + 1))
        means += [s_ / (den * w) for s_ in psums]
    return np.unique(np.asarray(means, np.float64))

  def _work(self, e, size):
    if size > MAX_SUMSET_WORK:
      raise ValueError(f"'{e.label}' (a mean, or a sum of means): enumerating its values takes more "
                       f"than {MAX_SUMSET_WORK:,} sums, and would give more values than can be "
                       "discretised downstream; use fewer input values or a smaller max_seq_len.")

  def _cap(self, e, size):
    if size > MAX_VALUE_SET:
      raise ValueError(f"'{e.label}' (a mean, or a sum of means) can take more than {MAX_VALUE_SET} "
                       "values, too many to discretise downstream; use fewer input values "
                       "or a smaller max_seq_len.")


def maybe_none(nodes: Sequence[rasp.RASPExpr], vs: "ValueSets") -> Dict[int, bool]:
  """Which SOps may be ``None`` somewhere: an Aggregate with default None whose selector may select
  nothing (:func:`selects_self`), or of a SOp that may be None, a Map / SequenceMap of one, or one
  whose function returns None."""
  maybe: Dict[int, bool] = {}

  def returns_none(e) -> bool:
    if isinstance(e, rasp.LinearSequenceMap):
      return False
    try:
      return any(v is None for v in vs.image(e))
    except ValueError:   # a value set too large to enumerate: no MLP can read its input either
      return False

  for e in nodes:
    if isinstance(e, rasp.Aggregate):   # a selector that always selects the query's position: no default
      maybe[e.unique_id] = maybe[e.sop.unique_id] or (e.default is None and not selects_self(e.selector, vs))
    elif isinstance(e, (rasp.Map, rasp.SequenceMap)):
      maybe[e.unique_id] = any(maybe[c.unique_id] for c in e.children) or returns_none(e)
    else:
      maybe[e.unique_id] = False
  return maybe


def selects_self(sel: rasp.Selector, vs: "ValueSets") -> bool:
  """Whether ``sel`` selects every query's own position on every input (so an Aggregate over it
  never falls back to its default): a Select with the TRUE predicate, or comparing one SOp with
  itself under a predicate true of every value with itself (``EQ``, ``LEQ``, ``GEQ``; a custom
  one is called on the value set); an ``And`` of two such, an ``Or`` with one. A causal mask
  keeps the query's own position, so this holds causally too."""
  if isinstance(sel, rasp.Select):
    if sel.predicate is rasp.Comparison.TRUE:
      return True
    if sel.keys.unique_id != sel.queries.unique_id:
      return False
    if sel.predicate in (rasp.Comparison.EQ, rasp.Comparison.LEQ, rasp.Comparison.GEQ):
      return True   # a None value raises in the interpreter and, checked at run time, in the model
    try:
      values = [v for v in vs.image(sel.keys) if v is not None]
    except ValueError:
      return False
    return all(call_or_raises(lambda v: bool(sel.predicate(v, v)), v) is True for v in values)
  if isinstance(sel, rasp.SelectorAnd):
    return selects_self(sel.fst, vs) and selects_self(sel.snd, vs)
  if isinstance(sel, rasp.SelectorOr):
    return selects_self(sel.fst, vs) or selects_self(sel.snd, vs)
  return False


def check_none(nodes: Sequence[rasp.RASPExpr], vs: "ValueSets", output: rasp.SOp) -> List[rasp.SOp]:
  """``None`` where a compiled model cannot follow the interpreter → ``ValueError`` naming
  the SOp; returns the SOps whose ``None`` makes the interpreter raise (the keys and queries
  of :class:`~jaxmem.rasp.rasp.Comparison` Selects: tracr's Comparisons raise on None), which
  the compiled model checks at run time.

  * A numerical SOp that may be None: a numerical dimension has no value for None (it would
    hold 0.0, which the output would decode, or the ops reading it treat as a number). Such a
    SOp is refused wherever it is, the program's output included: a numerical Aggregate with
    default None whose selector may select nothing (:func:`selects_self` proves some never do),
    a numerical Aggregate, Map or SequenceMap of a SOp that may be None, a numerical Map or
    SequenceMap whose function returns None. tracr refuses these too (its numerical
    Aggregates need default 0).
  * A numerical Aggregate of non-numbers.
  * A SOp that may be None as the key or query of a predicate that is not a Comparison:
    the interpreter calls the predicate on None, a compiled head (None is the zero vector)
    matches nothing."""
  maybe = maybe_none(nodes, vs)
  for e in nodes:
    if isinstance(e, rasp.Aggregate) and rasp.is_numerical(e) and rasp.is_categorical(e.sop):
      bad = [v for v in vs[e.sop] if v is not None and not is_number(v)]
      if bad:
        raise ValueError(f"numerical Aggregate '{e.label}' averages the non-numerical values "
                         f"{bad[:5]!r} of '{e.sop.label}'; a numerical mean needs numbers (or bools).")
  for e in nodes:
    if not (isinstance(e, rasp.SOp) and rasp.is_numerical(e) and maybe[e.unique_id]):
      continue
    where = "the program's output" if e is output else "read by another op"
    ins = [e.sop] if isinstance(e, rasp.Aggregate) else list(e.children)
    bad = [c for c in ins if maybe[c.unique_id]]
    if bad:
      why = (f"it reads '{bad[0].label}', which may be None (the interpreter then gives None, or "
             "raises averaging None with numbers)")
    elif isinstance(e, rasp.Aggregate):
      why = ("it has default None and its selector may select no position there (the interpreter "
             "then gives None)")
    else:
      why = "its function returns None on some value of its input"
    raise ValueError(
        f"numerical SOp '{e.label}' ({where}) may be None: {why}, but a numerical dimension has no "
        "value for None (the model would read 0.0). Give the Aggregate a numerical default "
        "(e.g. default=0, as tracr requires), or make the SOp categorical.")
  checked: Dict[int, rasp.SOp] = {}
  for e in nodes:
    if not isinstance(e, rasp.Select):
      continue
    for role, sop in (("key", e.keys), ("query", e.queries)):
      if not maybe[sop.unique_id]:
        continue
      if not isinstance(e.predicate, rasp.Comparison):
        raise ValueError(
            f"the {role} '{sop.label}' of Select '{e.label}' may be None, where the "
            "interpreter calls the predicate on None but a compiled head matches nothing; "
            "give its Aggregate a default, or use a rasp.Comparison predicate.")
      checked[sop.unique_id] = sop
  return list(checked.values())


_NUMBER_TYPES = (bool, int, float)
MAX_TYPE_CALLS = 200_000   # calls of a function to show it ignores the int / float / bool type of its inputs


def _check_equal_means(e: rasp.Aggregate, values: list, N: int) -> None:
  """A categorical Aggregate that may select several positions holding one number ``x`` gives,
  in the interpreter, their mean ``sum([x] * n) / n`` (tracr's rule), which need not be ``x``
  (``0.2`` three times: ``0.20000000000000004``; ``2**53 + 1`` twice: ``2**53``), while the
  compiled head holds ``x``'s slot. Refused when it differs for some ``n`` up to ``N``."""
  for x in values:
    if x is None or not is_number(x) or isinstance(x, (bool, np.bool_)):
      continue
    for n in range(2, N + 1):
      m = sum([x] * n) / n
      if m != x:
        raise ValueError(
            f"categorical Aggregate '{e.label}' may select several positions holding {x!r}, whose mean "
            f"the interpreter computes as {m!r} (n = {n}: a float sum then a division), not {x!r}, "
            "while the compiled model holds the value itself. Make the Aggregate numerical, select "
            "one position, or use values whose mean is exact (integers below 2**53, dyadic fractions).")


def at_most_one(sel: rasp.Selector, vs: "ValueSets") -> bool:
  """Whether ``sel`` selects at most one position per query: a Select whose keys are ``indices``
  (distinct) and whose predicate holds for at most one index per query value (``EQ``, or
  checked on the value sets: ``k == p``), or an ``And`` with one."""
  if isinstance(sel, rasp.Select):
    if not isinstance(sel.keys, rasp.IndicesType):
      return False
    if sel.predicate is rasp.Comparison.EQ:
      return True
    try:
      queries = [q for q in vs.image(sel.queries) if q is not None]
    except ValueError:
      return False
    if len(queries) * vs.N > vs.max_pairs:
      return False
    return all(sum(call_or_raises(lambda k, q: bool(sel.predicate(k, q)), k, q) is True
                   for k in range(vs.N)) <= 1 for q in queries)
  if isinstance(sel, rasp.SelectorAnd):
    return at_most_one(sel.fst, vs) or at_most_one(sel.snd, vs)
  return False


def _alternates(v: Any, types: frozenset) -> list:
  """``v`` as each number type in ``types`` that holds its value (``1`` → ``1``, ``1.0``, ``True``)."""
  out = [v]
  if type(v) is float and not v.is_integer():
    return out   # neither an int nor a bool holds it
  if not is_number(v) or isinstance(v, np.number):
    return out
  for t in types:
    if t is bool and v not in (0, 1):
      continue
    if t is int and not float(v).is_integer():
      continue
    w = t(v)
    if w == v and type(w) is not type(v):
      out.append(w)
  return out


def check_value_types(nodes: Sequence[rasp.RASPExpr], vs: "ValueSets") -> Dict[int, frozenset]:
  """The interpreter's type of a value can depend on the input where the compiled model's
  cannot: an Aggregate returns a single selected value as it is (``1``, ``True``) and a mean of
  several as a float (``1.0``, tracr's rule), and its default when nothing is selected. A
  one-hot slot (or a numerical dimension) holds the value, not its type. Returns, for each SOp
  whose values may come in several number types, those types; a Map, SequenceMap or custom
  predicate reading one is called on each value in each such type and must give equal values
  (its output's types are passed on), else ``ValueError`` naming it (``str`` of a mean)."""
  amb: Dict[int, Optional[frozenset]] = {}   # None: one type per value

  def types_of(c: rasp.SOp) -> frozenset:
    t = amb_of(c)
    if t:
      return t
    try:
      return frozenset(type(v) for v in vs.image(c) if v is not None)
    except ValueError:
      return frozenset(_NUMBER_TYPES)

  def amb_of(c: rasp.SOp) -> Optional[frozenset]:
    """Computed when a reader asks (Aggregates), or in graph order (Maps, SequenceMaps)."""
    if c.unique_id not in amb:
      amb[c.unique_id] = None
      if isinstance(c, rasp.Aggregate):
        t = set(types_of(c.sop))
        if not (rasp.is_categorical(c) and at_most_one(c.selector, vs)):
          t.add(float)          # a mean of several
        if rasp.is_numerical(c):
          t.add(float)          # the value set holds the means as floats
        if c.default is not None and not selects_self(c.selector, vs):
          t.add(type(c.default))
        numeric = {x for x in t if x in _NUMBER_TYPES}
        amb[c.unique_id] = frozenset(numeric) if len(numeric) > 1 else None
    return amb[c.unique_id]

  def values_of(c: rasp.SOp) -> list:
    return [v for v in vs.image(c) if v is not None]

  def check(e, f, ins: List[rasp.SOp], what: str) -> Optional[frozenset]:
    if not any(amb_of(c) for c in ins):
      return None
    if isinstance(e, rasp.LinearSequenceMap):   # no function to observe a type: int or float out
      return frozenset((int, float))
    try:
      domains = [values_of(c) for c in ins]
    except ValueError:
      return frozenset(_NUMBER_TYPES)   # no table over it either: its lane refuses it
    types = [amb_of(c) for c in ins]
    # only the inputs' values that other number types also hold need a call: the rest give the
    # function's image (its types come from the value set)
    alts = [{i: a for i, x in enumerate(d) if len(a := _alternates(x, t)) > 1} if t else {}
            for d, t in zip(domains, types, strict=True)]
    out_types = set()
    if not isinstance(e, rasp.Select):
      try:
        out_types = {type(y) for y in vs.image(e) if y is not None}
      except ValueError:
        return frozenset(_NUMBER_TYPES)
    plans = []
    for first, alt in enumerate(alts):   # the combinations whose first input with alternates is `first`
      if alt:
        # per input, groups [value, its other number types…]: before `first` only values without
        # alternates, at `first` only values with, after it every value
        plans.append([[[x] for k, x in enumerate(d) if k not in alts[i]] if i < first else
                      [alt[k] for k in sorted(alt)] if i == first else
                      [alts[i].get(k, [x]) for k, x in enumerate(d)]
                      for i, d in enumerate(domains)])
    calls = sum(float(np.prod([sum(len(g) for g in groups) for groups in plan])) for plan in plans)
    if calls > MAX_TYPE_CALLS:
      amb_in = [c.label for c in ins if amb_of(c)]
      raise ValueError(
          f"{what} '{e.label}' reads {amb_in}, whose values come as int, float or bool depending on the "
          "input (the interpreter returns a single selected value as it is and a mean of several as a "
          f"float); showing that it gives the same result for each takes {calls:,.0f} calls, more than "
          f"{MAX_TYPE_CALLS:,}. Fix the type first (e.g. Map(float, …)) or use fewer values.")
    for ranges in plans:
      for combo in itertools.product(*ranges):
        exact = tuple(c[0] for c in combo)
        ref = call_or_raises(f, *exact)
        for n, args in enumerate(itertools.product(*combo)):
          if n == 0:
            continue
          y = call_or_raises(f, *args)
          if y is ref or (type(y) is type(ref) and y == ref):
            continue
          if (y is RAISES) != (ref is RAISES) or (y is not RAISES and value_key(y) != value_key(ref)):
            raise ValueError(
                f"{what} '{e.label}' gives {ref!r} at {exact!r} but {y!r} at {args!r}: the interpreter "
                "returns a single selected value as it is and a mean of several as a float (tracr's "
                "rule), so which of these it sees depends on the input, while the compiled model "
                "holds only the value. Make the function depend on the value alone (e.g. "
                "float(x) or int(x) first), or select one position.")
          if y is not RAISES and y is not None:
            out_types.add(type(y))
    numeric = {t for t in out_types if t in _NUMBER_TYPES}
    return frozenset(numeric) if len(numeric) > 1 else None

  for e in nodes:
    if isinstance(e, (rasp.Map, rasp.SequenceMap)):
      amb[e.unique_id] = check(e, e.f, list(e.children), "Map" if isinstance(e, rasp.Map) else "SequenceMap")
    elif isinstance(e, rasp.Select) and not isinstance(e.predicate, rasp.Comparison):
      check(e, lambda k, q, p=e.predicate: bool(p(k, q)), [e.keys, e.queries], "the predicate of Select")
  return {k: v for k, v in amb.items() if v}


__all__ = ["MAX_TYPE_CALLS", "ValueSets", "at_most_one", "check_none", "check_value_types", "maybe_none",
           "selects_self"]
