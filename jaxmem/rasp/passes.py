"""The compiler's front passes, in order (tracr's stages, re-derived for hard attention):

1. :func:`rewrite` — the program graph in a compilable normal form: ``length`` becomes a
   ``SelectorWidth``; a Map or SequenceMap read by only one Map is fused into it; a
   numerical SOp used as a selector key or query gets a categorical copy (the one-hot
   shadow hard attention compares); a SelectorWidth over a lexicographic sort key, or over
   an Or of conjunctions that never hold together, becomes a sum of exact widths (given
   value sets); any other selector that is not a conjunction of Selects becomes one Select
   over *product* SOps (the tuples of the SOps it reads).
2. :func:`check_types` — encodings: what must be categorical is, numerical values are
   numbers, constants that cannot be compiled are refused.
3. :class:`ValueSets` — the finite value set of every SOp that needs one (categorical SOps,
   and numerical SOps an MLP must discretise), from ``vocab`` and ``max_seq_len``; a
   LinearSequenceMap's without calling it on every pair (vectorised, or from the joint sums
   of two means over one selector).
4. :func:`allocate` — layer allocation: every attention op (Aggregate, the attention half
   of SelectorWidth) gets the earliest attention sublayer after its inputs exist, every
   MLP op the earliest MLP sublayer; longest-path scheduling as tracr does.

Each pass raises :class:`ValueError` naming the offending node (``'<label>'``).
"""

from __future__ import annotations

import dataclasses
import fractions
import itertools
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from jaxmem.rasp import rasp

MAX_VALUE_SET = 200_000  # larger numerical value sets are refused, not discretised
MAX_PAIRS = 2_000_000    # a SequenceMap is called on at most this many pairs of input values


def sort_values(values) -> list:
  """A deterministic order for a value set of mixed types."""
  def key(v):
    if isinstance(v, (bool, int, float, np.number)):
      return (0, float(v), "")
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


# ----------------------------------------------------------------------------- graph


def walk(expr: rasp.RASPExpr) -> List[rasp.RASPExpr]:
  """Every node reachable from ``expr``, children before parents (iterative DFS)."""
  order, seen, stack = [], set(), [(expr, False)]
  while stack:
    node, done = stack.pop()
    if done:
      order.append(node)
      continue
    if node.unique_id in seen:
      continue
    seen.add(node.unique_id)
    stack.append((node, True))
    for c in reversed(node.children):
      if c.unique_id not in seen:
        stack.append((c, False))
  return order


def consumers(nodes: Sequence[rasp.RASPExpr]) -> Dict[int, int]:
  count: Dict[int, int] = {}
  for n in nodes:
    for c in n.children:
      count[c.unique_id] = count.get(c.unique_id, 0) + 1
  return count


def _flatten_and(sel: rasp.Selector) -> Optional[List[rasp.Select]]:
  """The Selects of a pure conjunction, or None."""
  if isinstance(sel, rasp.Select):
    return [sel]
  if isinstance(sel, rasp.SelectorAnd):
    a, b = _flatten_and(sel.fst), _flatten_and(sel.snd)
    return None if a is None or b is None else a + b
  return None


def _leaves(sel: rasp.Selector) -> List[rasp.Select]:
  if isinstance(sel, rasp.Select):
    return [sel]
  if isinstance(sel, rasp.ConstantSelector):
    raise ValueError(f"ConstantSelector '{sel.label}' cannot be compiled (it has no "
                     "transformer form); use a Select.")
  return [leaf for c in sel.children for leaf in _leaves(c)]


def _tuple_sop(sops: List[rasp.SOp], tag: str) -> rasp.SOp:
  """One SOp for several: the SOp itself when alone, else the categorical SOp of their
  tuples (a product space, one MLP layer per extra SOp)."""
  if len(sops) == 1:
    return sops[0]
  out = rasp.SequenceMap(lambda x, y: (x, y), sops[0], sops[1])
  for s in sops[2:]:
    out = rasp.SequenceMap(lambda t, y: t + (y,), out, s)
  return rasp.categorical(out).named(tag)


