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

import abc
import collections.abc
import copy as _copy
import enum
import itertools
import numbers
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, TypeVar, Union

SelectorValue = List[List[bool]]
NumericValue = Union[int, float]
Value = Union[None, int, float, str, bool]
VT = TypeVar("VT", bound=Value)
RASPExprT = TypeVar("RASPExprT", bound="RASPExpr")
SOpT = TypeVar("SOpT", bound="SOp")
T = TypeVar("T")

__all__ = [
    "DEFAULT_ANNOTATORS", "Aggregate", "And", "Annotator", "Comparison", "ConstantSOp",
    "ConstantSelector", "DefaultRASPEvaluator", "Encoding", "Full", "IndicesType", "LengthType",
    "LinearSequenceMap", "Map", "Not", "NumericValue", "Or", "Predicate", "RASPEvaluator",
    "RASPExpr", "RASPExprT", "SOp", "SOpT", "Select", "Selector", "SelectorAnd", "SelectorNot",
    "SelectorOr", "SelectorValue", "SelectorWidth", "SequenceMap", "T", "TokensType", "VT", "Value",
    "annotate", "categorical", "default_encoding", "default_name", "evaluate", "get_encoding",
    "indices", "is_categorical", "is_numerical", "length", "numerical", "selector_and",
    "selector_not", "selector_or", "sop_not", "tokens",
]

_ids = itertools.count()


class Annotator(Protocol):
  """A default annotation: called with the expression the first time its key is read."""

  def __call__(self, expr: "RASPExpr") -> Any: ...


# Default annotations, computed when first read (tracr's hook): ``DEFAULT_ANNOTATORS[key](expr)``
# gives ``expr.annotations[key]`` when the key was never set. ``name`` and ``encoding`` are
# registered below.
DEFAULT_ANNOTATORS: Dict[str, Annotator] = {}


class _Annotations(collections.abc.Mapping):
  """``expr.annotations``: the keys set on the node, and on reading a missing key, its default
  from :data:`DEFAULT_ANNOTATORS` (as tracr's; ``"name" in expr.annotations`` is therefore true)."""

  def __init__(self, expr: "RASPExpr"):
    self._expr = expr

  def __getitem__(self, key: str) -> Any:
    own = self._expr._annotations
    if key in own:
      return own[key]
    if key in DEFAULT_ANNOTATORS:
      return DEFAULT_ANNOTATORS[key](self._expr)
    raise KeyError(f"no annotation {key!r} on {self._expr!r}; set keys: {sorted(own)}.")

  def __iter__(self):
    return iter(self._expr._annotations)

  def __len__(self):
    return len(self._expr._annotations)


class RASPExpr:
  """Base of every RASP node. Nodes are immutable after construction except for their
  annotations, which :meth:`named` / :func:`annotate` set on a *copy*."""

  _default_name = "expr"

  def __init__(self):
    self._annotations: Dict[str, Any] = {}
    self._id = next(_ids)

  __hash__ = object.__hash__  # SOps overload ==, so hashing must stay by identity

  @property
  def annotations(self) -> Mapping[str, Any]:
    """The annotations (read-only; missing keys fall back to :data:`DEFAULT_ANNOTATORS`)."""
    return _Annotations(self)

  @annotations.setter
  def annotations(self, annotations: Mapping[str, Any]):
    self._annotations = dict(annotations)

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


class Predicate(Protocol):
  """What :class:`Select` takes: ``predicate(key, query) -> bool``."""

  def __call__(self, key: Value, query: Value) -> bool: ...


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


def default_encoding(expr: RASPExpr) -> Encoding:
  """The default ``encoding`` annotation of a SOp: categorical."""
  if not isinstance(expr, SOp):
    raise ValueError(f"`expr` must be a SOp to have an encoding, got {type(expr).__name__}.")
  return Encoding.CATEGORICAL


def default_name(expr: RASPExpr) -> str:
  """The default ``name`` annotation (``map_12``, ``tokens``, …)."""
  if not isinstance(expr, RASPExpr):
    raise ValueError(f"`expr` must be a RASP expression, got {type(expr).__name__}.")
  return expr.name


