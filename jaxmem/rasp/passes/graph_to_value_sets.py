"""Pass 3, the normal-form graph → the finite value set of every SOp that needs one (:class:`ValueSets`:
categorical SOps, and numerical SOps an MLP must discretise), from ``vocab`` and ``max_seq_len``; a
LinearSequenceMap's without calling it on every pair (vectorised, or from the joint sums of two means
over one selector); and which SOps may be None (:func:`maybe_none`, :func:`check_none`).
"""

from __future__ import annotations

import fractions
import itertools
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.passes.rasp_to_graph import kind, selector_key, sop_inputs
from jaxmem.rasp.passes.values import (
  MAX_PAIRS,
  MAX_VALUE_SET,
  RAISES,
  call_or_raises,
  is_number,
  sort_values,
  unique_values,
)


class ValueSets:
  """Value sets, computed on demand and memoised: ``vs[node]`` is a sorted list.

  tokens: the vocab; indices: ``0..N−1``; Full: ``{fill}``; Map / SequenceMap: the image of
  the input sets (``f`` is called on every value / pair, once); SelectorWidth: ``0..N``;
  categorical Aggregate: its value's set (plus the default); numerical Aggregate: every
  mean of 1..N values of its input's set (a sum-set recursion on numpy arrays), plus the
  default (0 for None). A declared ``value_set`` annotation is checked, not trusted."""

  def __init__(self, vocab: Sequence[Any], max_seq_len: int):
    self.vocab = list(vocab)
    self.N = max_seq_len
    self.memo: Dict[int, list] = {}
    self.images: Dict[int, list] = {}   # unchecked value sets (see image)
    # numerical SOp -> (a, r): the interpreter's value of exact value x is within a + r·|x|
    self.rounding: Dict[int, tuple] = {}

  def __getitem__(self, e: rasp.SOp) -> list:
    if e.unique_id not in self.memo:
      vs = self._infer(e)
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
    if e.unique_id not in self.images:   # maybe_none asks twice (check_none, then the weights)
      self.images[e.unique_id] = self._infer(e)
    return self.images[e.unique_id]

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
      if len(a) * len(b) > MAX_PAIRS:
        raise ValueError(f"SequenceMap '{e.label}' has {len(a)}×{len(b)} input pairs, more "
                         f"than {MAX_PAIRS:,}; declare smaller value sets.")
      return self._image(e, [(x, y) for x in a for y in b if x is not None and y is not None])
    if isinstance(e, rasp.SelectorWidth):
      return list(range(self.N + 1))
    if isinstance(e, rasp.Aggregate):
      if rasp.is_categorical(e):
        return unique_values(list(self[e.sop]) + ([] if e.default is None else [e.default]), e.label)
      return [float(v) for v in self._means(e)]
    raise ValueError(f"no value set for {type(e).__name__} '{e.label}'.")

  def _linear(self, e: rasp.LinearSequenceMap) -> Optional[list]:
    """The values of ``c_a·a + c_b·b`` without calling it on every pair of value sets: for two
    numerical means over the same selector (tracr's ``opens − closes``) from the sums both
    means can have together; for other numbers, one vectorised outer sum. None: not numbers."""
    a, b, ca, cb = e.fst, e.snd, e.fst_fac, e.snd_fac
    if all(isinstance(x, rasp.Aggregate) and rasp.is_numerical(x) and is_number(x.default)
           for x in (a, b)) and selector_key(a.selector) == selector_key(b.selector):
      out = self._joint_means(e)
      if out is not None:
        return out
    va, vb = self[a], self[b]
    if not all(is_number(v) for v in va + vb) or len(va) * len(vb) > 20 * MAX_VALUE_SET:
      return None
    xa = np.asarray([float(v) for v in va])[:, None]
    xb = np.asarray([float(v) for v in vb])[None, :]
    out = np.unique((ca * xa + cb * xb).ravel())
    if out.size > MAX_VALUE_SET:
      raise ValueError(f"LinearSequenceMap '{e.label}' takes {out.size} values, more than "
                       f"{MAX_VALUE_SET}; declare smaller value sets.")
    ints = all(isinstance(v, (int, np.integer)) for v in va + vb + [ca, cb])
    return [int(v) for v in out] if ints else [float(v) for v in out]

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
    """Every mean of 1..N values of the input's set, plus the default. Integer inputs: exact
    integer sum-sets, each mean ``s / w`` rounded once (what Python's ``sum(ints) / len``
    gives). Other inputs: exact rationals (``fractions.Fraction``) rounded once; the
    interpreter's sequential float sums can differ from these by an ulp."""
    raw = [v for v in self[e.sop] if v is not None]
    bad = [v for v in raw if not is_number(v)]
    if bad:
      raise ValueError(f"numerical Aggregate '{e.label}' averages non-numerical values {bad[:5]} "
                       f"of '{e.sop.label}'.")
    base = np.unique(np.asarray([float(v) for v in raw], np.float64))
    default = 0.0 if e.default is None else float(e.default)
    out = [np.asarray([default])]
    inherited = self.rounding.get(e.sop.unique_id)   # the input's own rounding, passed on
    if inherited:
      self.rounding[e.unique_id] = inherited
    if base.size and np.all(base == np.round(base)) and np.max(np.abs(base)) < 2 ** 40:
      sums = np.zeros(1)
      for w in range(1, self.N + 1):
        sums = np.unique((sums[:, None] + base[None, :]).ravel())
        self._cap(e, sums.size * (self.N - w + 1))
        out.append(sums / w)
      return np.unique(np.concatenate(out))
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
    fb = {fractions.Fraction(float(v)) for v in base}
    sums = {fractions.Fraction(0)}
    for w in range(1, self.N + 1):
      sums = {s_ + v for s_ in sums for v in fb}
      self._cap(e, len(sums) * (self.N - w + 1))
      out.append(np.asarray([float(s_ / w) for s_ in sums]))
    return np.unique(np.concatenate(out))

  def _cap(self, e, size):
    if size > MAX_VALUE_SET:
      raise ValueError(f"'{e.label}' (a mean, or a sum of means) can take more than {MAX_VALUE_SET} "
                       "values, too many to discretise downstream; use fewer input values "
                       "or a smaller max_seq_len.")