def _product_select(sel: rasp.Selector, keys: List[rasp.SOp], queries: List[rasp.SOp],
                    key_pos: Dict[int, int], query_pos: Dict[int, int]) -> rasp.Select:
  """``sel`` as one Select whose keys/queries are the tuples of the SOps it reads."""
  kget = (lambda k, i: k) if len(keys) == 1 else (lambda k, i: k[i])
  qget = (lambda q, i: q) if len(queries) == 1 else (lambda q, i: q[i])

  def make(s: rasp.Selector) -> Callable[[Any, Any], bool]:
    if isinstance(s, rasp.Select):
      ki, qi, p = key_pos[s.keys.unique_id], query_pos[s.queries.unique_id], s.predicate
      return lambda k, q: bool(p(kget(k, ki), qget(q, qi)))
    if isinstance(s, rasp.SelectorNot):
      f = make(s.inner)
      return lambda k, q: not f(k, q)
    f, g = make(s.fst), make(s.snd)
    if isinstance(s, rasp.SelectorAnd):
      return lambda k, q: f(k, q) and g(k, q)
    return lambda k, q: f(k, q) or g(k, q)

  name = sel.label
  return rasp.Select(_tuple_sop(keys, f"{name}.keys"), _tuple_sop(queries, f"{name}.queries"),
                     make(sel))


def _selector_key(sel: rasp.Selector) -> Optional[tuple]:
  """What a conjunction of Selects compares (keys, queries, predicate of each); None otherwise."""
  conj = _flatten_and(sel)
  if conj is None:
    return None
  return tuple((s.keys.unique_id, s.queries.unique_id, s.predicate) for s in conj)


def _then(f, y):
  return None if y is None else f(y)


def _lexicographic_width(e: rasp.SelectorWidth, key: rasp.SOp, vs: "ValueSets") -> Optional[rasp.SOp]:
  """``SelectorWidth(Select(K, K, <))`` where ``K = f(X, indices)`` orders positions as the
  pairs ``(X, index)`` do (tracr's sort key ``x + i/N``: every ``f(x, ·)`` strictly
  increasing, and below every ``f(x', ·)`` for ``x < x'``; or every ``f(x, ·)`` strictly
  decreasing, ordering ``(X, −index)``), as the sum of two exact widths:
  ``#{X_k < X_q} + #{X_k = X_q ∧ i_k < i_q}`` (``<`` stands for any of LT, LEQ, GT, GEQ; the
  two selections are disjoint, causal masking included). The one-hot of ``K`` (``|X|·N``
  values) is never built: the heads compare ``X`` and the indices apart. None if ``e`` is not
  of that form (``X`` categorical, never None, numbers)."""
  sel = e.selector
  C = rasp.Comparison
  if not isinstance(sel, rasp.Select) or sel.keys is not sel.queries or \
      sel.predicate not in (C.LT, C.LEQ, C.GT, C.GEQ) or not isinstance(key, rasp.SequenceMap):
    return None
  if isinstance(key.snd, rasp.IndicesType):
    x, f = key.fst, key.f
  elif isinstance(key.fst, rasp.IndicesType):
    x, f = key.snd, (lambda a, i, g=key.f: g(i, a))
  else:
    return None
  if not rasp.is_categorical(x) or any(isinstance(n, rasp.Aggregate) for n in walk(x)):
    return None
  try:
    xs = vs[x]
  except ValueError:
    return None
  if not xs or not all(is_number(v) and v is not None for v in xs):
    return None
  xs = sorted(xs, key=float)
  table = [[call_or_raises(f, v, i) for i in range(vs.N)] for v in xs]
  if any(not is_number(t) for row in table for t in row):
    return None
  F = np.asarray(table, np.float64)
  flip = {C.LT: C.GT, C.LEQ: C.GEQ, C.GT: C.LT, C.GEQ: C.LEQ}
  if np.all(np.diff(F, axis=1) > 0) and np.all(F[:-1, -1] < F[1:, 0]):
    by_index = sel.predicate
  elif np.all(np.diff(F, axis=1) < 0) and np.all(F[:-1, 0] < F[1:, -1]):
    by_index = flip[sel.predicate]   # f(x, ·) decreasing: later positions order first
  else:
    return None
  strict = C.LT if sel.predicate in (C.LT, C.LEQ) else C.GT
  # numerical (one dimension each): their sum is read once, by an exact affine lane
  major = rasp.numerical(rasp.SelectorWidth(rasp.Select(x, x, strict))).named(f"{e.label}:major")
  minor = rasp.numerical(rasp.SelectorWidth(rasp.SelectorAnd(
      rasp.Select(x, x, C.EQ), rasp.Select(rasp.indices, rasp.indices, by_index))))
  return rasp.LinearSequenceMap(major, minor.named(f"{e.label}:minor"), 1, 1)


