"""A differential fuzzer for the RASP compiler: random programs over the whole DSL, each compiled and
compared with the interpreter on every short input and random longer ones.

:func:`generate` ``(seed, index)`` → a :class:`Program`: 2–8 ops drawn from the whole language
(``tokens`` over int, float, str, bool and mixed vocabularies of ≤ 4 tokens, ``indices``,
``length``; categorical and numerical ``Map`` — functions that raise on some inputs, return None,
return constants, do float arithmetic — ``SequenceMap``, ``LinearSequenceMap``, the operator
overloads, ``Full``, ``ConstantSOp``; ``Select`` with every ``Comparison`` and custom predicates;
``And`` / ``Or`` / ``Not`` and ``& | ~``; categorical and numerical ``Aggregate`` with default None
or a value; ``SelectorWidth``; ``numerical`` / ``categorical`` copies; named, unnamed and
same-named SOps; sub-SOps shared in a DAG), ``max_seq_len`` 3–8, causal or not. A program is
its source text (:meth:`Program.source`, what :func:`describe` prints: paste it into a bug
report), built by executing that text against :mod:`jaxmem.rasp` — or against tracr's
``tracr.rasp.rasp``, the same program in tracr's DSL.

:func:`check` compiles one program (``rasp.compile``, timed, under a time limit): a ``ValueError``
is a *refusal*, any other exception or a compile past the limit a *crash*. A compiled program
is run on every input up to a length (≤ ``max_exhaustive`` inputs) and ``n_random`` random ones
up to ``max_seq_len``, by

* the interpreter (``rasp.evaluate``, causal as compiled), the reference;
* the compiled model (``model.apply_batch``);
* the model on the simulator's machine (``model_to_machine.to_machine(model).apply_batch``; a
  machine that fails to build is a crash of that path);
* tracr's interpreter on the same program built in tracr's DSL (when ``tracr-pypi`` is
  installed), against ``rasp.evaluate``.

Agreement is strict (:func:`same_outputs`): ``None`` equals only ``None`` (a numerical ``None``
read as 0 is wrong); numerical outputs agree to the compiler's contract ``1e-6 + 1e-6·|value|``
(``jaxmem/rasp/README.md``: float32 holds ~7 significant digits, and a mean of ≤ 8 float32 values
carries a few roundings of ``2^-24`` each); categorical outputs are equal with the same type
class (``bool``, ``int`` and ``float`` are one class: equal numbers share a one-hot slot, the
README's "Equal in Python, one slot"; ``str``, tuples elementwise). An input on which both sides
raise agrees. The reference treats a categorical Aggregate that averages different values as
raising (:class:`StrictEvaluator`): the model raises there by design (README, Limits) while
``rasp.evaluate`` returns the mean of numbers. Any other disagreement is *wrong*.

:func:`run` checks programs ``start .. start+n−1`` of a seed (in worker processes with
``workers > 1``; a worker stuck past a hard limit is killed and its program reported as a hang)
and returns a :class:`Summary` (:meth:`Summary.table`, :meth:`Summary.classes`); :func:`shrink`
reduces a failing program to a smaller one failing the same way (fewer ops, simpler operands,
smaller ``max_seq_len`` and vocabulary, non-causal). ``jaxmem reproduce --only rasp_fuzz`` runs it
as an experiment; ``tests/rasp/test_fuzz.py`` runs a seeded slice.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import multiprocessing
import multiprocessing.connection
import numbers
import os
import random
import re
import signal
import threading
import time
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from jaxmem.rasp import rasp
from jaxmem.rasp.compiler import compile as compile_program
from jaxmem.rasp.model import CompiledModel
from jaxmem.rasp.model_to_machine import to_machine

__all__ = ["RAISED", "Failure", "Node", "Program", "Result", "StrictEvaluator", "Summary", "check", "describe",
           "generate", "inputs_for", "normalise", "run", "same_outputs", "shrink", "shrink_all", "tracr_rasp",
           "vocab_kind"]

RAISED = "<raised>"   # the outcome of an input on which a path raises (both raising agree)
PRIMITIVES = ("rasp.tokens", "rasp.indices", "rasp.length")
ATOL = RTOL = 1e-6    # the compiler's documented numerical contract (jaxmem/rasp/README.md, Limits)
# XLA's CPU backend set for compile time (LLVM -O0, the classic elemental emitter): the test suite's
# flags (tests/conftest.py); the same HLO programs, another CPU numerically.
FAST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")

# ----------------------------------------------------------------------------- programs


@dataclasses.dataclass(frozen=True)
class Node:
  """One line of a program: ``var = template`` with ``@0``, ``@1`` replaced by ``refs`` (earlier
  variables or primitives). ``selector``: the line builds a selector; ``tags``: the constructs it
  uses (for coverage counts)."""

  var: str
  template: str
  refs: Tuple[str, ...]
  selector: bool
  tags: Tuple[str, ...]

  def text(self) -> str:
    out = self.template
    for i in reversed(range(len(self.refs))):
      out = out.replace(f"@{i}", self.refs[i])
    return out


@dataclasses.dataclass(frozen=True)
class Program:
  """A generated program: its lines, output variable, vocabulary, ``max_seq_len`` and whether it
  is compiled causally; reproducible from ``(seed, index)`` by :func:`generate`."""

  seed: int
  index: int
  vocab: Tuple[Any, ...]
  max_seq_len: int
  causal: bool
  nodes: Tuple[Node, ...]
  output: str

  def reachable(self) -> Tuple[Node, ...]:
    """The lines the output depends on, in order (the program; other lines are dropped)."""
    by_var = {n.var: n for n in self.nodes}
    keep, todo = set(), [self.output]
    while todo:
      v = todo.pop()
      if v in by_var and v not in keep:
        keep.add(v)
        todo += list(by_var[v].refs)
    return tuple(n for n in self.nodes if n.var in keep)

  def body(self) -> str:
    return "\n".join([f"{n.var} = {n.text()}" for n in self.reachable()] + [f"program = {self.output}"])

  def source(self, inputs: Optional[Sequence[Any]] = None) -> str:
    """Python source that rebuilds, compiles and runs the program (paste into a bug report)."""
    lines = [f"# jaxmem.rasp.fuzz program (seed={self.seed}, index={self.index})", "from jaxmem import rasp",
             "", self.body(), "",
             f"vocab, max_seq_len, causal = {list(self.vocab)!r}, {self.max_seq_len}, {self.causal}",
             "model = rasp.compile(program, vocab, max_seq_len, causal=causal)"]
    if inputs is not None:
      lines += [f"xs = {list(inputs)!r}",
                "print(rasp.evaluate(program, xs, causal=causal), model.apply(xs))"]
    return "\n".join(lines) + "\n"

  def build(self, module: Any = rasp) -> rasp.SOp:
    """The program as a SOp of ``module`` (:mod:`jaxmem.rasp`, or :func:`tracr_rasp`)."""
    ns: Dict[str, Any] = {"rasp": module}
    exec(compile(self.body(), f"<fuzz program {self.seed}:{self.index}>", "exec"), ns)  # noqa: S102
    return ns["program"]

  def constructs(self) -> collections.Counter:
    """How often each construct occurs among the reachable lines (plus the program's vocabulary
    kind, causal flag and shared sub-SOps)."""
    nodes = self.reachable()
    out = collections.Counter(t for n in nodes for t in n.tags)
    uses = collections.Counter(r for n in nodes for r in n.refs)
    out.update(f"primitive:{p.split('.')[1]}" for p in PRIMITIVES if uses[p])
    out["shared"] += sum(1 for v, k in uses.items() if k > 1 and v not in PRIMITIVES)
    out["causal" if self.causal else "non-causal"] += 1
    out[f"vocab:{vocab_kind(self.vocab)}"] += 1
    return out

  @property
  def size(self) -> int:
    return len(self.reachable())

  def renumbered(self) -> "Program":
    """The reachable lines with their variables (and the names equal to them) numbered 1, 2, …"""
    nodes = self.reachable()
    new = {n.var: f"{'sel' if n.selector else 's'}{k}" for k, n in enumerate(nodes, 1)}

    def names(t: str) -> str:
      return re.sub(r"\.named\('([^']*)'\)", lambda m: f".named({new.get(m.group(1), m.group(1))!r})", t)
    out = tuple(dataclasses.replace(n, var=new[n.var], template=names(n.template),
                                    refs=tuple(new.get(r, r) for r in n.refs)) for n in nodes)
    return dataclasses.replace(self, nodes=out, output=new.get(self.output, self.output))


def vocab_kind(vocab: Sequence[Any]) -> str:
  """``int``, ``float``, ``bool``, ``str``, or ``any`` (mixed types)."""
  kinds = {type(v).__name__ for v in vocab}
  return kinds.pop() if len(kinds) == 1 and kinds <= {"int", "float", "bool", "str"} else "any"


def describe(program: Program, inputs: Optional[Sequence[Any]] = None) -> str:
  """``program.source(inputs)``: readable, runnable Python."""
  return program.source(inputs)


# Vocabularies: (kind, tokens, weight). Kinds: int, float, num (ints and floats), bool, str, any.
VOCABS = [
    ("int", (0, 1, 2), 3), ("int", (1, 2, 3), 3), ("int", (0, 1, 2, 3), 2), ("int", (-2, 0, 1, 3), 2),
    ("int", (0, 5), 1), ("int", (2 ** 53, 2 ** 53 + 1, 3), 0.4),
    ("float", (0.5, 1.5, 2.0), 2), ("float", (0.1, 0.2, 0.3), 2), ("float", (-1.0, 0.25, 2.5), 1),
    ("bool", (False, True), 2), ("bool", (True, False), 1),
    ("str", ("a", "b", "c"), 3), ("str", ("a", "b"), 2), ("str", ("x", "y", "z", "w"), 1),
    ("str", ("", "a", "ab"), 1),
    ("any", ("a", 1, 2.5), 1), ("any", (0, "a"), 1), ("any", (True, "x", 2), 1),
]

NUMERIC = ("int", "float", "num", "bool")

# Map functions by input kind: (source, output kind ("same": the input's), tags). "typed": tells
# equal numbers of different types apart (str(1.0) != str(1)), which the README rules out for
# numerical SOps and SOps mixing ints and floats.
_MAPS = {
    "int": [("lambda x: x + 1", "int", ()), ("lambda x: x - 1", "int", ()), ("lambda x: 2 * x", "int", ()),
            ("lambda x: x % 2", "int", ()), ("lambda x: x // 2", "int", ()), ("lambda x: -x", "int", ()),
            ("lambda x: min(x, 2)", "int", ()), ("lambda x: abs(x - 2)", "int", ()),
            ("lambda x: x > 1", "bool", ()), ("lambda x: x == 0", "bool", ()),
            ("lambda x: x % 2 == 1", "bool", ()),
            ("lambda x: 1 / (x - 1)", "float", ("raises", "float")), ("lambda x: 6 // x", "int", ("raises",)),
            ("lambda x: [4, 5, 6][x]", "int", ("raises",)),
            ("lambda x: None if x == 1 else x", "int", ("none",)),
            ("lambda x: x / 2", "float", ("float",)), ("lambda x: x * 0.1", "float", ("float",)),
            ("lambda x: x / 3", "float", ("float",)), ("lambda x: str(x)", "str", ("typed",)),
            ("lambda x: 'abc'[x % 3]", "str", ())],
    "float": [("lambda x: x + 0.5", "float", ("float",)), ("lambda x: 2 * x", "float", ("float",)),
              ("lambda x: x - 0.1", "float", ("float",)), ("lambda x: x > 0.5", "bool", ()),
              ("lambda x: x == 0.5", "bool", ()), ("lambda x: x == 0.3", "bool", ()),
              ("lambda x: round(x, 1)", "float", ("float",)), ("lambda x: int(x)", "int", ()),
              ("lambda x: 1 / x", "float", ("raises", "float")), ("lambda x: x * x", "float", ("float",)),
              ("lambda x: None if x > 1 else x", "float", ("none",)), ("lambda x: x < 1.25", "bool", ()),
              ("lambda x: abs(x - 1)", "float", ("float",)), ("lambda x: x // 0.5", "float", ("float",))],
    "num": [("lambda x: x + 1", "num", ()), ("lambda x: 2 * x", "num", ()), ("lambda x: x > 1", "bool", ()),
            ("lambda x: x == 0", "bool", ()), ("lambda x: x / 2", "float", ("float",)),
            ("lambda x: x * 0.1", "float", ("float",)), ("lambda x: -x", "num", ()),
            ("lambda x: min(x, 1)", "num", ()), ("lambda x: 1 / x", "float", ("raises", "float")),
            ("lambda x: None if x > 1 else x", "num", ("none",)), ("lambda x: round(x, 1)", "num", ()),
            ("lambda x: int(x)", "int", ()), ("lambda x: x % 2", "num", ())],
    "bool": [("lambda x: not x", "bool", ()), ("lambda x: int(x)", "int", ()),
             ("lambda x: 'y' if x else 'n'", "str", ()), ("lambda x: None if x else 0", "int", ("none",)),
             ("lambda x: 2 * x", "int", ()), ("lambda x: x and 3", "any", ()),
             ("lambda x: x + 0.5", "float", ("float",))],
    "str": [("lambda x: x == 'a'", "bool", ()), ("lambda x: x < 'b'", "bool", ()),
            ("lambda x: x.upper()", "str", ()),
            ("lambda x: x + x", "str", ()), ("lambda x: len(x)", "int", ()),
            ("lambda x: {'a': 0, 'b': 1}[x]", "int", ("raises",)),
            ("lambda x: None if x == 'a' else x", "str", ("none",)), ("lambda x: x[:1]", "str", ()),
            ("lambda x: int(x)", "int", ("raises",)), ("lambda x: x + '!'", "str", ()),
            ("lambda x: ord(x[0]) % 3", "int", ("raises",))],
    "tuple": [("lambda x: x[0]", "any", ()), ("lambda x: len(x)", "int", ()),
              ("lambda x: x[0] == x[1]", "bool", ())],
    "any": [("lambda x: x == 1", "bool", ()), ("lambda x: str(x)", "str", ("typed",)),
            ("lambda x: x == 'a'", "bool", ()), ("lambda x: x + 1", "any", ("raises",)),
            ("lambda x: (x, 0)", "tuple", ()), ("lambda x: x if x else None", "any", ("none",))],
    "none": [],
}
_MAPS_COMMON = [("lambda x: x", "same", ()), ("lambda x: 3", "int", ("const",)),
                ("lambda x: 'c'", "str", ("const",)),
                ("lambda x: None", "none", ("none", "const")), ("lambda x: 0.5", "float", ("const", "float")),
                ("lambda x: x == x", "bool", ()), ("lambda x: True", "bool", ("const",))]

_SEQMAPS = {
    ("num", "num"): [("lambda x, y: x + y", "num", ()), ("lambda x, y: x - y", "num", ()),
                     ("lambda x, y: x * y", "num", ()), ("lambda x, y: max(x, y)", "num", ()),
                     ("lambda x, y: x == y", "bool", ()), ("lambda x, y: x < y", "bool", ()),
                     ("lambda x, y: x / y", "float", ("raises", "float")),
                     ("lambda x, y: (x + y) % 3", "num", ()),
                     ("lambda x, y: None if x == y else x - y", "num", ("none",)),
                     ("lambda x, y: 0.5 * x + y", "float", ("float",)), ("lambda x, y: x and y", "num", ()),
                     ("lambda x, y: x or y", "num", ()), ("lambda x, y: x if y else -1", "num", ())],
    ("str", "str"): [("lambda x, y: x + y", "str", ()), ("lambda x, y: x == y", "bool", ()),
                     ("lambda x, y: x < y", "bool", ()), ("lambda x, y: min(x, y)", "str", ()),
                     ("lambda x, y: x if x < y else None", "str", ("none",))],
    "mixed": [("lambda x, y: (x, y)", "tuple", ()), ("lambda x, y: x == y", "bool", ()),
              ("lambda x, y: y if x else x", "any", ()), ("lambda x, y: x * y", "any", ("raises",)),
              ("lambda x, y: x != y", "bool", ()), ("lambda x, y: y if x == y else x", "any", ())],
}
_SEQMAPS_COMMON = [("lambda x, y: x", "fst", ()), ("lambda x, y: 1", "int", ("const",))]

_OVERLOAD_MAPS = {
    "num": [("@0 + 1", "num"), ("@0 - 1", "num"), ("2 * @0", "num"), ("@0 < 2", "bool"), ("@0 >= 1", "bool"),
            ("@0 == 0", "bool"), ("@0 != 1", "bool"), ("1 - @0", "num"), ("@0 / 2", "float")],
    "bool": [("~@0", "bool"), ("@0 & True", "bool"), ("@0 | False", "bool")],
    "str": [("@0 == 'a'", "bool"), ("@0 + 'x'", "str"), ("@0 < 'b'", "bool")],
    "any": [("@0 == 1", "bool"), ("@0 != 'a'", "bool")],
}
_OVERLOAD_SEQMAPS = {"num": [("@0 + @1", "num"), ("@0 - @1", "num"), ("@0 * @1", "num"), ("@0 & @1", "num"),
                             ("@0 | @1", "num"), ("@0 / @1", "float")],
                     "str": [("@0 + @1", "str")]}

COMPARISONS = ("EQ", "LT", "LEQ", "GT", "GEQ", "NEQ", "TRUE", "FALSE")
_PREDICATES = {
    "num": ["lambda k, q: k == q + 1", "lambda k, q: abs(k - q) <= 1", "lambda k, q: (k + q) % 2 == 0",
            "lambda k, q: k < q or k == 0", "lambda k, q: k * q > 1", "lambda k, q: q - k == 2"],
    "str": ["lambda k, q: k[:1] == q[:1]", "lambda k, q: k != q and k < 'c'", "lambda k, q: k + q == 'ab'"],
    "any": ["lambda k, q: k == q or q == 1", "lambda k, q: k != q", "lambda k, q: True", "lambda k, q: k == k"],
}
_COEFFS = (1, -1, 2, 0.5, 0, -0.5, 3, 0.25)
_DEFAULTS = {"int": (0, -1, 2), "float": (0.0, 0.5), "num": (0, 1.5), "bool": (False, True), "str": ("z", "a"),
             "tuple": ("t",), "any": (0, "z"), "none": (0,)}


def family(kind: str) -> str:
  return "num" if kind in NUMERIC else ("str" if kind == "str" else "any")


class _Generator:
  """Builds one program line by line, tracking each SOp's value kind and encoding so that most
  functions fit their inputs (some deliberately do not: they raise on some or all values)."""

  def __init__(self, rng: random.Random, vocab_kind: str):
    self.rng = rng
    self.nodes: List[Node] = []
    self.kind: Dict[str, str] = {"rasp.tokens": vocab_kind, "rasp.indices": "int", "rasp.length": "int"}
    self.numerical: Dict[str, bool] = dict.fromkeys(self.kind, False)
    self.sops: List[str] = list(PRIMITIVES)
    self.sels: List[str] = []
    self.names: List[str] = []
    self.count = 0

  # -- helpers
  def choice(self, xs):
    return xs[self.rng.randrange(len(xs))]

  def chance(self, p: float) -> bool:
    return self.rng.random() < p

  def pick_sop(self, ok: Callable[[str], bool] = lambda v: True) -> Optional[str]:
    """A SOp satisfying ``ok``: often the latest (chains), else any (DAG reuse)."""
    cands = [v for v in self.sops if ok(v)]
    if not cands:
      return None
    if self.chance(0.55):
      return cands[-1]
    return self.choice(cands)

  def named(self, var: str, text: str, tags: List[str]) -> str:
    r = self.rng.random()
    if r < 0.8:
      self.names.append(var)
      tags.append("named")
      return f"{text}.named({var!r})"
    if r < 0.95 or not self.names:
      tags.append("unnamed")
      return text
    tags.append("same_name")
    return f"{text}.named({self.choice(self.names)!r})"

  def add(self, template: str, refs: Sequence[str], tags: List[str], *, kind: str = "", numerical: bool = False,
          selector: bool = False, name: bool = True) -> str:
    self.count += 1
    var = f"sel{self.count}" if selector else f"s{self.count}"
    if not selector:
      if numerical:
        template = f"rasp.numerical({template})"
        tags.append("numerical")
      if name:
        template = self.named(var, template, tags)
      self.kind[var], self.numerical[var] = kind, numerical
      self.sops.append(var)
    else:
      self.sels.append(var)
    self.nodes.append(Node(var, template, tuple(refs), selector, tuple(tags)))
    return var

  def fn_ok(self, var: str, tags) -> bool:
    return "typed" not in tags or (not self.numerical[var] and self.kind[var] not in ("num", "any"))

  # -- SOps
  def map(self, numerical: bool) -> str:
    x = self.pick_sop()
    k = self.kind[x]
    if self.chance(0.12) and not numerical:   # an operator overload
      fam = "bool" if k == "bool" else family(k)
      text, out = self.choice(_OVERLOAD_MAPS[fam])
      return self.add(f"({text})", [x], ["Map", "overload"], kind=out)
    own = [f for f in _MAPS[k] if self.fn_ok(x, f[2])]
    fns = own if own and self.chance(0.8) else [f for f in own + _MAPS_COMMON if self.fn_ok(x, f[2])]
    if numerical:
      fns = [f for f in fns if f[1] in NUMERIC or f[1] == "none" or (f[1] == "same" and k in NUMERIC)]
      if not fns:
        fns = [("lambda x: x == x", "bool", ())]
    src, out, tags = self.choice(fns)
    out = k if out == "same" else out
    simplify = "" if self.chance(0.8) else ", simplify=False"
    return self.add(f"rasp.Map({src}, @0{simplify})", [x], ["Map", *(f"Map:{t}" for t in tags)], kind=out,
                    numerical=numerical)

  def sequence_map(self, numerical: bool) -> str:
    a, b = self.pick_sop(), self.pick_sop()
    ka, kb = self.kind[a], self.kind[b]
    fa, fb = family(ka), family(kb)
    key = (fa, fb) if (fa, fb) in _SEQMAPS else "mixed"
    if self.chance(0.12) and not numerical and fa == fb and fa in _OVERLOAD_SEQMAPS:
      text, out = self.choice(_OVERLOAD_SEQMAPS[fa])
      return self.add(f"({text})", [a, b], ["SequenceMap", "overload"], kind=out)
    fns = [f for f in _SEQMAPS[key] + (_SEQMAPS_COMMON if self.chance(0.2) else [])
           if self.fn_ok(a, f[2]) and self.fn_ok(b, f[2])]
    if numerical:
      fns = [f for f in fns if f[1] in NUMERIC or (f[1] == "fst" and ka in NUMERIC)] or \
          [("lambda x, y: x == y", "bool", ())]
    src, out, tags = self.choice(fns)
    if out == "fst":
      out = ka
    elif out == "num" and key == ("num", "num"):
      out = ka if ka == kb else "num"
    return self.add(f"rasp.SequenceMap({src}, @0, @1)", [a, b],
                    ["SequenceMap", *(f"SequenceMap:{t}" for t in tags)], kind=out, numerical=numerical)

  def linear(self, numerical: bool) -> str:
    ok = (lambda v: self.kind[v] in NUMERIC) if self.chance(0.9) else (lambda v: True)
    a, b = self.pick_sop(ok) or "rasp.indices", self.pick_sop(ok) or "rasp.indices"
    ca, cb = self.choice(_COEFFS), self.choice(_COEFFS)
    return self.add(f"rasp.LinearSequenceMap(@0, @1, {ca!r}, {cb!r})", [a, b], ["LinearSequenceMap"],
                    kind="num", numerical=numerical)

  def full(self, vocab) -> str:
    if self.chance(0.35):
      v = self.choice([0, 1, 0.5, -1, True])
      return self.add(f"rasp.Full({v!r})", [], ["Full"], kind="bool" if v is True else
                      ("float" if isinstance(v, float) else "int"), numerical=True)
    v = self.choice(list(vocab) + [0, "a"])
    kind = "bool" if isinstance(v, bool) else ("str" if isinstance(v, str) else
                                               ("float" if isinstance(v, float) else "int"))
    return self.add(f"rasp.Full({v!r})", [], ["Full"], kind=kind)

  def constant(self, vocab, n: int) -> str:
    vals = [self.choice(list(vocab)) for _ in range(n)]
    return self.add(f"rasp.ConstantSOp({vals!r})", [], ["ConstantSOp"], kind=self.kind["rasp.tokens"])

  def annotate(self) -> str:
    x = self.pick_sop(lambda v: v not in PRIMITIVES or v == "rasp.tokens")
    if self.numerical[x]:
      return self.add("rasp.categorical(@0)", [x], ["categorical"], kind=self.kind[x])
    if self.kind[x] not in NUMERIC:
      return self.map(numerical=True)
    return self.add("@0", [x], [], kind=self.kind[x], numerical=True)

  # -- selectors
  def select(self, gather: bool = False) -> str:
    if gather:   # one key per query: what a categorical Aggregate needs
      q = self.pick_sop(lambda v: self.kind[v] == "int") or "rasp.indices"
      return self.add("rasp.Select(@0, @1, rasp.Comparison.EQ)", ["rasp.indices", q], ["Select", "Select:EQ"],
                      selector=True)
    k = self.pick_sop()
    fk = family(self.kind[k])
    q = self.pick_sop(lambda v: family(self.kind[v]) == fk) if self.chance(0.75) else self.pick_sop()
    fq = family(self.kind[q])
    if self.chance(0.75):
      c = self.choice(COMPARISONS)
      return self.add(f"rasp.Select(@0, @1, rasp.Comparison.{c})", [k, q], ["Select", f"Select:{c}"],
                      selector=True)
    pred = self.choice(_PREDICATES[fk if fk == fq else "any"])
    return self.add(f"rasp.Select(@0, @1, {pred})", [k, q], ["Select", "Select:custom"], selector=True)

  def selector(self, gather: bool = False) -> str:
    if self.sels and self.chance(0.3):
      return self.choice(self.sels)
    if gather or self.chance(0.7):
      return self.select(gather)
    a = self.selector()
    form = self.choice(["And", "Or", "Not", "&", "|", "~", "SelectorAnd"])
    if form in ("Not", "~"):
      text = "rasp.Not(@0)" if form == "Not" else "~@0"
      return self.add(text, [a], ["Not"], selector=True)
    b = self.select()
    text = {"And": "rasp.And(@0, @1)", "Or": "rasp.Or(@0, @1)", "&": "(@0 & @1)", "|": "(@0 | @1)",
            "SelectorAnd": "rasp.SelectorAnd(@0, @1)"}[form]
    return self.add(text, [a, b], ["Or" if form in ("Or", "|") else "And"], selector=True)

  # -- attention
  def aggregate(self, numerical: bool) -> str:
    if numerical:
      x = self.pick_sop(lambda v: self.numerical[v]) if self.chance(0.85) else None
      if x is None and self.chance(0.2):   # a numerical Aggregate of a categorical SOp
        x = self.pick_sop(lambda v: self.kind[v] in NUMERIC and v not in PRIMITIVES)
      if x is None:
        x = self.annotate()
      default = None if self.chance(0.15) else self.choice([0, 0, 1, 0.5, -1])
      sel = self.selector()
    else:
      x = self.pick_sop(lambda v: not self.numerical[v])
      default = None if self.chance(0.5) else self.choice(_DEFAULTS[self.kind[x]])
      sel = self.selector(gather=self.chance(0.5))
    tags = ["Aggregate", f"Aggregate:{'numerical' if numerical else 'categorical'}",
            "Aggregate:default=None" if default is None else "Aggregate:default"]
    d = "" if default is None and self.chance(0.5) else f", default={default!r}"
    kind = "float" if numerical else self.kind[x]
    return self.add(f"rasp.Aggregate(@0, @1{d})", [sel, x], tags, kind=kind, numerical=numerical)

  def width(self) -> str:
    sel = self.selector()
    return self.add("rasp.SelectorWidth(@0)", [sel], ["SelectorWidth"], kind="int", numerical=self.chance(0.25))


_OPS = [("map", 18), ("num_map", 7), ("seq_map", 9), ("num_seq_map", 3), ("linear", 5), ("full", 3),
        ("constant", 0.6), ("annotate", 4), ("cat_agg", 11), ("num_agg", 10), ("width", 8)]


def generate(seed: int, index: int, *, min_ops: int = 2, max_ops: int = 8) -> Program:
  """Program ``index`` of ``seed``: ``min_ops..max_ops`` SOp ops (plus their selectors), a vocabulary
  of ≤ 4 tokens, ``max_seq_len`` 3–8, causal with probability 0.3. Deterministic in its arguments."""
  rng = random.Random(f"jaxmem.rasp.fuzz:{seed}:{index}")
  kind, vocab, _ = rng.choices(VOCABS, weights=[w for *_, w in VOCABS])[0]
  N = rng.randint(3, 8)
  g = _Generator(rng, kind)
  ops, weights = zip(*_OPS, strict=True)
  for _ in range(rng.randint(min_ops, max_ops)):
    op = rng.choices(ops, weights=weights)[0]
    if op == "map":
      g.map(False)
    elif op == "num_map":
      g.map(True)
    elif op == "seq_map":
      g.sequence_map(False)
    elif op == "num_seq_map":
      g.sequence_map(True)
    elif op == "linear":
      g.linear(numerical=rng.random() < 0.5)
    elif op == "full":
      g.full(vocab)
    elif op == "constant":
      g.constant(vocab, N)
    elif op == "annotate":
      g.annotate()
    elif op == "cat_agg":
      g.aggregate(False)
    elif op == "num_agg":
      g.aggregate(True)
    else:
      g.width()
  return Program(seed, index, tuple(vocab), N, rng.random() < 0.3, tuple(g.nodes), g.sops[-1])


# ----------------------------------------------------------------------------- interpreters


class StrictEvaluator(rasp.DefaultRASPEvaluator):
  """``rasp.evaluate`` except that a categorical Aggregate averaging values that differ raises (the
  interpreter returns the mean of numbers there; the compiled model raises by design, README
  "Limits": a categorical SOp cannot hold a mixture)."""

  def eval_aggregate(self, sop: rasp.Aggregate, xs):
    if rasp.is_categorical(sop):
      sel, vals = self.evaluate(sop.selector, xs), self.evaluate(sop.sop, xs)
      for row in sel:
        chosen = [v for s, v in zip(row, vals, strict=True) if s]
        if any(not (v == chosen[0]) for v in chosen):
          raise ValueError(f"categorical Aggregate averages different values {chosen!r}.")
    return super().eval_aggregate(sop, xs)


_STRICT = {False: StrictEvaluator(False), True: StrictEvaluator(True)}


def _run_or_raised(f: Callable, *args):
  try:
    return f(*args)
  except Exception:  # noqa: BLE001 - any error of the program's own functions
    return RAISED


def tracr_rasp() -> Optional[types.ModuleType]:
  """tracr's ``tracr.rasp.rasp`` with ``And`` / ``Or`` / ``Not`` added (jaxmem's names for tracr's
  ``selector_and`` / ``selector_or`` / ``selector_not``), or None when tracr-pypi is not installed."""
  try:
    from tracr.rasp import rasp as tr  # noqa: PLC0415 - optional dependency
  except ImportError:
    return None
  mod = types.ModuleType("tracr_rasp_with_and_or_not")
  mod.__dict__.update({k: v for k, v in vars(tr).items() if not k.startswith("__")})
  mod.And = lambda *s: _fold(tr.selector_and, s)
  mod.Or = lambda *s: _fold(tr.selector_or, s)
  mod.Not = tr.selector_not
  return mod


@contextlib.contextmanager
def _quiet_absl():
  log = logging.getLogger("absl")
  level = log.level
  log.setLevel(logging.ERROR)
  try:
    yield
  finally:
    log.setLevel(level)


def _fold(f, xs):
  out = xs[0]
  for x in xs[1:]:
    out = f(out, x)
  return out


def _tracr_evaluator(causal: bool):
  """tracr's interpreter with jaxmem's two documented additions: causal masking (every selector
  masked to ``k <= q``, ``length`` = ``i + 1``) and a categorical Aggregate of equal non-numbers
  returning that value (tracr raises). Numbers follow tracr's rule, as jaxmem's interpreter does:
  one selected value as it is, several as ``sum / len``."""
  from tracr.rasp import rasp as tr  # noqa: PLC0415 - optional dependency

  class Evaluator(tr.DefaultRASPEvaluator):
    def evaluate(self, expr, xs):
      out = super().evaluate(expr, xs)
      if causal and isinstance(expr, tr.Selector):
        out = [[bool(s) and k <= q for k, s in enumerate(row)] for q, row in enumerate(out)]
      return out

    def eval_length(self, sop, xs):
      return [i + 1 for i in range(len(xs))] if causal else [len(xs)] * len(xs)

    def eval_aggregate(self, sop, xs):
      if not tr.is_categorical(sop):
        return super().eval_aggregate(sop, xs)
      sel, vals = self.evaluate(sop.selector, xs), self.evaluate(sop.sop, xs)
      out = []
      for row in sel:
        chosen = [v for s, v in zip(row, vals, strict=True) if s]
        numbers = all(isinstance(v, (int, bool, float)) for v in chosen)
        if len(chosen) > 1 and not numbers and all(v == chosen[0] and type(v) is type(chosen[0])
                                                   for v in chosen):
          out.append(chosen[0])   # jaxmem's addition: equal non-numbers (tracr raises)
        elif not chosen:
          out.append(sop.default)
        elif len(chosen) == 1:
          out.append(chosen[0])
        elif numbers:
          out.append(sum(chosen) / len(chosen))   # tracr's rule
        else:
          raise ValueError(f"Only types int, bool, and float are supported for aggregation: {chosen}")
      return out

  return Evaluator()


# ----------------------------------------------------------------------------- comparison


def _type_class(v) -> str:
  if isinstance(v, (bool, numbers.Number)):
    return "number"
  return type(v).__name__


def _same_value(w, g, numerical: bool) -> bool:
  if w is None or g is None:
    return w is None and g is None
  if numerical and isinstance(w, numbers.Real) and isinstance(g, numbers.Real):
    w, g = float(w), float(g)
    if math.isnan(w) or math.isnan(g):
      return math.isnan(w) and math.isnan(g)
    return abs(w - g) <= ATOL + RTOL * abs(w)
  if isinstance(w, tuple) and isinstance(g, tuple):
    return len(w) == len(g) and all(_same_value(a, b, False) for a, b in zip(w, g, strict=True))
  return _type_class(w) == _type_class(g) and w == g


def same_outputs(want, got, numerical: bool) -> bool:
  """Strict agreement of two outcomes of one input (lists, or :data:`RAISED`): ``None`` only with
  ``None``; numerical values within ``1e-6 + 1e-6·|want|``; categorical values equal and of one type
  class (numbers, str, tuples elementwise)."""
  if want is RAISED or got is RAISED:
    return want is got
  return len(want) == len(got) and all(_same_value(w, g, numerical) for w, g in zip(want, got, strict=True))


def _same_exactly(w, g) -> bool:
  """Two interpreters: identical values, types included."""
  if w is RAISED or g is RAISED:
    return w is g
  if isinstance(w, (list, tuple)) and isinstance(g, (list, tuple)):
    return type(w) is type(g) and len(w) == len(g) and all(
        _same_exactly(a, b) for a, b in zip(w, g, strict=True))
  if isinstance(w, float) and isinstance(g, float) and math.isnan(w) and math.isnan(g):
    return True
  return type(w) is type(g) and w == g


# ----------------------------------------------------------------------------- checking


class CompileTimeout(BaseException):
  """Raised by the alarm inside a compile that ran past its limit (a BaseException, so that the
  compiler's ``except Exception`` around user functions does not swallow it)."""


@contextlib.contextmanager
def _time_limit(seconds: Optional[float]):
  """An alarm (SIGALRM) after ``seconds`` in the main thread; no limit elsewhere (a worker process
  of :func:`run` is its own main thread, and :func:`run` kills workers stuck past a hard limit)."""
  main = threading.current_thread() is threading.main_thread()
  if not seconds or not main or not hasattr(signal, "setitimer"):
    yield
    return

  def alarm(signum, frame):
    raise CompileTimeout(f"compile ran past {seconds:g} s")
  old = signal.signal(signal.SIGALRM, alarm)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


@dataclasses.dataclass
class Failure:
  """``kind``: ``wrong`` | ``crash`` | ``hang``; ``path``: ``build`` | ``compile`` | ``model`` |
  ``machine`` | ``tracr``; for a wrong output, the (shortest) input, the reference's and the path's
  outcome (lists, or :data:`RAISED`)."""

  kind: str
  path: str
  message: str
  inputs: Optional[list] = None
  want: Any = None
  got: Any = None

  @property
  def signature(self) -> Tuple[str, str, str]:
    """A failure's class: kind, path and the exception type, or for a wrong output the kinds of
    the first differing values (``None→float``, ``raised→list``, ``float≠float``, …)."""
    if self.kind != "wrong":
      return (self.kind, self.path, self.message.split(":", 1)[0])
    if self.want is RAISED or self.got is RAISED:
      return (self.kind, self.path, f"{_shape(self.want)}→{_shape(self.got)}")
    for w, g in zip(self.want, self.got, strict=False):
      if not _same_value(w, g, False):
        return (self.kind, self.path, f"{_tname(w)}→{_tname(g)}")
    return (self.kind, self.path, "length")


def _shape(x) -> str:
  return "raised" if x is RAISED else "value"


def _tname(v) -> str:
  return "None" if v is None else type(v).__name__


@dataclasses.dataclass
class Result:
  """One program's check: ``status`` is ``refused`` (the compiler's ValueError, in ``message``),
  ``crash`` (any crash or hang), ``wrong`` (some output disagrees) or ``ok``."""

  seed: int
  index: int
  status: str
  compile_s: Optional[float] = None   # wall clock
  compile_cpu_s: Optional[float] = None   # this thread's CPU time (a refusal is plain Python)
  seconds: float = 0.0
  message: str = ""
  inputs: int = 0
  failures: List[Failure] = dataclasses.field(default_factory=list)
  paths: Tuple[str, ...] = ()   # the paths compared with the reference
  constructs: Dict[str, int] = dataclasses.field(default_factory=dict)
  notes: List[str] = dataclasses.field(default_factory=list)
  size: int = 0

  @property
  def compiled(self) -> bool:
    return self.status in ("ok", "wrong") or (self.status == "crash" and self.compile_s is not None
                                              and all(f.path != "compile" for f in self.failures))


def inputs_for(program: Program, *, max_exhaustive: int = 128, n_random: int = 24) -> List[list]:
  """Every input of lengths ``1..L`` (``L`` the longest keeping the count ≤ ``max_exhaustive``), then
  ``n_random`` random ones of lengths up to ``max_seq_len`` (the first two of the longest)."""
  vocab, N = list(program.vocab), program.max_seq_len
  out: List[list] = []
  for n in range(1, N + 1):
    if len(out) + len(vocab) ** n > max_exhaustive:
      break
    out += [list(x) for x in itertools.product(vocab, repeat=n)]
  rng = random.Random(f"jaxmem.rasp.fuzz.inputs:{program.seed}:{program.index}")
  for i in range(n_random):
    n = N if i < 2 else rng.randint(1, N)
    out.append([rng.choice(vocab) for _ in range(n)])
  return out


class _Crash:
  def __init__(self, message: str):
    self.message = message


def _apply(path, inputs: List[list]) -> list:
  """Outcomes of one path (a :class:`~jaxmem.rasp.model.CompiledModel` or its machine): one forward
  pass over the batch (``residual``), then each input decoded as ``apply_batch`` decodes it
  (``model._decode``: its run-time checks, then the output). ``ValueError`` is the documented
  "raises where the interpreter raises"; any other exception is a :class:`_Crash`. Where the batch
  itself raises, each input goes through ``apply_batch`` alone."""
  decode = path._decode if isinstance(path, CompiledModel) else path.model._decode
  try:
    res = path.residual(inputs)
  except Exception:  # noqa: BLE001 - sorted out per input below
    res = None
  out = []
  for b, xs in enumerate(inputs):
    try:
      out.append(decode(res[b, 1: len(xs) + 1]) if res is not None else path.apply_batch([xs])[0])
    except ValueError:
      out.append(RAISED)
    except Exception as e:  # noqa: BLE001 - a crash of this path, reported
      out.append(_Crash(f"{type(e).__name__}: {e}"))
  return out


def _compare(path: str, inputs, want, got, same) -> List[Failure]:
  """The first crash, and the shortest wrong input, of one path."""
  out = []
  crash = next((g for g in got if isinstance(g, _Crash)), None)
  if crash is not None:
    out.append(Failure("crash", path, crash.message))
  bad = [(len(x), i) for i, (x, w, g) in enumerate(zip(inputs, want, got, strict=True))
         if not isinstance(g, _Crash) and not same(w, g)]
  if bad:
    i = min(bad)[1]
    n = len(bad)
    out.append(Failure("wrong", path, f"{n} of {len(inputs)} inputs differ", inputs[i], want[i], got[i]))
  return out


def _short(e: BaseException) -> str:
  return f"{type(e).__name__}: {str(e)[:400]}"


def check(program: Program, *, timeout_s: float = 20.0, max_exhaustive: int = 128, n_random: int = 24,
          machine: bool = True, tracr: bool = True, compile_fn: Optional[Callable] = None) -> Result:
  """Compiles ``program`` and compares the model, its machine and tracr's interpreter with the
  reference on :func:`inputs_for` (see the module docstring); ``compile_fn(program, vocab,
  max_seq_len, causal)`` replaces ``rasp.compile`` (tests use it to break a model)."""
  t_start = time.perf_counter()
  res = Result(program.seed, program.index, "ok", constructs=dict(program.constructs()), size=program.size)

  def done(status: str) -> Result:
    res.status = status
    res.seconds = time.perf_counter() - t_start
    return res

  try:
    prog = program.build()
  except ValueError as e:
    res.message = _short(e)
    return done("refused")
  except Exception as e:  # noqa: BLE001 - the DSL crashing on a construction
    res.failures.append(Failure("crash", "build", _short(e)))
    return done("crash")
  compile_fn = compile_fn or (lambda p, v, n, c: compile_program(p, list(v), n, causal=c))
  t0, c0 = time.perf_counter(), time.thread_time()
  try:
    with _time_limit(timeout_s):
      model = compile_fn(prog, program.vocab, program.max_seq_len, program.causal)
  except ValueError as e:
    res.compile_s, res.compile_cpu_s, res.message = time.perf_counter() - t0, time.thread_time() - c0, _short(e)
    return done("refused")
  except CompileTimeout as e:
    res.compile_s = time.perf_counter() - t0
    res.failures.append(Failure("hang", "compile", f"CompileTimeout: {e}"))
    return done("crash")
  except Exception as e:  # noqa: BLE001 - a compiler crash, reported
    res.compile_s = time.perf_counter() - t0
    res.failures.append(Failure("crash", "compile", _short(e)))
    return done("crash")
  res.compile_s = time.perf_counter() - t0

  inputs = inputs_for(program, max_exhaustive=max_exhaustive, n_random=n_random)
  res.inputs = len(inputs)
  ref = [_run_or_raised(_STRICT[program.causal].evaluate, prog, xs) for xs in inputs]
  numerical = model.meta["output"]["encoding"] == "numerical"

  def same(w, g):
    return same_outputs(w, g, numerical)
  paths = ["model"]
  res.failures += _compare("model", inputs, ref, _apply(model, inputs), same)
  if machine:
    paths.append("machine")
    try:
      mm = to_machine(model)
    except Exception as e:  # noqa: BLE001 - the machine path failing to build is its crash
      res.failures.append(Failure("crash", "machine", f"to_machine: {_short(e)}"))
    else:
      res.failures += _compare("machine", inputs, ref, _apply(mm, inputs), same)
  tr = tracr_rasp() if tracr else None
  if tr is not None:
    paths.append("tracr")
    try:
      with _quiet_absl():   # tracr warns on SequenceMap(f, x, x)
        tprog = program.build(tr)
    except Exception as e:  # noqa: BLE001 - tracr's DSL is stricter in places: not a failure of jaxmem
      paths.pop()
      res.notes.append(f"tracr cannot build it: {_short(e)}")
    else:
      ev = _tracr_evaluator(program.causal)
      plain = [_run_or_raised(rasp.evaluate, prog, xs, program.causal) for xs in inputs]
      theirs = [_run_or_raised(ev.evaluate, tprog, xs) for xs in inputs]
      res.failures += _compare("tracr", inputs, plain, theirs, _same_exactly)
  res.paths = tuple(paths)
  if any(f.kind != "wrong" for f in res.failures):
    return done("crash")
  return done("wrong" if res.failures else "ok")


# ----------------------------------------------------------------------------- shrinking


def _candidates(p: Program) -> Iterator[Program]:
  """Smaller variants of ``p``, most reducing first."""
  nodes = p.reachable()
  p = dataclasses.replace(p, nodes=nodes)
  sops = [n.var for n in nodes if not n.selector]
  for v in sops[:-1]:                                       # an earlier SOp as the output
    if v != p.output:
      yield dataclasses.replace(p, output=v)
  by_var = {n.var: n for n in nodes}
  for n in nodes:                                           # bypass a line: its readers read its input
    same_cat = [r for r in n.refs if r in PRIMITIVES or (r in by_var and by_var[r].selector == n.selector)]
    for r in same_cat:
      new = [dataclasses.replace(m, refs=tuple(r if x == n.var else x for x in m.refs)) for m in nodes]
      yield dataclasses.replace(p, nodes=tuple(new), output=r if p.output == n.var else p.output)
  for i, n in enumerate(nodes):                             # a primitive for an operand
    for j, r in enumerate(n.refs):
      if r in by_var and by_var[r].selector:
        continue
      for prim in PRIMITIVES:
        if prim != r:
          refs = n.refs[:j] + (prim,) + n.refs[j + 1:]
          yield dataclasses.replace(p, nodes=nodes[:i] + (dataclasses.replace(n, refs=refs),) + nodes[i + 1:])
  for i, n in enumerate(nodes):                             # drop names, numerical(...)
    t = re.sub(r"\.named\('[^']*'\)$", "", n.template)
    if t != n.template:
      yield dataclasses.replace(p, nodes=nodes[:i] + (dataclasses.replace(n, template=t),) + nodes[i + 1:])
  if p.causal:
    yield dataclasses.replace(p, causal=False)
  for N in range(1, p.max_seq_len):
    yield dataclasses.replace(p, max_seq_len=N)
  if len(p.vocab) > 1:
    for k in range(len(p.vocab)):
      yield dataclasses.replace(p, vocab=p.vocab[:k] + p.vocab[k + 1:])


def _cost(p: Program) -> tuple:
  return (p.size, len(p.body()), p.max_seq_len, len(p.vocab), p.causal)


def shrink(program: Program, failure: Failure, *, max_checks: int = 300, **check_kw) -> Tuple[Program, Failure]:
  """A smaller program failing with ``failure.signature`` (greedy: take the first smaller variant
  that still fails so, repeat), and its failure (the shortest failing input)."""
  sig = failure.signature
  check_kw.setdefault("machine", sig[1] == "machine")
  check_kw.setdefault("tracr", sig[1] == "tracr")
  best, best_f, checks = program, failure, 0
  improved = True
  while improved and checks < max_checks:
    improved = False
    for cand in _candidates(best):
      if _cost(cand) >= _cost(best):
        continue
      checks += 1
      r = check(cand, **check_kw)
      f = next((f for f in r.failures if f.signature == sig), None)
      if f is not None:
        best, best_f, improved = cand.renumbered(), f, True
        break
      if checks >= max_checks:
        break
  return best, best_f


@contextlib.contextmanager
def _xla_flags_for_children(fast_xla: bool):
  """While open, processes started get :data:`FAST_XLA_FLAGS` (a spawned child reads its
  environment at start; this process's XLA is already set up and unaffected)."""
  flags = os.environ.get("XLA_FLAGS")
  if fast_xla:
    os.environ["XLA_FLAGS"] = " ".join([flags or "", *FAST_XLA_FLAGS]).strip()
  try:
    yield
  finally:
    if flags is None:
      os.environ.pop("XLA_FLAGS", None)
    else:
      os.environ["XLA_FLAGS"] = flags


def _shrink_task(args):
  program, failure, kw = args
  return shrink(program, failure, **kw)


def shrink_all(items: Sequence[Tuple[Program, Failure]], *, workers: int = 1, fast_xla: bool = False,
               **shrink_kw) -> List[Tuple[Program, Failure]]:
  """:func:`shrink` of each ``(program, failure)``, in ``workers`` processes (1: in this one)."""
  tasks = [(p, f, shrink_kw) for p, f in items]
  if workers <= 1 or len(tasks) <= 1:
    return [_shrink_task(t) for t in tasks]
  ctx = multiprocessing.get_context("spawn")
  with _xla_flags_for_children(fast_xla):
    pool = ctx.Pool(min(workers, len(tasks)))
  with pool:
    return pool.map(_shrink_task, tasks, chunksize=1)


# ----------------------------------------------------------------------------- running many


def normalise(message: str) -> str:
  m = re.sub(r"'[^']*'", "'…'", message)
  m = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", m)
  return m[:160]


@dataclasses.dataclass
class Summary:
  """The results of :func:`run`, with the counts of its table."""

  seed: int
  results: List[Result]
  seconds: float
  workers: int

  @property
  def programs(self) -> int:
    return len(self.results)

  def count(self, status: str) -> int:
    return sum(r.status == status for r in self.results)

  @property
  def compiled(self) -> int:
    return sum(r.compiled for r in self.results)

  @property
  def wrong(self) -> int:
    return sum(any(f.kind == "wrong" for f in r.failures) for r in self.results)

  @property
  def crashes(self) -> int:
    return sum(any(f.kind != "wrong" for f in r.failures) for r in self.results)

  @property
  def slowest_refusal(self) -> Optional[Result]:
    """By CPU time: the wall clock of a refusal also counts what else the machine runs."""
    return max((r for r in self.results if r.status == "refused" and r.compile_cpu_s is not None),
               key=lambda r: r.compile_cpu_s, default=None)

  @property
  def slowest_compile(self) -> Optional[Result]:
    return max((r for r in self.results if r.compiled), key=lambda r: r.compile_s, default=None)

  def classes(self) -> Dict[tuple, List[Tuple[Result, Failure]]]:
    """Failures grouped by :attr:`Failure.signature` (with the normalised message of crashes)."""
    out: Dict[tuple, list] = collections.defaultdict(list)
    for r in self.results:
      for f in r.failures:
        key = f.signature if f.kind == "wrong" else f.signature + (normalise(f.message),)
        out[key].append((r, f))
    return dict(out)

  def coverage(self) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for r in self.results:
      c.update(r.constructs)
    return c

  def row(self) -> list:
    sr, sc = self.slowest_refusal, self.slowest_compile
    return [self.programs, self.compiled, self.count("refused"), self.wrong, self.crashes,
            "—" if sr is None else f"{sr.compile_cpu_s:.2f} ({sr.compile_s:.2f})",
            "—" if sc is None else f"{sc.compile_s:.2f}",
            f"{self.seconds * self.workers / max(self.programs, 1):.3f}"]

  HEADERS = ["programs", "compiled", "refused", "wrong", "crashes", "slowest refusal, CPU (wall) s",
             "slowest compile (s)", "s per program (one core)"]

  def table(self) -> str:
    from jaxmem.results import markdown_table  # noqa: PLC0415
    return markdown_table(self.HEADERS, [self.row()])

  def report(self, n_failures: int = 5) -> str:
    """The table, the failure classes and the first failures' sources (Markdown)."""
    parts = [self.table(), ""]
    for key, items in self.classes().items():
      r, f = items[0]
      parts.append(f"* {' / '.join(key)}: {len(items)} (first: seed {r.seed}, index {r.index})")
    shown = [(r, f) for r in self.results for f in r.failures][:n_failures]
    for r, f in shown:
      parts += ["", f"### {f.kind} ({f.path}), seed {r.seed}, index {r.index}: {f.message}", "",
                "```python", generate(r.seed, r.index).source(f.inputs).rstrip(), "```"]
      if f.kind == "wrong":
        parts.append(f"interpreter: `{f.want!r}`, {f.path}: `{f.got!r}`")
    return "\n".join(parts)


def _check_index(seed: int, index: int, kw: dict) -> Result:
  kw = dict(kw)
  every = kw.pop("machine_every", 1)
  kw["machine"] = kw.get("machine", True) and every > 0 and index % every == 0
  return check(generate(seed, index), **kw)


def _worker(conn, seed: int, kw: dict) -> None:
  while True:
    index = conn.recv()
    if index is None:
      return
    conn.send(_check_index(seed, index, kw))


def run(seed: int, n: int, *, start: int = 0, workers: int = 1,
        progress: Optional[Callable[[int, Result], None]] = None, hard_limit_s: Optional[float] = None,
        fast_xla: bool = False, **check_kw) -> Summary:
  """Checks programs ``start .. start+n−1`` of ``seed`` (``check_kw`` go to :func:`check`; with
  ``machine_every=k`` the machine path runs on every ``k``-th program only, as it costs as much as
  the model's: one more XLA compile) in ``workers`` processes (1: in this one);
  ``progress(done, result)`` after each. A worker process
  still on one program after ``hard_limit_s`` (default: 3 × the compile limit + 120 s) is killed
  and the program reported as a hang. ``fast_xla``: the worker processes compile with
  :data:`FAST_XLA_FLAGS` (2.5× faster here; the test suite's setting, ``tests/conftest.py``)."""
  t0 = time.perf_counter()
  indices = list(range(start, start + n))
  results: Dict[int, Result] = {}

  def record(r: Result):
    results[r.index] = r
    if progress:
      progress(len(results), r)
  if workers <= 1:
    for i in indices:
      record(_check_index(seed, i, check_kw))
  else:
    hard = hard_limit_s or 3 * check_kw.get("timeout_s", 20.0) + 120.0
    ctx = multiprocessing.get_context("spawn")
    todo = collections.deque(indices)
    live: Dict[Any, list] = {}   # conn -> [process, index or None, started]

    failed_starts = 0

    def spawn():
      a, b = ctx.Pipe()
      proc = ctx.Process(target=_worker, args=(b, seed, check_kw), daemon=True)
      with _xla_flags_for_children(fast_xla):
        proc.start()
      live[a] = [proc, None, 0.0, 0]   # process, its program, when it got it, programs done
      feed(a)

    def feed(conn):
      if todo:
        i = todo.popleft()
        live[conn][1:3] = [i, time.monotonic()]
        conn.send(i)
      else:
        conn.send(None)
        live[conn][0].join(timeout=10)
        del live[conn]
    for _ in range(min(workers, len(indices))):
      spawn()
    while live:
      for conn in multiprocessing.connection.wait(list(live), timeout=1.0):
        proc, i, _, done = live[conn]
        try:
          r = conn.recv()
        except (EOFError, OSError):   # the worker died (killed, out of memory, a segfault)
          proc.join(timeout=10)
          del live[conn]
          if done == 0:   # died before its first result: a worker that cannot start, not the program
            failed_starts += 1
            if failed_starts >= 3:
              for other in live.values():
                other[0].kill()
              raise RuntimeError(
                  f"fuzz worker processes exit at start (exit code {proc.exitcode}); a script calling "
                  "run(workers > 1) must guard its entry point with `if __name__ == '__main__':`.") from None
            todo.appendleft(i)
          else:
            died = Failure("crash", "check", f"worker died (exit {proc.exitcode})")
            record(Result(seed, i, "crash", failures=[died]))
          spawn()
          continue
        live[conn][3] += 1
        failed_starts = 0
        record(r)
        feed(conn)
      now = time.monotonic()
      for conn, (proc, i, started, _) in list(live.items()):
        if i is not None and now - started > hard:
          proc.kill()
          proc.join()
          del live[conn]
          record(Result(seed, i, "crash", failures=[Failure("hang", "check", f"killed after {hard:.0f} s")]))
          spawn()
  return Summary(seed, [results[i] for i in indices], time.perf_counter() - t0, max(1, workers))
