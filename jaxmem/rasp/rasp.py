"""The RASP language (Weiss, Goldberg & Yahav 2021), with tracr's Python API.

A RASP program is a graph of *sequence operations* (SOps) and *selectors*:

* ``tokens``, ``indices`` (and ``length``): the primitives;
* ``Map(f, sop)``, ``SequenceMap(f, a, b)``, ``LinearSequenceMap(a, b, ca, cb)``, ``Full(x)``,
  ``ConstantSOp([...])``: elementwise operations (an MLP in a compiled model);
* ``Select(keys, queries, predicate)`` → a selector ``S[q][k] = predicate(keys[k], queries[q])``;
  ``SelectorAnd / SelectorOr / SelectorNot`` (also ``&  |  ~`` and :func:`And`, :func:`Or`,
  :func:`Not`) compose selectors;
* ``Aggregate(selector, sop, default=None)``: the mean of the selected values (one attention
  head); ``SelectorWidth(selector)``: how many positions are selected.

Every SOp is *categorical* (the default: a value from a finite set, one-hot in a compiled
model) or *numerical* (a number in one residual dimension): ``numerical(sop)`` /
``categorical(sop)`` return an annotated copy. ``.named(name)`` names a node (the compiled
model's residual dimensions and inspection maps use these names); ``annotate(sop,
value_set={...})`` declares a value set, which the compiler then checks.

The API mirrors tracr's ``tracr.rasp.rasp`` (same class names, argument names, operator
overloads and evaluation semantics) so tracr programs port unchanged; predicates are called
``predicate(key, query)`` and any two-argument callable is a predicate. Differences, all
additions: selector composition compiles; ``evaluate`` memoises shared subgraphs (tracr's
re-evaluates them); a *categorical* ``Aggregate`` whose selected values are all equal
returns that value, type included (tracr returns the float mean for numbers and raises for
other types) — the value a compiled categorical head produces.

Operator overloads build Maps and SequenceMaps exactly as tracr's do: ``sop < 3`` is
``Map(lambda x: x < 3, sop)``, ``a - b`` is ``SequenceMap(lambda x, y: x - y, a, b)``,
``~sop`` is ``Map(lambda x: not x, sop)``, ``a & b`` is ``x and y``. Because ``==`` builds a
Map, never compare SOps with ``==``; use ``is``.
"""

from __future__ import annotations

import copy as _copy
import enum
import itertools
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

Value = Any
SelectorValue = List[List[bool]]

__all__ = [
    "Aggregate", "And", "Comparison", "ConstantSOp", "ConstantSelector", "Encoding", "Full",
    "IndicesType", "LengthType", "LinearSequenceMap", "Map", "Not", "Or", "RASPExpr", "SOp",
    "Select", "Selector", "SelectorAnd", "SelectorNot", "SelectorOr", "SelectorWidth",
    "SequenceMap", "TokensType", "annotate", "categorical", "evaluate", "get_encoding",
    "indices", "is_categorical", "is_numerical", "length", "numerical", "selector_and",
    "selector_not", "selector_or", "sop_not", "tokens",
]

_ids = itertools.count()


class RASPExpr:
  """Base of every RASP node. Nodes are immutable after construction except for their
  annotations, which :meth:`named` / :func:`annotate` set on a *copy*."""

  _default_name = "expr"

  def __init__(self):
    self._annotations: Dict[str, Any] = {}
    self._id = next(_ids)

  __hash__ = object.__hash__  # SOps overload ==, so hashing must stay by identity

  @property
  def annotations(self) -> Dict[str, Any]:
    return dict(self._annotations)

  @property
  def children(self) -> Sequence["RASPExpr"]:
    return ()

  @property
  def unique_id(self) -> int:
    return self._id

  @property
  def name(self) -> str:
    return self._annotations.get("name", f"{self._default_name}_{self._id}")

  @property
  def label(self) -> str:
    return self.name

  def copy(self):
    new = _copy.copy(self)
    new._annotations = dict(self._annotations)
    new._id = next(_ids)
    return new

  def named(self, name: str):
    """A copy of this node with the given name."""
    if not isinstance(name, str) or not name:
      raise ValueError(f"`name` must be a non-empty string, got {name!r}.")
    return annotate(self, name=name)

  def annotated(self, **annotations):
    return annotate(self, **annotations)

  def __call__(self, xs: Sequence[Value]):
    return evaluate(self, xs)

  def __repr__(self):
    return f"{type(self).__name__}({self.label})"