def _or_terms(sel: rasp.Selector) -> Optional[List[List[rasp.Select]]]:
  """The conjunctions of a disjunction of conjunctions of Selects, or None."""
  if isinstance(sel, rasp.SelectorOr):
    a, b = _or_terms(sel.fst), _or_terms(sel.snd)
    return None if a is None or b is None else a + b
  conj = _flatten_and(sel)
  return None if conj is None else [conj]


def _disjoint(t1: List[rasp.Select], t2: List[rasp.Select], go, vs: "ValueSets") -> bool:
  """Whether two conjunctions never both hold: some Select of each compares the same key and
  query SOps with predicates that hold together on no pair of their values."""
  for s1 in t1:
    for s2 in t2:
      if s1.keys is not s2.keys or s1.queries is not s2.queries:
        continue
      try:
        ks, qs = vs[go(s1.keys)], vs[go(s1.queries)]
      except ValueError:
        continue
      if len(ks) * len(qs) > MAX_VALUE_SET:
        continue
      try:
        if not any(s1.predicate(k, q) and s2.predicate(k, q) for k in ks for q in qs
                   if k is not None and q is not None):
          return True
      except Exception:  # noqa: BLE001 - a predicate that raises on some pair proves nothing
        continue
  return False


def _disjoint_or_width(e: rasp.SelectorWidth, go, vs: "ValueSets") -> Optional[rasp.SOp]:
  """``SelectorWidth(T_1 ∨ … ∨ T_m)`` of conjunctions that pairwise never hold together
  (checked on the value sets, see :func:`_disjoint`) as ``Σ SelectorWidth(T_i)``: exact
  widths summed by exact integer lanes, instead of one Select over the product of every SOp
  the terms read (tracr's tie-break ``hist_k > hist_q ∨ (hist_k = hist_q ∧ i_k < i_q)``).
  None otherwise (at most 4 terms)."""
  terms = _or_terms(e.selector)
  if terms is None or not 2 <= len(terms) <= 4:
    return None
  if not all(_disjoint(a, b, go, vs) for a, b in itertools.combinations(terms, 2)):
    return None
  parts = []
  for j, term in enumerate(terms):
    sel = term[0]
    for s in term[1:]:
      sel = rasp.SelectorAnd(sel, s)
    parts.append(go(rasp.numerical(rasp.SelectorWidth(sel)).named(f"{e.label}:or[{j}]")))
  out = parts[0]
  for p in parts[1:-1]:
    out = rasp.numerical(rasp.LinearSequenceMap(out, p, 1, 1)).named(f"{out.label}+")
  return rasp.LinearSequenceMap(out, parts[-1], 1, 1)


