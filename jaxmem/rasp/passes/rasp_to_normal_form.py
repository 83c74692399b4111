"""Pass 1, a RASP program → the same program in the compiler's normal form (:func:`rewrite`).

``length`` becomes a ``SelectorWidth``; a Map or SequenceMap read by only one Map is fused into it; a
numerical SOp used as a selector key or query gets a categorical copy (the one-hot shadow hard
attention compares); a SelectorWidth over a lexicographic sort key, or over an Or of conjunctions
that never hold together, becomes a sum of exact widths (given value sets); any other selector that
is not a conjunction of Selects becomes one Select over *product* SOps (the tuples of the SOps it
reads, one tuple SOp per distinct list of SOps, shared by every selector and by keys and queries).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.passes.rasp_to_graph import consumers, flatten_and, walk
from jaxmem.rasp.passes.values import MAX_VALUE_SET, call_or_raises, is_number, value_key

if TYPE_CHECKING:
  from jaxmem.rasp.passes.graph_to_value_sets import ValueSets


def _leaves(sel: rasp.Selector) -> List[rasp.Select]:
  if isinstance(sel, rasp.Select):
    return [sel]
  if isinstance(sel, rasp.ConstantSelector):
    raise ValueError(f"ConstantSelector '{sel.label}' cannot be compiled (it has no "
                     "transformer form); use a Select.")
  return [leaf for c in sel.children for leaf in _leaves(c)]


def _tuple_sop(sops: List[rasp.SOp], memo: Dict[tuple, rasp.SOp]) -> rasp.SOp:
  """One SOp for several: the SOp itself when alone, else the categorical SOp of their
  tuples (a product space, one MLP layer per extra SOp), named ``(a, b, …)``. Through ``memo`` the
  tuple of the same SOps is built once however many selectors (or a selector's keys and
  queries) read it."""
  if len(sops) == 1:
    return sops[0]
  ids = tuple(s.unique_id for s in sops)
  if ids not in memo:
    out = rasp.SequenceMap(lambda x, y: (x, y), sops[0], sops[1])
    for s in sops[2:]:
      out = rasp.SequenceMap(lambda t, y: t + (y,), out, s)
    memo[ids] = rasp.categorical(out).named("(" + ", ".join(s.label for s in sops) + ")")
  return memo[ids]


class ProductPredicate:
  """The predicate of a product Select: ``sel`` (an And / Or / Not of Selects over several SOps)
  on the tuples of the SOps it reads (``key_pos`` / ``query_pos``: each SOp's place in the key /
  query tuple; a single SOp is not a tuple). Both sides of an And / Or are evaluated (no short
  circuit): the interpreter evaluates every Select on every pair, so a predicate that raises on
  some pair raises here too. :meth:`table` builds the whole table from the Selects' own tables
  over their SOps' values (what ``craft.attention`` uses: far fewer calls than one per tuple pair)."""

  def __init__(self, sel: rasp.Selector, key_pos: Dict[int, int], query_pos: Dict[int, int], n_keys: int,
               n_queries: int):
    self.sel, self.key_pos, self.query_pos = sel, key_pos, query_pos
    self.n_keys, self.n_queries = n_keys, n_queries

  @staticmethod
  def _part(x, i: int, n: int):
    return x if n == 1 else x[i]

  def __call__(self, k, q) -> bool:
    return self._eval(self.sel, k, q)

  def _eval(self, s: rasp.Selector, k, q) -> bool:
    if isinstance(s, rasp.Select):
      return bool(s.predicate(self._part(k, self.key_pos[s.keys.unique_id], self.n_keys),
                              self._part(q, self.query_pos[s.queries.unique_id], self.n_queries)))
    if isinstance(s, rasp.SelectorNot):
      return not self._eval(s.inner, k, q)
    a, b = self._eval(s.fst, k, q), self._eval(s.snd, k, q)
    return (a and b) if isinstance(s, rasp.SelectorAnd) else (a or b)

  def table(self, qvals: list, kvals: list, select_table: Callable) -> np.ndarray:
    """``P[a, b]`` (booleans) for the query tuples ``qvals`` and key tuples ``kvals``;
    ``select_table(select, queries, keys)`` is one Select's table over its own SOps' values."""
    def parts(vals, i, n):
      index: Dict[Any, int] = {}
      uniq, inv = [], []
      for v in vals:
        x = self._part(v, i, n)
        key = value_key(x)
        if key not in index:
          index[key] = len(uniq)
          uniq.append(x)
        inv.append(index[key])
      return uniq, np.asarray(inv, np.int64)

    def go(s: rasp.Selector) -> np.ndarray:
      if isinstance(s, rasp.Select):
        uq, iq = parts(qvals, self.query_pos[s.queries.unique_id], self.n_queries)
        uk, ik = parts(kvals, self.key_pos[s.keys.unique_id], self.n_keys)
        return (np.asarray(select_table(s, uq, uk)) != 0)[np.ix_(iq, ik)]
      if isinstance(s, rasp.SelectorNot):
        return ~go(s.inner)
      a, b = go(s.fst), go(s.snd)
      return (a & b) if isinstance(s, rasp.SelectorAnd) else (a | b)
    return go(self.sel)


def _product_select(sel: rasp.Selector, keys: List[rasp.SOp], queries: List[rasp.SOp],
                    key_pos: Dict[int, int], query_pos: Dict[int, int],
                    memo: Dict[tuple, rasp.SOp]) -> rasp.Select:
  """``sel`` as one Select whose keys/queries are the tuples of the SOps it reads (shared
  through ``memo``, see :func:`_tuple_sop`), with a :class:`ProductPredicate`."""
  return rasp.Select(_tuple_sop(keys, memo), _tuple_sop(queries, memo),
                     ProductPredicate(sel, key_pos, query_pos, len(keys), len(queries)))


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
  conj = flatten_and(sel)
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
  products: Dict[tuple, rasp.SOp] = {}      # tuple SOps, one per distinct list of SOps
  selectors: Dict[int, rasp.Selector] = {}  # a selector read by several ops is rewritten once
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
    if sel.unique_id not in selectors:
      selectors[sel.unique_id] = new_selector(sel)
    return selectors[sel.unique_id]

  def new_selector(sel: rasp.Selector) -> rasp.Selector:
    conj = flatten_and(sel)
    if conj is not None:
      parts = [rasp.Select(cat_key(s.keys), cat_key(s.queries), s.predicate) for s in conj]
      out = parts[0]
      for p in parts[1:]:
        out = rasp.SelectorAnd(out, p)
      return keep_annotations(out, sel) if len(parts) == 1 else out
    leaves = _leaves(sel)
    # the SOps each side reads, in one canonical order, so the keys and the queries of
    # selectors that read the same SOps share one tuple SOp
    kin = {leaf.keys.unique_id: leaf.keys for leaf in leaves}
    qin = {leaf.queries.unique_id: leaf.queries for leaf in leaves}
    kin, qin = sorted(kin.values(), key=lambda s: s.unique_id), sorted(qin.values(), key=lambda s: s.unique_id)
    kpos = {s.unique_id: j for j, s in enumerate(kin)}
    qpos = {s.unique_id: j for j, s in enumerate(qin)}
    return _product_select(sel, [cat_key(s) for s in kin], [cat_key(s) for s in qin], kpos, qpos, products)

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


__all__ = ["ProductPredicate", "rewrite"]