def maybe_none(nodes: Sequence[rasp.RASPExpr], vs: "ValueSets") -> Dict[int, bool]:
  """Which SOps may be ``None`` somewhere: an Aggregate with default None (or of a SOp that
  may be None), a Map / SequenceMap of one, or one whose function returns None."""
  maybe: Dict[int, bool] = {}

  def returns_none(e) -> bool:
    if isinstance(e, rasp.LinearSequenceMap):
      return False
    try:
      return any(v is None for v in vs.image(e))
    except ValueError:   # a value set too large to enumerate: no MLP can read its input either
      return False

  for e in nodes:
    if isinstance(e, rasp.Aggregate):
      maybe[e.unique_id] = e.default is None or maybe[e.sop.unique_id]
    elif isinstance(e, (rasp.Map, rasp.SequenceMap)):
      maybe[e.unique_id] = any(maybe[c.unique_id] for c in e.children) or returns_none(e)
    else:
      maybe[e.unique_id] = False
  return maybe


def check_none(nodes: Sequence[rasp.RASPExpr], vs: "ValueSets", output: rasp.SOp) -> List[rasp.SOp]:
  """``None`` where a compiled model cannot follow the interpreter → ``ValueError`` naming
  the SOp; returns the SOps whose ``None`` makes the interpreter raise (the keys and queries
  of :class:`~jaxmem.rasp.rasp.Comparison` Selects: tracr's Comparisons raise on None), which
  the compiled model checks at run time.

  * A numerical SOp computed from a SOp that may be None, and read by another op: the
    interpreter passes None on, a numerical dimension holds a number (0), and a later op
    would turn it into a real value. As the program's output a Map or SequenceMap reads 0;
    a numerical Aggregate is refused even as the output (the interpreter raises on a mean
    with None in it, the model would average 0).
  * A SOp that may be None as the key or query of a predicate that is not a Comparison:
    the interpreter calls the predicate on None, a compiled head (None is the zero vector)
    matches nothing."""
  maybe = maybe_none(nodes, vs)
  read = {c.unique_id for n in nodes for c in n.children}
  read |= {s.unique_id for n in nodes if kind(n) in ("attn", "width") for s in sop_inputs(n)}
  for e in nodes:
    if isinstance(e, (rasp.Map, rasp.SequenceMap, rasp.Aggregate)) and rasp.is_numerical(e) \
        and (isinstance(e, rasp.Aggregate) or (e is not output and e.unique_id in read)):
      ins = [e.sop] if isinstance(e, rasp.Aggregate) else list(e.children)
      bad = [c for c in ins if maybe[c.unique_id]]
      if bad:
        raise ValueError(
            f"numerical SOp '{e.label}' reads '{bad[0].label}', which may be None: the interpreter "
            "passes None on, but a numerical dimension holds a number, which the ops reading "
            f"'{e.label}' would treat as a value. Give the Aggregate it comes from a default, or "
            "make it categorical.")
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


__all__ = ["ValueSets", "check_none", "maybe_none"]