def rewrite(program: rasp.SOp, vs: Optional["ValueSets"] = None) -> rasp.SOp:
  """The program in the compiler's normal form (see the module docstring). The output node
  keeps its label. With value sets ``vs``, a width over a lexicographic sort key is split
  (:func:`_lexicographic_width`)."""
  if not isinstance(program, rasp.SOp):
    raise ValueError(f"`program` must be a SOp (a sequence operation), got "
                     f"{type(program).__name__}.")
  nodes = walk(program)
  uses = consumers(nodes)
  memo: Dict[int, rasp.RASPExpr] = {}
  shadows: Dict[int, rasp.SOp] = {}
  length_node: List[rasp.SOp] = []

  def keep_annotations(new, old):
    if new is old:
      return new
    new._annotations = dict(old._annotations)
    return new

  def fusable(inner: rasp.SOp) -> bool:
    return (isinstance(inner, (rasp.Map, rasp.SequenceMap)) and uses.get(inner.unique_id, 0) == 1
            and inner is not program and "value_set" not in inner._annotations
            and not isinstance(inner, rasp.LinearSequenceMap))

  def cat_key(s: rasp.SOp) -> rasp.SOp:
    s = go(s)
    if rasp.is_categorical(s):
      return s
    if s.unique_id not in shadows:
      shadows[s.unique_id] = rasp.categorical(rasp.Map(lambda x: x, s, simplify=False)).named(
          f"{s.label}:cat")
    return shadows[s.unique_id]

  def go_selector(sel: rasp.Selector) -> rasp.Selector:
    conj = _flatten_and(sel)
    if conj is not None:
      parts = [rasp.Select(cat_key(s.keys), cat_key(s.queries), s.predicate) for s in conj]
      out = parts[0]
      for p in parts[1:]:
        out = rasp.SelectorAnd(out, p)
      return keep_annotations(out, sel) if len(parts) == 1 else out
    leaves = _leaves(sel)
    keys, queries, kpos, qpos = [], [], {}, {}
    for leaf in leaves:
      k, q = cat_key(leaf.keys), cat_key(leaf.queries)
      if leaf.keys.unique_id not in kpos:
        kpos[leaf.keys.unique_id] = len(keys)
        keys.append(k)
      if leaf.queries.unique_id not in qpos:
        qpos[leaf.queries.unique_id] = len(queries)
        queries.append(q)
    return _product_select(sel, keys, queries, kpos, qpos)

  def go(e: rasp.RASPExpr) -> rasp.RASPExpr:
    if e.unique_id in memo:
      return memo[e.unique_id]
    if isinstance(e, rasp.LengthType):
      if not length_node:
        length_node.append(rasp.SelectorWidth(
            rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.TRUE)).named("length"))
      out = length_node[0] if "encoding" not in e._annotations else annotate_like(length_node[0], e)
    elif isinstance(e, (rasp.ConstantSOp, rasp.ConstantSelector)):
      raise ValueError(f"{type(e).__name__} '{e.label}' cannot be compiled: a constant "
                       "sequence has no transformer form. Use Full, or compute it from "
                       "tokens/indices.")
    elif isinstance(e, (rasp.TokensType, rasp.IndicesType, rasp.Full)):
      out = e
    elif isinstance(e, rasp.Map):
      inner = e.inner
      if fusable(inner) and isinstance(inner, rasp.Map):
        f, g = e.f, inner.f  # None propagates as in the interpreter: f never sees None
        out = keep_annotations(rasp.Map(lambda x: _then(f, g(x)), go(inner.inner), simplify=False), e)
      elif fusable(inner) and isinstance(inner, rasp.SequenceMap):
        f, g = e.f, inner.f
        out = keep_annotations(rasp.SequenceMap(lambda x, y: _then(f, g(x, y)), go(inner.fst),
                                                go(inner.snd)), e)
      else:
        new_inner = go(inner)
        out = e if new_inner is inner else keep_annotations(
            rasp.Map(e.f, new_inner, simplify=False), e)
    elif isinstance(e, rasp.LinearSequenceMap):
      a, b = go(e.fst), go(e.snd)
      out = e if (a is e.fst and b is e.snd) else keep_annotations(
          rasp.LinearSequenceMap(a, b, e.fst_fac, e.snd_fac), e)
    elif isinstance(e, rasp.SequenceMap):
      a, b = go(e.fst), go(e.snd)
      out = e if (a is e.fst and b is e.snd) else keep_annotations(
          rasp.SequenceMap(e.f, a, b), e)
    elif isinstance(e, rasp.SelectorWidth):
      split = None   # (a declared value_set stays on the width itself, as declared)
      if "value_set" in e._annotations:
        pass
      elif vs is not None and isinstance(e.selector, rasp.Select) and e.selector.keys is e.selector.queries:
        split = _lexicographic_width(e, go(e.selector.keys), vs)
      elif vs is not None and isinstance(e.selector, rasp.SelectorOr):
        split = _disjoint_or_width(e, go, vs)
      out = keep_annotations(split or rasp.SelectorWidth(go_selector(e.selector)), e)
    elif isinstance(e, rasp.Aggregate):
      out = keep_annotations(rasp.Aggregate(go_selector(e.selector), go(e.sop), e.default), e)
    else:
      raise ValueError(f"cannot compile {type(e).__name__} '{e.label}'.")
    memo[e.unique_id] = out
    return out

  def annotate_like(node, e):
    new = node.copy()
    new._annotations.update(e._annotations)
    return new

  out = go(program)
  if out is not program:
    out._annotations.setdefault("name", program.label)
  return out


