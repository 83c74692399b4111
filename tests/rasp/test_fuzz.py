"""The differential fuzzer (`jaxmem.rasp.fuzz`): a seeded slice of random programs compiles to models that
agree with the interpreter (and with the machine and tracr's interpreter), refusals are quick; the generator
reaches every construct of the DSL; the checker fails on a model broken on purpose, on a crash and on a hang,
and shrinks a failure to a smaller program failing the same way."""

from __future__ import annotations

import collections
import dataclasses
import time

import pytest

from jaxmem import rasp
from jaxmem.rasp import fuzz

SEED, SLICE = 0, 60


def _walk(expr, seen=None):
  """Every node of a built program (SOps and selectors), each once."""
  seen = {} if seen is None else seen
  if expr.unique_id not in seen:
    seen[expr.unique_id] = expr
    for c in expr.children:
      _walk(c, seen)
  return seen.values()


def test_a_seeded_slice_compiles_to_models_equal_to_the_interpreter():
  summary = fuzz.run(SEED, SLICE, machine_every=3)
  assert summary.programs == SLICE and summary.compiled >= SLICE // 2, summary.table()
  assert summary.wrong == 0 and summary.crashes == 0, summary.report()
  # CPU time: the suite runs on two workers beside other jobs, and the wall clock counts them
  slow = [(r.index, r.compile_cpu_s, r.compile_s, r.message) for r in summary.results
          if r.status == "refused" and r.compile_cpu_s is not None and r.compile_cpu_s >= 1.0]
  assert not slow, slow
  checked = collections.Counter(p for r in summary.results if r.compiled for p in r.paths)
  assert checked["model"] == summary.compiled and checked["machine"] >= summary.compiled // 4
  if fuzz.tracr_rasp() is not None:
    assert checked["tracr"] >= summary.compiled * 3 // 4, checked


REQUIRED = {
    # value kinds of the tokens, the primitives, causal and not
    "vocab:int", "vocab:float", "vocab:str", "vocab:bool", "vocab:any", "primitive:tokens", "primitive:indices",
    "primitive:length", "causal", "non-causal",
    # element-wise ops, their function kinds and the overloads
    "Map", "Map:raises", "Map:none", "Map:const", "Map:float", "SequenceMap", "SequenceMap:raises",
    "SequenceMap:none", "LinearSequenceMap", "Full", "ConstantSOp", "overload",
    # selectors
    "Select", *(f"Select:{c}" for c in fuzz.COMPARISONS), "Select:custom", "And", "Or", "Not",
    # attention
    "Aggregate:categorical", "Aggregate:numerical", "Aggregate:default=None", "Aggregate:default",
    "SelectorWidth",
    # encodings, names, sharing
    "numerical", "categorical", "named", "unnamed", "same_name", "shared",
}
NODE_TYPES = {"TokensType", "IndicesType", "LengthType", "Map", "SequenceMap", "LinearSequenceMap", "Full",
              "ConstantSOp", "Select", "SelectorAnd", "SelectorOr", "SelectorNot", "Aggregate", "SelectorWidth"}


def test_the_generator_reaches_every_construct_and_is_reproducible():
  programs = [fuzz.generate(SEED, i) for i in range(200)]
  tags = collections.Counter()
  nodes = collections.Counter()
  for p in programs:
    tags.update(p.constructs())
    for e in _walk(p.build()):
      nodes[type(e).__name__] += 1
      if isinstance(e, rasp.SOp):
        nodes["numerical" if rasp.is_numerical(e) else "categorical"] += 1
      if isinstance(e, rasp.Select):
        c = e.predicate
        nodes[f"Comparison.{c.name}" if isinstance(c, rasp.Comparison) else "custom predicate"] += 1
      if isinstance(e, rasp.Aggregate):
        nodes[f"Aggregate default={'None' if e.default is None else 'value'}"] += 1
  assert not REQUIRED - set(tags), sorted(REQUIRED - set(tags))
  assert not NODE_TYPES - set(nodes), sorted(NODE_TYPES - set(nodes))
  more = {f"Comparison.{c}" for c in fuzz.COMPARISONS} | {"custom predicate", "numerical", "categorical",
                                                         "Aggregate default=None", "Aggregate default=value"}
  assert not more - set(nodes), sorted(more - set(nodes))
  sizes = [p.size for p in programs]
  # what the output reaches of the 2-8 ops drawn (one op or more), plus their selectors
  assert 1 <= min(sizes) and max(sizes) <= 8 * 4, (min(sizes), max(sizes))
  assert all(len(p.vocab) <= 4 and 3 <= p.max_seq_len <= 8 for p in programs)
  p = programs[7]
  assert fuzz.generate(SEED, 7) == p and fuzz.describe(p) == p.source()
  ns = {}
  exec(_shift().source(["a", "b"]), ns)   # runnable as printed: builds, compiles, runs  # noqa: S102
  assert isinstance(ns["model"], rasp.CompiledModel) and ns["model"].apply(ns["xs"]) == [None, "a"]