def annotate(expr: RASPExpr, **annotations) -> RASPExpr:
  """A copy of ``expr`` with ``annotations`` added (``name=``, ``encoding=``, ``value_set=``)."""
  if not isinstance(expr, RASPExpr):
    raise ValueError(f"can only annotate RASP expressions, got {type(expr).__name__}.")
  if "value_set" in annotations:
    vs = annotations["value_set"]
    try:
      annotations["value_set"] = frozenset(vs)
    except TypeError as e:
      raise ValueError(f"`value_set` must be an iterable of hashable values, got {vs!r}.") from e
  if "encoding" in annotations and not isinstance(annotations["encoding"], Encoding):
    raise ValueError(f"`encoding` must be an Encoding, got {annotations['encoding']!r}.")
  new = expr.copy()
  new._annotations.update(annotations)
  return new


# ----------------------------------------------------------------------------- SOps


class SOp(RASPExpr):
  """A sequence operation: maps an input sequence to a sequence of the same length."""

  _default_name = "sop"

  # operator overloads, as tracr's: comparisons and arithmetic with a constant build a Map,
  # with another SOp a SequenceMap.
  def __lt__(self, other): return Map(lambda x: x < other, self)
  def __le__(self, other): return Map(lambda x: x <= other, self)
  def __eq__(self, other): return Map(lambda x: x == other, self)  # noqa: E704
  def __ne__(self, other): return Map(lambda x: x != other, self)  # noqa: E704
  def __gt__(self, other): return Map(lambda x: x > other, self)
  def __ge__(self, other): return Map(lambda x: x >= other, self)

  def _binary(self, other, f, reflected=False):
    if isinstance(other, SOp):
      return SequenceMap(f, other, self) if reflected else SequenceMap(f, self, other)
    return Map((lambda x: f(other, x)) if reflected else (lambda x: f(x, other)), self)

  def __add__(self, o): return self._binary(o, lambda x, y: x + y)
  def __radd__(self, o): return self._binary(o, lambda x, y: x + y, True)
  def __sub__(self, o): return self._binary(o, lambda x, y: x - y)
  def __rsub__(self, o): return self._binary(o, lambda x, y: x - y, True)
  def __mul__(self, o): return self._binary(o, lambda x, y: x * y)
  def __rmul__(self, o): return self._binary(o, lambda x, y: x * y, True)
  def __truediv__(self, o): return self._binary(o, lambda x, y: x / y)
  def __rtruediv__(self, o): return self._binary(o, lambda x, y: x / y, True)
  def __and__(self, o): return self._binary(o, lambda x, y: x and y)
  def __rand__(self, o): return self._binary(o, lambda x, y: x and y, True)
  def __or__(self, o): return self._binary(o, lambda x, y: x or y)
  def __ror__(self, o): return self._binary(o, lambda x, y: x or y, True)
  def __invert__(self): return Map(lambda x: not x, self)

  __hash__ = RASPExpr.__hash__


class TokensType(SOp):
  """The input tokens."""
  _default_name = "tokens"

  @property
  def name(self):
    return self._annotations.get("name", "tokens")


class IndicesType(SOp):
  """The positions 0, 1, …, n−1."""
  _default_name = "indices"

  @property
  def name(self):
    return self._annotations.get("name", "indices")


class LengthType(SOp):
  """The sequence length n at every position (compiled as ``SelectorWidth(Select(tokens,
  tokens, TRUE))``)."""
  _default_name = "length"

  @property
  def name(self):
    return self._annotations.get("name", "length")


tokens = TokensType()
indices = IndicesType()
length = LengthType()


def _check_sop(name: str, x: Any) -> None:
  if not isinstance(x, SOp):
    raise ValueError(f"`{name}` must be a SOp, got {type(x).__name__}: {x!r}.")


def _check_fn(name: str, f: Any) -> None:
  if not callable(f) or isinstance(f, RASPExpr):
    raise ValueError(f"`{name}` must be a Python callable, got {f!r}.")