DEFAULT_ANNOTATORS["encoding"] = default_encoding
DEFAULT_ANNOTATORS["name"] = default_name


def is_numerical(sop: SOp) -> bool:
  return get_encoding(sop) is Encoding.NUMERICAL


def is_categorical(sop: SOp) -> bool:
  return get_encoding(sop) is Encoding.CATEGORICAL


# ----------------------------------------------------------------------------- evaluation


def _mean(values: Sequence[Value], default: Value, categorical: bool = False) -> Value:
  if not values:
    return default
  first = values[0]
  if len(values) == 1:
    return first
  if all(isinstance(v, (int, bool, float)) for v in values):   # tracr: numbers average, categorical too
    return sum(values) / len(values)
  if categorical and all(v == first and type(v) is type(first) for v in values):
    return first   # jaxmem's addition: equal non-numbers (tracr raises)
  raise ValueError(f"Aggregate of non-numerical values that differ: {list(values)!r}.")


class RASPEvaluator(abc.ABC):
  """An interpreter of RASP expressions (tracr's base class)."""

  @abc.abstractmethod
  def evaluate(self, expr: RASPExpr, xs: Sequence[Value]) -> Union[Sequence[Value], SelectorValue]:
    """Evaluates ``expr`` on the input sequence ``xs``."""