def _shift() -> fuzz.Program:
  """``Aggregate(Select(indices, indices, k == q - 1), tokens)``: None at position 0."""
  nodes = (fuzz.Node("sel1", "rasp.Select(@0, @1, lambda k, q: k == q - 1)", ("rasp.indices", "rasp.indices"),
                     True, ("Select",)),
           fuzz.Node("s2", "rasp.Aggregate(@0, @1)", ("sel1", "rasp.tokens"), False, ("Aggregate",)))
  return fuzz.Program(0, 0, ("a", "b"), 4, False, nodes, "s2")


def _broken_compile(program, vocab, max_seq_len, causal):
  """``rasp.compile``, then the model's decoding reads None as 0.0 (what the review found numerical
  Aggregates doing)."""
  model = rasp.compile(program, list(vocab), max_seq_len, causal=causal)
  decode = model._decode
  model._decode = lambda rows: [0.0 if v is None else v for v in decode(rows)]
  return model


def test_the_checker_fails_a_model_that_reads_none_as_zero():
  p = _shift()
  ok = fuzz.check(p, tracr=False)
  assert ok.status == "ok" and not ok.failures
  bad = fuzz.check(p, tracr=False, compile_fn=_broken_compile)
  assert bad.status == "wrong"
  sigs = {f.signature for f in bad.failures}
  assert sigs == {("wrong", "model", "None→float"), ("wrong", "machine", "None→float")}, sigs
  f = bad.failures[0]
  assert f.inputs == ["a"] and f.want == [None] and f.got == [0.0]
  small, g = fuzz.shrink(p, f, compile_fn=_broken_compile, tracr=False)
  assert g.signature == f.signature and small.size <= p.size and small.max_seq_len == 1
  assert "rasp.Aggregate" in small.source()


def test_the_checker_reports_crashes_and_hangs():
  p = _shift()

  def crash(*_):
    raise IndexError("list index out of range")

  def hang(*_):
    time.sleep(5)
  r = fuzz.check(p, compile_fn=crash)
  assert r.status == "crash" and r.failures[0].signature == ("crash", "compile", "IndexError")
  t0 = time.perf_counter()
  r = fuzz.check(p, compile_fn=hang, timeout_s=0.3)
  assert r.status == "crash" and r.failures[0].kind == "hang" and time.perf_counter() - t0 < 3
  r = fuzz.check(p, compile_fn=lambda *a: (_ for _ in ()).throw(ValueError("too big")))
  assert r.status == "refused" and "too big" in r.message and not r.failures


@pytest.mark.parametrize("want,got,numerical,same", [
    ([None], [0.0], True, False), ([None], [None], True, True), ([0.0], [None], True, False),
    ([None], [0], False, False), ([1], [True], False, True), ([1], [1.0], False, True),
    (["1"], [1], False, False),
    ([0.1 + 0.2], [0.3], True, True), ([0.1 + 0.2], [0.3], False, False), ([1.0], [1.0 + 2e-6], True, False),
    ([1e6], [1e6 + 0.5], True, True), ([("a", 1)], [("a", 1.0)], False, True),
    ([("a", 1)], [("a", "1")], False, False),
    (fuzz.RAISED, fuzz.RAISED, False, True), (fuzz.RAISED, [None], False, False), ([1, 2], [1], False, False),
])
def test_outputs_agree_strictly(want, got, numerical, same):
  assert fuzz.same_outputs(want, got, numerical) is same


def test_the_reference_raises_where_a_categorical_aggregate_mixes_values():
  mean = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.TRUE), rasp.tokens)
  assert rasp.evaluate(mean, [1, 2]) == [1.5, 1.5]
  with pytest.raises(ValueError, match="different values"):
    fuzz.StrictEvaluator().evaluate(mean, [1, 2])
  assert fuzz.StrictEvaluator().evaluate(mean, [2, 2]) == [2, 2]


def test_tracr_builds_and_interprets_the_same_program():
  tr = fuzz.tracr_rasp()
  if tr is None:
    pytest.skip("tracr-pypi is not installed")
  p = dataclasses.replace(_shift(), causal=True)
  r = fuzz.check(p, machine=False)
  assert r.status == "ok" and "tracr" in r.paths, r
  assert p.build(tr)(["a", "b", "b"]) == [None, "a", "b"]