class Map(SOp):
  """``Map(f, sop)[i] = f(sop[i])``. With ``simplify=True`` (tracr's default) a Map of a Map
  becomes one Map of the composed function."""

  _default_name = "map"

  def __init__(self, f: Callable[[Value], Value], inner: SOp, simplify: bool = True):
    super().__init__()
    _check_fn("f", f)
    _check_sop("inner", inner)
    self.f, self.inner = f, inner
    if simplify and isinstance(inner, Map) and "value_set" not in inner._annotations:
      g = inner.f
      self.f = lambda x: f(g(x))
      self.inner = inner.inner

  @property
  def children(self):
    return (self.inner,)


class SequenceMap(SOp):
  """``SequenceMap(f, a, b)[i] = f(a[i], b[i])``."""

  _default_name = "sequence_map"

  def __init__(self, f: Callable[[Value, Value], Value], fst: SOp, snd: SOp):
    super().__init__()
    _check_fn("f", f)
    _check_sop("fst", fst)
    _check_sop("snd", snd)
    self.f, self.fst, self.snd = f, fst, snd

  @property
  def children(self):
    return (self.fst, self.snd)


class LinearSequenceMap(SequenceMap):
  """``fst_fac · a[i] + snd_fac · b[i]``: compiled as an exact linear layer when both
  inputs are numerical."""

  _default_name = "linear_sequence_map"

  def __init__(self, fst: SOp, snd: SOp, fst_fac: float, snd_fac: float):
    for n, c in (("fst_fac", fst_fac), ("snd_fac", snd_fac)):
      if isinstance(c, bool) or not isinstance(c, numbers.Real):
        raise ValueError(f"`{n}` must be a real number, got {c!r}.")
    super().__init__(lambda x, y: fst_fac * x + snd_fac * y, fst, snd)
    self.fst_fac, self.snd_fac = fst_fac, snd_fac


class Full(SOp):
  """The constant sequence ``[fill] * n``."""

  _default_name = "full"

  def __init__(self, fill: Value):
    super().__init__()
    self.fill = fill


class ConstantSOp(SOp):
  """A fixed sequence (for tests and the interpreter; not compiled)."""

  _default_name = "constant_sop"

  def __init__(self, value: Sequence[Value], check_length: bool = True):
    super().__init__()
    self.value = list(value)
    self.check_length = check_length


def sop_not(sop: SOp) -> SOp:
  return Map(lambda x: not x, sop)


# ----------------------------------------------------------------------------- selectors


class Comparison(enum.Enum):
  """Predicates for :class:`Select`, called ``pred(key, query)``: ``LT`` is ``key < query``."""

  EQ = "=="
  LT = "<"
  LEQ = "<="
  GT = ">"
  GEQ = ">="
  NEQ = "!="
  TRUE = "True"
  FALSE = "False"

  def __call__(self, key: Value, query: Value) -> bool:
    if key is None:
      raise ValueError("key is None!")
    if query is None:
      raise ValueError("query is None!")
    return _COMPARISONS[self](key, query)


_COMPARISONS = {
    Comparison.EQ: lambda k, q: k == q,
    Comparison.LT: lambda k, q: k < q,
    Comparison.LEQ: lambda k, q: k <= q,
    Comparison.GT: lambda k, q: k > q,
    Comparison.GEQ: lambda k, q: k >= q,
    Comparison.NEQ: lambda k, q: k != q,
    Comparison.TRUE: lambda k, q: True,
    Comparison.FALSE: lambda k, q: False,
}


class Selector(RASPExpr):
  """A boolean matrix ``S[query][key]``: one attention pattern."""

  _default_name = "selector"

  def __and__(self, other): return selector_and(self, other)
  def __rand__(self, other): return selector_and(other, self)
  def __or__(self, other): return selector_or(self, other)
  def __ror__(self, other): return selector_or(other, self)
  def __invert__(self): return selector_not(self)


class Select(Selector):
  """``Select(keys, queries, predicate)[q][k] = predicate(keys[k], queries[q])``."""

  _default_name = "select"

  def __init__(self, keys: SOp, queries: SOp, predicate: Callable[[Value, Value], bool]):
    super().__init__()
    _check_sop("keys", keys)
    _check_sop("queries", queries)
    _check_fn("predicate", predicate)
    self.keys, self.queries, self.predicate = keys, queries, predicate

  @property
  def children(self):
    return (self.keys, self.queries)


class ConstantSelector(Selector):
  """A fixed selector matrix (interpreter only)."""

  _default_name = "constant_selector"

  def __init__(self, value: SelectorValue, check_length: bool = True):
    super().__init__()
    self.value = [list(map(bool, row)) for row in value]
    self.check_length = check_length