# ----------------------------------------------------------------------------- kinds


def kind(e: rasp.RASPExpr) -> str:
  """'input' (embedded), 'mlp', 'attn' (Aggregate), 'width' (SelectorWidth), 'selector'."""
  if isinstance(e, (rasp.TokensType, rasp.IndicesType, rasp.Full)):
    return "input"
  if isinstance(e, (rasp.Map, rasp.SequenceMap)):
    return "mlp"
  if isinstance(e, rasp.Aggregate):
    return "attn"
  if isinstance(e, rasp.SelectorWidth):
    return "width"
  if isinstance(e, rasp.Selector):
    return "selector"
  raise ValueError(f"cannot compile {type(e).__name__} '{e.label}'.")


def selects_of(sel: rasp.Selector) -> List[rasp.Select]:
  conj = _flatten_and(sel)
  if conj is None:  # rewrite() guarantees conjunctions
    raise ValueError(f"selector '{sel.label}' is not a conjunction of Selects after rewriting.")
  return conj


def sop_inputs(e: rasp.RASPExpr) -> List[rasp.SOp]:
  """The SOps an op reads (through its selector for attention ops)."""
  if isinstance(e, (rasp.Aggregate, rasp.SelectorWidth)):
    out = []
    for s in selects_of(e.selector):
      out += [s.keys, s.queries]
    if isinstance(e, rasp.Aggregate):
      out.append(e.sop)
    return out
  return list(e.children)


def check_types(nodes: Sequence[rasp.RASPExpr], output: Optional[rasp.SOp] = None) -> None:
  """Encodings the compiler cannot honour exactly → ``ValueError`` naming the node."""
  read = {c.unique_id for n in nodes for c in n.children}
  read |= {s.unique_id for n in nodes if kind(n) in ("attn", "width") for s in sop_inputs(n)}
  for e in nodes:
    if isinstance(e, rasp.Aggregate):
      if rasp.is_categorical(e) and rasp.is_numerical(e.sop):
        raise ValueError(
            f"categorical Aggregate '{e.label}' averages the numerical SOp '{e.sop.label}': "
            "numerical where categorical is needed. Make the aggregate numerical "
            "(rasp.numerical) or the value categorical.")
      if rasp.is_numerical(e) and e.default is None and e.unique_id in read and e is not output:
        raise ValueError(
            f"numerical Aggregate '{e.label}' has default None and is read by another op: the "
            "interpreter passes None on (a Map of None is None) but a numerical dimension holds "
            "0. Give it a numerical default, e.g. default=0 (tracr requires one too).")
      if rasp.is_numerical(e) and e.default is not None and not is_number(e.default):
        raise ValueError(f"numerical Aggregate '{e.label}' has the non-numerical default "
                         f"{e.default!r}.")
    if isinstance(e, rasp.Full) and rasp.is_numerical(e) and not is_number(e.fill):
      raise ValueError(f"numerical Full '{e.label}' has a non-numerical fill {e.fill!r}.")