class DefaultRASPEvaluator(RASPEvaluator):
  """The reference interpreter, with tracr's semantics and method names (``eval_map``,
  ``eval_aggregate``, …; override one to change a rule). One call of :meth:`evaluate`
  evaluates each node of a shared subgraph once.

  ``causal=True`` is the semantics of a causally masked model: every selector is masked to
  the keys at or before its query (``S[q][k]`` is False for ``k > q``, after ``Not`` too) and
  ``length`` at position ``i`` is ``i + 1``, the length visible there."""

  def __init__(self, causal: bool = False):
    if not isinstance(causal, bool):
      raise ValueError(f"`causal` must be a bool, got {causal!r}.")
    self.causal = causal
    self._local = threading.local()
    self._eval_fn_by_expr_type = {
        TokensType: self.eval_tokens, IndicesType: self.eval_indices, LengthType: self.eval_length,
        LinearSequenceMap: self.eval_sequence_map, SequenceMap: self.eval_sequence_map,
        Map: self.eval_map, Full: self.eval_full, ConstantSOp: self.eval_constant_sop,
        SelectorWidth: self.eval_selector_width, Aggregate: self.eval_aggregate,
        Select: self.eval_select, SelectorAnd: self.eval_selector_and,
        SelectorOr: self.eval_selector_or, SelectorNot: self.eval_selector_not,
        ConstantSelector: self.eval_constant_selector,
    }

  def evaluate(self, expr: RASPExpr, xs: Sequence[Value]) -> Union[Sequence[Value], SelectorValue]:
    """Runs ``expr`` on the input sequence ``xs`` (a list of tokens, no BOS)."""
    if not isinstance(expr, RASPExpr):
      raise ValueError(f"`expr` must be a RASP expression, got {type(expr).__name__}.")
    local = self._local
    outer = getattr(local, "memo", None) is None
    if outer:
      local.memo, local.xs = {}, xs
    try:
      key = (expr.unique_id, id(xs))
      if key not in local.memo:
        fn = self._eval_fn_by_expr_type.get(type(expr))
        if fn is None:
          fn = next((f for cls, f in self._eval_fn_by_expr_type.items() if isinstance(expr, cls)), None)
        if fn is None:
          raise NotImplementedError(f"evaluation of {expr!r} is not defined.")
        out = fn(expr, xs)
        if self.causal and isinstance(expr, Selector):
          out = [[bool(s) and k <= q for k, s in enumerate(row)] for q, row in enumerate(out)]
        local.memo[key] = out
      return local.memo[key]
    finally:
      if outer:
        local.memo = local.xs = None

  def eval_tokens(self, sop: TokensType, xs: Sequence[Value]) -> List[Value]:
    return list(xs)

  def eval_indices(self, sop: IndicesType, xs: Sequence[Value]) -> List[int]:
    return list(range(len(xs)))

  def eval_length(self, sop: LengthType, xs: Sequence[Value]) -> List[int]:
    n = len(xs)
    return [i + 1 for i in range(n)] if self.causal else [n] * n

  def eval_sequence_map(self, sop: SequenceMap, xs: Sequence[Value]) -> List[Value]:
    a, b = self.evaluate(sop.fst, xs), self.evaluate(sop.snd, xs)
    return [sop.f(x, y) if x is not None and y is not None else None for x, y in zip(a, b, strict=True)]

  def eval_map(self, sop: Map, xs: Sequence[Value]) -> List[Value]:
    return [sop.f(x) if x is not None else None for x in self.evaluate(sop.inner, xs)]

  def eval_full(self, sop: Full, xs: Sequence[Value]) -> List[Value]:
    return [sop.fill] * len(xs)

  def eval_constant_sop(self, sop: ConstantSOp, xs: Sequence[Value]) -> List[Value]:
    if sop.check_length and len(sop.value) != len(xs):
      raise ValueError(f"Constant len {len(sop.value)} doesn't match input len {len(xs)}.")
    return list(sop.value)

  def eval_selector_width(self, sop: SelectorWidth, xs: Sequence[Value]) -> List[int]:
    return [sum(row) for row in self.evaluate(sop.selector, xs)]

  def eval_aggregate(self, sop: Aggregate, xs: Sequence[Value]) -> List[Value]:
    sel, vals = self.evaluate(sop.selector, xs), self.evaluate(sop.sop, xs)
    cat = is_categorical(sop)
    return [_mean([v for s, v in zip(row, vals, strict=True) if s], sop.default, cat) for row in sel]

  def eval_select(self, sel: Select, xs: Sequence[Value]) -> SelectorValue:
    keys, queries = self.evaluate(sel.keys, xs), self.evaluate(sel.queries, xs)
    return [[bool(sel.predicate(k, q)) for k in keys] for q in queries]

  def eval_constant_selector(self, sel: ConstantSelector, xs: Sequence[Value]) -> SelectorValue:
    if sel.check_length and len(sel.value) != len(xs):
      raise ValueError(f"Constant len {len(sel.value)} doesn't match input len {len(xs)}.")
    return [list(row) for row in sel.value]

  def eval_selector_and(self, sel: SelectorAnd, xs: Sequence[Value]) -> SelectorValue:
    a, b = self.evaluate(sel.fst, xs), self.evaluate(sel.snd, xs)
    return [[x and y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]

  def eval_selector_or(self, sel: SelectorOr, xs: Sequence[Value]) -> SelectorValue:
    a, b = self.evaluate(sel.fst, xs), self.evaluate(sel.snd, xs)
    return [[x or y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]

  def eval_selector_not(self, sel: SelectorNot, xs: Sequence[Value]) -> SelectorValue:
    return [[not x for x in row] for row in self.evaluate(sel.inner, xs)]


class Evaluator:
  """``Evaluator(xs)(expr)``: one input, every node's value memoised across calls."""

  def __init__(self, xs: Sequence[Value], causal: bool = False):
    self.xs = list(xs)
    self._ev = DefaultRASPEvaluator(causal)
    self._ev._local.memo, self._ev._local.xs = {}, self.xs

  def __call__(self, expr: RASPExpr):
    return self._ev.evaluate(expr, self.xs)


_EVALUATORS = {False: DefaultRASPEvaluator(False), True: DefaultRASPEvaluator(True)}


def evaluate(expr: RASPExpr, xs: Sequence[Value], causal: bool = False
             ) -> Union[List[Value], SelectorValue]:
  """Runs ``expr`` on the input sequence ``xs`` (a list of tokens, no BOS); ``causal=True``:
  as a causally masked model computes it (see :class:`DefaultRASPEvaluator`)."""
  if not isinstance(causal, bool):
    raise ValueError(f"`causal` must be a bool, got {causal!r}.")
  return _EVALUATORS[causal].evaluate(expr, xs)