class _BinarySelector(Selector):

  def __init__(self, fst: Selector, snd: Selector):
    super().__init__()
    for n, s in (("fst", fst), ("snd", snd)):
      if not isinstance(s, Selector):
        raise ValueError(f"`{n}` must be a Selector, got {type(s).__name__}.")
    self.fst, self.snd = fst, snd

  @property
  def children(self):
    return (self.fst, self.snd)


class SelectorAnd(_BinarySelector):
  """Elementwise ``and`` of two selectors."""
  _default_name = "selector_and"


class SelectorOr(_BinarySelector):
  """Elementwise ``or`` of two selectors."""
  _default_name = "selector_or"


class SelectorNot(Selector):
  _default_name = "selector_not"

  def __init__(self, inner: Selector):
    super().__init__()
    if not isinstance(inner, Selector):
      raise ValueError(f"`inner` must be a Selector, got {type(inner).__name__}.")
    self.inner = inner

  @property
  def children(self):
    return (self.inner,)


def _same_inputs(a: Select, b: Select) -> bool:
  return a.keys is b.keys and a.queries is b.queries


def selector_not(inner: Selector, simplify: bool = True) -> Selector:
  """``~inner``; a Not of a Select becomes one Select with the negated predicate."""
  if simplify and isinstance(inner, Select):
    p = inner.predicate
    return Select(inner.keys, inner.queries, lambda k, q: not p(k, q))
  return SelectorNot(inner)


def selector_and(fst: Selector, snd: Selector, simplify: bool = True) -> Selector:
  """``fst & snd``; two Selects on the same keys and queries become one Select."""
  if simplify and isinstance(fst, Select) and isinstance(snd, Select) and _same_inputs(fst, snd):
    p, r = fst.predicate, snd.predicate
    return Select(fst.keys, fst.queries, lambda k, q: bool(p(k, q)) and bool(r(k, q)))
  return SelectorAnd(fst, snd)


def selector_or(fst: Selector, snd: Selector, simplify: bool = True) -> Selector:
  """``fst | snd``; two Selects on the same keys and queries become one Select."""
  if simplify and isinstance(fst, Select) and isinstance(snd, Select) and _same_inputs(fst, snd):
    p, r = fst.predicate, snd.predicate
    return Select(fst.keys, fst.queries, lambda k, q: bool(p(k, q)) or bool(r(k, q)))
  return SelectorOr(fst, snd)


def And(*selectors: Selector) -> Selector:
  """The conjunction of one or more selectors."""
  if not selectors:
    raise ValueError("And needs at least one selector.")
  out = selectors[0]
  for s in selectors[1:]:
    out = selector_and(out, s)
  return out


def Or(*selectors: Selector) -> Selector:
  """The disjunction of one or more selectors."""
  if not selectors:
    raise ValueError("Or needs at least one selector.")
  out = selectors[0]
  for s in selectors[1:]:
    out = selector_or(out, s)
  return out


def Not(selector: Selector) -> Selector:
  """The negation of a selector."""
  return selector_not(selector)


class SelectorWidth(SOp):
  """``SelectorWidth(S)[q]`` = the number of keys ``S`` selects for query ``q``."""

  _default_name = "selector_width"

  def __init__(self, selector: Selector):
    super().__init__()
    if not isinstance(selector, Selector):
      raise ValueError(f"`selector` must be a Selector, got {type(selector).__name__}.")
    self.selector = selector

  @property
  def children(self):
    return (self.selector,)


class Aggregate(SOp):
  """``Aggregate(S, sop, default)[q]`` = the mean of ``sop`` over the keys ``S`` selects for
  ``q``, or ``default`` where it selects none. Categorical aggregates must select keys that
  all hold the same value (then the mean is that value)."""

  _default_name = "aggregate"

  def __init__(self, selector: Selector, sop: SOp, default: Optional[Value] = None):
    super().__init__()
    if not isinstance(selector, Selector):
      raise ValueError(f"`selector` must be a Selector, got {type(selector).__name__}.")
    _check_sop("sop", sop)
    if default is not None and not isinstance(default, (str, float, bool, int)):
      raise ValueError(f"`default` must be None, str, float, bool or int, got {default!r}.")
    self.selector, self.sop, self.default = selector, sop, default

  @property
  def children(self):
    return (self.selector, self.sop)