# ----------------------------------------------------------------------------- value sets


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
           for x in (a, b)) and _selector_key(a.selector) == _selector_key(b.selector):
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
  for e in nodes:
    if isinstance(e, rasp.Aggregate):
      maybe[e.unique_id] = e.default is None or maybe[e.sop.unique_id]
    elif isinstance(e, (rasp.Map, rasp.SequenceMap)):
      maybe[e.unique_id] = any(maybe[c.unique_id] for c in e.children) or \
          (rasp.is_categorical(e) and any(v is None for v in vs[e]))
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
    would turn it into a real value. As the program's output it reads 0.
  * A SOp that may be None as the key or query of a predicate that is not a Comparison:
    the interpreter calls the predicate on None, a compiled head (None is the zero vector)
    matches nothing."""
  maybe = maybe_none(nodes, vs)
  read = {c.unique_id for n in nodes for c in n.children}
  read |= {s.unique_id for n in nodes if kind(n) in ("attn", "width") for s in sop_inputs(n)}
  for e in nodes:
    if isinstance(e, (rasp.Map, rasp.SequenceMap, rasp.Aggregate)) and rasp.is_numerical(e) \
        and e is not output and e.unique_id in read:
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


# ----------------------------------------------------------------------------- layers


@dataclasses.dataclass
class Schedule:
  """Sublayer of every op: attention sublayers are even (2ℓ), MLP sublayers odd (2ℓ+1)."""
  slot: Dict[int, int]          # unique_id -> sublayer where the op's output appears
  attn_slot: Dict[int, int]     # for 'width' ops, the attention half's sublayer
  num_layers: int
  stage: Dict[int, int] = dataclasses.field(default_factory=dict)   # MLP ops chained in one MLP: 1, 2, …


def allocate(nodes: Sequence[rasp.RASPExpr], fuse: bool = False) -> Schedule:
  """Longest-path layer allocation: each op in the first sublayer of its kind after all
  of its inputs exist. ``fuse``: an MLP op whose latest inputs come out of an MLP sublayer
  joins that sublayer, one stage after them (a deeper MLP, :func:`jaxmem.rasp.craft.fuse_stages`),
  instead of taking the next layer's."""
  slot: Dict[int, int] = {}
  attn_slot: Dict[int, int] = {}
  stage: Dict[int, int] = {}
  for e in nodes:
    k = kind(e)
    if k == "selector":
      continue
    if k == "input":
      slot[e.unique_id] = -1
      continue
    ready = max((slot[s.unique_id] for s in sop_inputs(e)), default=-1)
    if k == "mlp" and fuse and ready >= 0 and ready % 2 == 1:
      slot[e.unique_id] = ready
      stage[e.unique_id] = 1 + max(stage.get(s.unique_id, 0) for s in sop_inputs(e)
                                   if slot[s.unique_id] == ready)
    elif k == "mlp":
      s = ready + 1
      slot[e.unique_id] = s if s % 2 == 1 else s + 1
    else:
      s = ready + 1
      s = s if s % 2 == 0 else s + 1
      if k == "attn":
        slot[e.unique_id] = s
      else:
        attn_slot[e.unique_id] = s
        slot[e.unique_id] = s + 1
  top = max(slot.values(), default=-1)
  return Schedule(slot, attn_slot, num_layers=(top + 2) // 2 if top >= 0 else 0, stage=stage)


__all__ = ["MAX_PAIRS", "MAX_VALUE_SET", "RAISES", "Schedule", "ValueSets", "allocate", "call_or_raises",
           "check_none", "check_types", "consumers", "is_number", "kind", "maybe_none", "rewrite", "selects_of",
           "sop_inputs", "sort_values", "unique_values", "value_key", "walk"]