# ----------------------------------------------------------------------------- encodings


class Encoding(enum.Enum):
  CATEGORICAL = "categorical"
  NUMERICAL = "numerical"


def numerical(sop: SOp) -> SOp:
  """A copy of ``sop`` encoded as one number per position."""
  _check_sop("sop", sop)
  return annotate(sop, encoding=Encoding.NUMERICAL)


def categorical(sop: SOp) -> SOp:
  """A copy of ``sop`` encoded one-hot over its value set (the default)."""
  _check_sop("sop", sop)
  return annotate(sop, encoding=Encoding.CATEGORICAL)


def get_encoding(sop: SOp) -> Encoding:
  return sop._annotations.get("encoding", Encoding.CATEGORICAL)


def is_numerical(sop: SOp) -> bool:
  return get_encoding(sop) is Encoding.NUMERICAL


def is_categorical(sop: SOp) -> bool:
  return get_encoding(sop) is Encoding.CATEGORICAL


# ----------------------------------------------------------------------------- evaluation


def _mean(values: Sequence[Value], default: Value, categorical: bool = False) -> Value:
  if not values:
    return default
  first = values[0]
  if len(values) == 1 or (categorical and all(v == first and type(v) is type(first) for v in values)):
    return first
  if all(isinstance(v, (int, bool, float)) for v in values):
    return sum(values) / len(values)
  if all(v == first for v in values):
    return first
  raise ValueError(f"Aggregate of non-numerical values that differ: {list(values)!r}.")


class Evaluator:
  """The reference interpreter (tracr's semantics; shared subgraphs evaluated once)."""

  def __init__(self, xs: Sequence[Value]):
    self.xs = list(xs)
    self.memo: Dict[int, Any] = {}

  def __call__(self, expr: RASPExpr):
    key = expr.unique_id
    if key not in self.memo:
      self.memo[key] = self._eval(expr)
    return self.memo[key]

  def _eval(self, e: RASPExpr):
    xs, n = self.xs, len(self.xs)
    if isinstance(e, TokensType):
      return list(xs)
    if isinstance(e, IndicesType):
      return list(range(n))
    if isinstance(e, LengthType):
      return [n] * n
    if isinstance(e, Map):
      return [e.f(x) if x is not None else None for x in self(e.inner)]
    if isinstance(e, SequenceMap):
      return [e.f(x, y) if x is not None and y is not None else None
              for x, y in zip(self(e.fst), self(e.snd), strict=True)]
    if isinstance(e, Full):
      return [e.fill] * n
    if isinstance(e, ConstantSOp):
      if e.check_length and len(e.value) != n:
        raise ValueError(f"Constant len {len(e.value)} doesn't match input len {n}.")
      return list(e.value)
    if isinstance(e, Select):
      keys, queries = self(e.keys), self(e.queries)
      return [[bool(e.predicate(k, q)) for k in keys] for q in queries]
    if isinstance(e, ConstantSelector):
      if e.check_length and len(e.value) != n:
        raise ValueError(f"Constant len {len(e.value)} doesn't match input len {n}.")
      return e.value
    if isinstance(e, SelectorOr):
      a, b = self(e.fst), self(e.snd)
      return [[x or y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]
    if isinstance(e, SelectorAnd):
      a, b = self(e.fst), self(e.snd)
      return [[x and y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]
    if isinstance(e, SelectorNot):
      return [[not x for x in row] for row in self(e.inner)]
    if isinstance(e, SelectorWidth):
      return [sum(row) for row in self(e.selector)]
    if isinstance(e, Aggregate):
      sel, vals = self(e.selector), self(e.sop)
      cat = is_categorical(e)
      return [_mean([v for s, v in zip(row, vals, strict=True) if s], e.default, cat) for row in sel]
    raise NotImplementedError(f"evaluation of {e!r} is not defined.")


def evaluate(expr: RASPExpr, xs: Sequence[Value]) -> Union[List[Value], SelectorValue]:
  """Runs ``expr`` on the input sequence ``xs`` (a list of tokens, no BOS)."""
  if not isinstance(expr, RASPExpr):
    raise ValueError(f"`expr` must be a RASP expression, got {type(expr).__name__}.")
  return Evaluator(xs)(expr)
