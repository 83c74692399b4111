"""The RASP program library against independent plain-Python references, and the DSL itself.

For every entry of :data:`jaxmem.rasp.programs.PROGRAMS`, ``rasp.evaluate(spec.build(N), xs)``
must equal ``spec.reference(xs)`` on every accepted input of length 1..4 over the vocab
(``itertools.product``; a program whose domain has no such length — transpose, length 6 —
is enumerated at its shortest length) and on 300 random inputs of lengths up to 12.

Comparison (:func:`assert_same`): outputs have the same length; ``None`` equals only
``None`` (a number never matches ``None``, whatever the tolerance); numerical outputs agree
to 1e-9 absolute; categorical outputs are equal *and of the same type* (so a categorical
Aggregate that averaged two equal ints into a float, or a bool where the reference has an
int, fails).

Each evaluation also checks what the compiler relies on (:func:`check_compilable`): every
categorical Aggregate selects, for every query, only keys holding one value; every
numerical SOp takes numbers; and statically, every non-primitive node is named, names are
unique, no Constant* node is used, aggregates' encodings match their inputs'.
"""

import dataclasses
import itertools
import math
import random
import zlib

import pytest

from jaxmem.rasp import lib, programs, rasp, references
from jaxmem.rasp.rasp import Evaluator

N_EXHAUSTIVE = 5  # tracr's max_seq_len for its published sizes
N_RANDOM = 12
RANDOM_INPUTS = 300
NAMES = sorted(programs.PROGRAMS)

EXPECTED_PROGRAMS = {
    "length", "reverse", "hist", "sort_unique", "sort", "sort_freq", "frac_prevs", "pair_balance",
    "shuffle_dyck1", "shuffle_dyck2", "kparity", "kparity_count", "match2", "running_sum",
    "transpose",
}


# ----------------------------------------------------------------------------- helpers


def assert_same(out, ref, numerical, xs=None):
  assert len(out) == len(ref), (xs, out, ref)
  for pos, (a, b) in enumerate(zip(out, ref, strict=True)):
    where = f"input {xs!r}, position {pos}: got {a!r}, reference {b!r} (all: {out!r} vs {ref!r})"
    if a is None or b is None:
      assert a is None and b is None, where
    elif numerical:
      assert isinstance(a, (int, float)) and isinstance(b, (int, float)), where
      assert math.isclose(a, b, rel_tol=0, abs_tol=1e-9), where
    else:
      assert a == b and type(a) is type(b), where


def walk(expr):
  """Every node reachable from ``expr`` (by identity), children first."""
  seen, order = set(), []

  def visit(e):
    if e.unique_id in seen:
      return
    seen.add(e.unique_id)
    for c in e.children:
      visit(c)
    order.append(e)

  visit(expr)
  return order


PRIMITIVES = (rasp.TokensType, rasp.IndicesType)


def check_static(program):
  nodes = walk(program)
  names = {}
  for e in nodes:
    assert not isinstance(e, (rasp.ConstantSOp, rasp.ConstantSelector)), e
    if isinstance(e, PRIMITIVES):
      continue
    assert "name" in e._annotations, f"{type(e).__name__} {e.label} is not .named()"
    assert e.name not in names, f"two nodes are named {e.name!r}"
    names[e.name] = e
    if isinstance(e, rasp.Aggregate):
      if rasp.is_numerical(e):
        assert rasp.is_numerical(e.sop) and e.default == 0, e
      else:
        assert rasp.is_categorical(e.sop), e
  return nodes


def check_compilable(nodes, xs):
  ev = Evaluator(xs)
  for e in nodes:
    if isinstance(e, rasp.Aggregate) and rasp.is_categorical(e):
      sel, vals = ev(e.selector), ev(e.sop)
      for q, row in enumerate(sel):
        picked = [v for s, v in zip(row, vals, strict=True) if s]
        assert all(v == picked[0] and type(v) is type(picked[0]) for v in picked), (
            f"categorical Aggregate {e.label} averages different values {picked} "
            f"at query {q} of input {xs!r}")
    elif isinstance(e, rasp.SOp) and rasp.is_numerical(e):
      for v in ev(e):
        assert isinstance(v, (int, float)), f"numerical {e.label} takes {v!r} on {xs!r}"


def exhaustive_inputs(spec):
  lengths = [L for L in spec.lengths(N_EXHAUSTIVE) if L <= 4] or [spec.min_len]
  vocab = sorted(spec.vocab, key=repr)
  for L in lengths:
    for xs in itertools.product(vocab, repeat=L):
      if spec.accepts(list(xs)):
        yield list(xs)


# ----------------------------------------------------------------------------- conformance


def test_programs_table():
  assert set(programs.PROGRAMS) == EXPECTED_PROGRAMS
  for name, spec in programs.PROGRAMS.items():
    assert spec.name == name
    assert spec.encoding in ("categorical", "numerical")
    assert spec.tracr is None or (len(spec.tracr) == 4 and all(isinstance(v, int) for v in spec.tracr))
    assert spec.description
    with pytest.raises(dataclasses.FrozenInstanceError):
      spec.name = "other"
  assert programs.PROGRAMS["shuffle_dyck2"].tracr == (8, 4, 55, 243000)
  assert programs.PROGRAMS["sort"].tracr == (3, 1, 50, 23700)


@pytest.mark.parametrize("name", NAMES)
def test_exhaustive_short_inputs(name):
  spec = programs.PROGRAMS[name]
  inputs = list(exhaustive_inputs(spec))
  assert inputs
  N = max(N_EXHAUSTIVE, max(len(xs) for xs in inputs))
  program = spec.build(N)
  assert rasp.get_encoding(program).value == spec.encoding
  nodes = check_static(program)
  for xs in inputs:
    assert_same(rasp.evaluate(program, xs), spec.reference(xs), spec.encoding == "numerical", xs)
    check_compilable(nodes, xs)


@pytest.mark.parametrize("name", NAMES)
def test_random_inputs(name):
  spec = programs.PROGRAMS[name]
  rng = random.Random(zlib.crc32(name.encode()))
  program = spec.build(N_RANDOM)
  nodes = check_static(program)
  lengths = list(spec.lengths(N_RANDOM))
  for _ in range(RANDOM_INPUTS):
    xs = spec.sample(rng, rng.choice(lengths))
    assert spec.accepts(xs, N_RANDOM), xs
    assert_same(rasp.evaluate(program, xs), spec.reference(xs), spec.encoding == "numerical", xs)
    check_compilable(nodes, xs)


@pytest.mark.parametrize("name", ["shuffle_dyck1", "shuffle_dyck2"])
def test_dyck_samples_hit_both_outcomes(name):
  spec = programs.PROGRAMS[name]
  rng = random.Random(0)
  for n in (4, 6, 8):
    outcomes = {spec.reference(spec.sample(rng, n))[0] for _ in range(100)}
    assert outcomes == {False, True}, (n, outcomes)


def test_samplers_respect_domains():
  rng = random.Random(1)
  for spec in programs.PROGRAMS.values():
    for n in spec.lengths(N_RANDOM):
      assert spec.accepts(spec.sample(rng, n), N_RANDOM)
  with pytest.raises(ValueError, match="distinct"):
    programs.PROGRAMS["sort_unique"].sample(rng, 9)
  with pytest.raises(ValueError, match="length 6"):
    programs.PROGRAMS["transpose"].sample(rng, 5)
  su = programs.PROGRAMS["sort_unique"]
  assert not su.accepts([1, 1]) and su.accepts([2, 1]) and not su.accepts([9])
  assert list(programs.PROGRAMS["transpose"].lengths(12)) == [6]
  assert not programs.PROGRAMS["length"].accepts([])
  assert not programs.PROGRAMS["sort"].accepts([1, 2, 3], max_seq_len=2)


def test_spec_rejects_bad_encoding():
  with pytest.raises(ValueError, match="encoding"):
    programs.ProgramSpec(name="x", build=lambda N: rasp.tokens, vocab=frozenset({1}),
                    reference=list, encoding="onehot", tracr=None, sample=lambda r, n: [1] * n)


# ----------------------------------------------------------------------------- known examples

t = rasp.tokens

KNOWN = [
    (lambda: lib.make_length(), "abcdefg", [7] * 7),
    (lambda: lib.make_reverse(t), "abc", list("cba")),
    (lambda: lib.make_reverse(t), "Hello", list("olleH")),
    (lambda: lib.make_reverse(rasp.indices), "wxyz", [3, 2, 1, 0]),
    (lambda: lib.make_hist(), "abac", [2, 1, 2, 1]),
    (lambda: lib.make_hist(), "aaabbc", [3, 3, 3, 2, 2, 1]),
    (lambda: lib.make_sort_unique(t, t), [2, 4, 3, 1], [1, 2, 3, 4]),
    (lambda: lib.make_sort_unique(rasp.indices, t), [30, 10, 20], [1, 2, 0]),  # argsort
    (lambda: lib.make_sort(t, t, max_seq_len=5, min_key=1), [2, 4, 3, 1], [1, 2, 3, 4]),
    (lambda: lib.make_sort(t, t, max_seq_len=5, min_key=1), [2, 4, 1, 2], [1, 2, 2, 4]),
    (lambda: lib.make_sort(rasp.indices, t, max_seq_len=4, min_key=1), [3, 1, 3, 1], [1, 3, 0, 2]),
    (lambda: lib.make_sort_freq(5), [2, 4, 2, 1], [2, 2, 4, 1]),
    (lambda: lib.make_sort_freq(6), list("abcbcc"), list("cccbba")),
    (lambda: lib.make_frac_prevs((t == "l").named("is_l")), "hello", [0, 0, 1 / 3, 1 / 2, 2 / 5]),
    (lambda: lib.make_frac_prevs((t == "x").named("is_x")), "xyxx", [1, 1 / 2, 2 / 3, 3 / 4]),
    (lambda: lib.make_pair_balance(t, "(", ")"), "a()b(c))",
     [0, 1 / 2, 0, 0, 1 / 5, 1 / 6, 0, -1 / 8]),
    (lambda: lib.make_shuffle_dyck(["()"]), "(())()", [True] * 6),
    (lambda: lib.make_shuffle_dyck(["()"]), ")(", [False, False]),
    (lambda: lib.make_shuffle_dyck(["()"]), "(()", [False] * 3),
    (lambda: lib.make_shuffle_dyck2(), "({)}", [True] * 4),
    (lambda: lib.make_shuffle_dyck2(), "(){)}", [False] * 5),
    (lambda: lib.make_shuffle_dyck2(), "{(})", [True] * 4),
    (lambda: lib.make_shuffle_dyck2(), "}{()", [False] * 4),
    (lambda: lib.make_shuffle_dyck(["()", "{}", "[]"]), "([{)]}", [True] * 6),
    (lambda: lib.make_shuffle_dyck(["()", "{}", "[]"]), "([{)]", [False] * 5),
    (lambda: lib.make_kparity((0, 2, 3)), [1, 0, 1, 0], [0] * 4),
    (lambda: lib.make_kparity((0, 2, 3)), [1, 1, 0, 0, 1], [1] * 5),
    (lambda: lib.make_kparity((0, 2, 3)), [1, 1], [1, 1]),  # positions 2, 3 past the end
    (lambda: lib.make_kparity((5,)), [1, 1], [0, 0]),
    (lambda: lib.make_kparity_count((0, 2, 3)), [1, 0, 1, 1], [1] * 4),
    (lambda: lib.make_kparity_count((0, 2, 3)), [1, 0, 1], [0] * 3),
    (lambda: lib.make_kparity_count((2, 3)), [1], [0]),  # nothing inside: an empty count
    (lambda: lib.make_match2(5), [1, 2, 4], [1, 0, 1]),
    (lambda: lib.make_match2(5), [0, 3], [1, 0]),  # 0 + 0 = 0: j = i counts
    (lambda: lib.make_match2(4), [2, 1, 3], [1, 1, 1]),
    (lambda: lib.make_running_sum(t), [1, 0, 2, 3], [1, 1, 3, 6]),
    (lambda: lib.make_running_sum(t), [3] * 8, [3, 6, 9, 12, 15, 18, 21, 24]),
    (lambda: lib.make_transpose(2, 3), "abcdef", list("adbecf")),
    (lambda: lib.make_transpose(3, 2), "abcdef", list("acebdf")),
    (lambda: lib.make_transpose(2, 2), [1, 2, 3, 4], [1, 3, 2, 4]),
    (lambda: lib.make_transpose(1, 3), "xyz", list("xyz")),
    (lambda: lib.make_transpose(2, 3), "abcd", ["a", "d", "b", None]),  # source e is missing
    (lambda: lib.make_transpose(2, 3), "abcdefgh", list("adbecf") + [None, None]),
    (lambda: lib.make_count(t, "a"), "aaabbc", [3] * 6),
    (lambda: lib.make_count(t, "a"), "cabc", [1] * 4),
    (lambda: lib.make_count_less_freq(2), "aaabbc", [3] * 6),
    (lambda: lib.make_count_less_freq(2), "aacbbc", [6] * 6),
    (lambda: lib.shift_by(1, t), "abc", [None, "a", "b"]),
    (lambda: lib.shift_by(2, t), "abc", [None, None, "a"]),
    (lambda: lib.shift_by(-1, t), "abc", ["b", "c", None]),
    (lambda: lib.detect_pattern(t, "abc"), "abcabc", [None, None, True, False, False, True]),
    (lambda: lib.detect_pattern(t, "a"), "aba", [True, False, True]),
    (lambda: lib.make_nary_sequencemap(lambda a, b, c: f"{a}{b}{c}", t, rasp.indices, t), "ab",
     ["a0a", "b1b"]),
    (lambda: lib.make_nary_sequencemap(lambda a: a * 2, t), [1, 2], [2, 4]),
]


def _known_id(case):
  make, xs, _ = case
  return f"{make().label}:{''.join(map(str, xs))}"


@pytest.mark.parametrize("make, xs, expected", KNOWN, ids=[_known_id(c) for c in KNOWN])
def test_known_examples(make, xs, expected):
  program = make()
  out = rasp.evaluate(program, list(xs))
  assert_same(out, expected, rasp.is_numerical(program), xs)   # categorical: value and type, as tracr's
  check_static(program)


def test_transpose_every_length_matches_reference():
  """Out of the spec's domain (length != 6) the program still has the documented meaning."""
  program = lib.make_transpose(2, 3)
  rng = random.Random(3)
  for n in range(1, 13):
    for _ in range(5):
      xs = [rng.choice("abc") for _ in range(n)]
      assert_same(rasp.evaluate(program, xs), references.ref_transpose(xs), False, xs)


def test_extra_helpers_exhaustively():
  hist = lambda xs: [xs.count(x) for x in xs]
  count_a, less, pattern = lib.make_count(t, "a"), lib.make_count_less_freq(1), lib.detect_pattern(t, "ab")
  shift = lib.shift_by(1, t)
  for L in range(1, 5):
    for xs in map(list, itertools.product("abc", repeat=L)):
      assert rasp.evaluate(count_a, xs) == [xs.count("a")] * L
      assert rasp.evaluate(less, xs) == [sum(h <= 1 for h in hist(xs))] * L
      assert rasp.evaluate(pattern, xs) == [None] + [xs[i - 1:i + 1] == ["a", "b"] for i in range(1, L)]
      assert rasp.evaluate(shift, xs) == [None] + xs[:-1]


def test_factories_validate_arguments():
  with pytest.raises(ValueError, match="at least one"):
    lib.make_kparity([])
  with pytest.raises(ValueError, match="distinct"):
    lib.make_kparity((1, 1))
  with pytest.raises(ValueError, match="non-negative"):
    lib.make_kparity_count((0, -1))
  with pytest.raises(ValueError, match="min_key"):
    lib.make_sort(t, t, max_seq_len=5, min_key=0)
  with pytest.raises(ValueError, match="max_seq_len"):
    lib.make_sort(t, t, max_seq_len=0, min_key=1)
  with pytest.raises(ValueError, match="2-character"):
    lib.make_shuffle_dyck(["(", "{}"])
  with pytest.raises(ValueError, match="share"):
    lib.make_shuffle_dyck(["()", "(]"])
  with pytest.raises(ValueError, match="at least one"):
    lib.make_shuffle_dyck([])
  with pytest.raises(ValueError, match="rows"):
    lib.make_transpose(0, 3)
  with pytest.raises(ValueError, match="M"):
    lib.make_match2(0)
  with pytest.raises(ValueError, match="pattern"):
    lib.detect_pattern(t, "")
  with pytest.raises(ValueError, match="offset"):
    lib.shift_by(1.5, t)
  with pytest.raises(ValueError, match="at least one"):
    lib.make_nary_sequencemap(lambda: 0)


def test_sort_needs_max_seq_len_at_least_n():
  """The tiebreak ``i / max_seq_len`` stays below 1 only for ``i < max_seq_len``."""
  xs = [2, 1, 1, 1, 1]
  assert rasp.evaluate(lib.make_sort(t, t, max_seq_len=5, min_key=1), xs) == [1, 1, 1, 1, 2]
  assert rasp.evaluate(lib.make_sort(t, t, max_seq_len=2, min_key=1), xs) != [1, 1, 1, 1, 2]


# ----------------------------------------------------------------------------- the DSL

i = rasp.indices


def test_operator_overloads_build_maps_and_sequencemaps():
  xs = [0, 2, 3]
  unary = {
      "lt": (t < 2, [True, False, False]), "le": (t <= 2, [True, True, False]),
      "gt": (t > 2, [False, False, True]), "ge": (t >= 2, [False, True, True]),
      "eq": (t == 2, [False, True, False]), "ne": (t != 2, [True, False, True]),
      "add": (t + 1, [1, 3, 4]), "radd": (1 + t, [1, 3, 4]), "sub": (t - 1, [-1, 1, 2]),
      "rsub": (10 - t, [10, 8, 7]), "mul": (t * 2, [0, 4, 6]), "rmul": (2 * t, [0, 4, 6]),
      "div": (t / 2, [0, 1, 1.5]), "rdiv": (6 / (t + 1), [6, 2, 1.5]),
      "and": (t & 5, [0, 5, 5]), "rand": (True & t, [0, 2, 3]), "or": (t | 5, [5, 2, 3]),
      "ror": (0 | t, [0, 2, 3]), "invert": (~t, [True, False, False]),
  }
  for key, (sop, expected) in unary.items():
    assert isinstance(sop, rasp.Map) and not isinstance(sop, rasp.SequenceMap), key
    assert rasp.evaluate(sop, xs) == expected, key
  assert (t < 2).inner is t
  binary = {
      "add": (t + i, [0, 3, 5]), "sub": (t - i, [0, 1, 1]), "rsub": (i - t, [0, -1, -1]),
      "mul": (t * i, [0, 2, 6]), "div": (i / (t + 1), [0, 1 / 3, 0.5]),
      "and": (t & i, [0, 1, 2]), "or": (t | i, [0, 2, 3]),
  }
  for key, (sop, expected) in binary.items():
    assert isinstance(sop, rasp.SequenceMap), key
    assert rasp.evaluate(sop, xs) == expected, key
  s = i - t
  assert s.fst is i and s.snd is t
  # == builds a Map, so SOps hash (and compare in sets) by identity
  assert {t: 1, i: 2}[t] == 1 and len({t, i, t}) == 2
  assert rasp.sop_not(t).f(0) is True


def test_map_simplification_and_none_propagation():
  inner = rasp.Map(lambda x: x + 1, t)
  outer = rasp.Map(lambda x: x * 10, inner)
  assert outer.inner is t and rasp.evaluate(outer, [1, 2]) == [20, 30]
  kept = rasp.Map(lambda x: x * 10, inner, simplify=False)
  assert kept.inner is inner and rasp.evaluate(kept, [1, 2]) == [20, 30]
  declared = rasp.annotate(inner, value_set={2, 3})
  assert rasp.Map(lambda x: x * 10, declared).inner is declared

  calls = []
  nothing = rasp.Aggregate(rasp.Select(i, i, rasp.Comparison.FALSE), t)  # all None
  assert rasp.evaluate(nothing, [1, 2]) == [None, None]
  assert rasp.evaluate(rasp.Map(lambda x: calls.append(x) or 0, nothing), [1, 2]) == [None, None]
  assert rasp.evaluate(rasp.SequenceMap(lambda x, y: calls.append(x) or 0, t, nothing),
                       [1, 2]) == [None, None]
  assert calls == []
  first = rasp.Aggregate(rasp.Select(i, i, lambda k, q: k == 0), t)  # x[0] everywhere
  assert rasp.evaluate(rasp.SequenceMap(lambda x, y: (x, y), first, t), [7, 8]) == [(7, 7), (7, 8)]


def test_full_constant_linear():
  assert rasp.evaluate(rasp.Full(7), "abc") == [7, 7, 7]
  assert rasp.evaluate(rasp.Full("z") + t, "ab") == ["za", "zb"]
  assert rasp.evaluate(rasp.ConstantSOp([1, 2, 3]), "abc") == [1, 2, 3]
  with pytest.raises(ValueError, match="doesn't match"):
    rasp.evaluate(rasp.ConstantSOp([1, 2]), "abc")
  assert rasp.evaluate(rasp.ConstantSOp([1, 2], check_length=False), "abc") == [1, 2]
  lin = rasp.LinearSequenceMap(t, i, 2, -1)
  assert isinstance(lin, rasp.SequenceMap) and rasp.evaluate(lin, [5, 5, 5]) == [10, 9, 8]
  with pytest.raises(ValueError, match="fst_fac"):
    rasp.LinearSequenceMap(t, i, "2", 1)
  with pytest.raises(ValueError, match="snd_fac"):
    rasp.LinearSequenceMap(t, i, 1, True)
  assert rasp.evaluate(rasp.length, "abcd") == [4] * 4
  assert rasp.evaluate(i, "abc") == [0, 1, 2] and rasp.evaluate(t, "ab") == ["a", "b"]


def test_select_orientation_and_comparisons():
  lt = rasp.evaluate(rasp.Select(i, i, rasp.Comparison.LT), "abc")
  assert lt == [[False, False, False], [True, False, False], [True, True, False]]  # S[q][k]: k < q
  seen = []
  sel = rasp.Select(t, i, lambda k, q: seen.append((k, q)) or True)
  rasp.evaluate(sel, "ab")
  assert sorted(seen) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]  # predicate(key, query)
  C = rasp.Comparison
  table = {C.EQ: (False, True, False), C.LT: (True, False, False), C.LEQ: (True, True, False),
           C.GT: (False, False, True), C.GEQ: (False, True, True), C.NEQ: (True, False, True),
           C.TRUE: (True, True, True), C.FALSE: (False, False, False)}
  for comp, expected in table.items():
    assert tuple(comp(k, 2) for k in (1, 2, 3)) == expected, comp
  with pytest.raises(ValueError, match="key is None"):
    C.EQ(None, 1)
  with pytest.raises(ValueError, match="query is None"):
    C.LT(1, None)


def _elementwise(op, *mats):
  return [[op(*cells) for cells in zip(*rows, strict=True)] for rows in zip(*mats, strict=True)]


def test_selector_and_or_not():
  xs = [1, 2, 1, 3]
  le = rasp.Select(i, i, rasp.Comparison.LEQ)
  ge = rasp.Select(i, i, rasp.Comparison.GEQ)
  eq_tok = rasp.Select(t, t, rasp.Comparison.EQ)
  M = {s: rasp.evaluate(s, xs) for s in (le, ge, eq_tok)}

  both = le & ge  # same keys/queries: one Select
  assert isinstance(both, rasp.Select)
  assert rasp.evaluate(both, xs) == [[q == k for k in range(4)] for q in range(4)]
  assert isinstance(rasp.And(le, ge), rasp.Select)
  assert rasp.evaluate(le | ge, xs) == [[True] * 4 for _ in range(4)]
  assert isinstance(~le, rasp.Select) and rasp.evaluate(~le, xs) == rasp.evaluate(
      rasp.Select(i, i, rasp.Comparison.GT), xs)

  mixed_and, mixed_or = le & eq_tok, rasp.Or(le, eq_tok)
  assert isinstance(mixed_and, rasp.SelectorAnd) and isinstance(mixed_or, rasp.SelectorOr)
  assert rasp.evaluate(mixed_and, xs) == _elementwise(lambda a, b: a and b, M[le], M[eq_tok])
  assert rasp.evaluate(mixed_or, xs) == _elementwise(lambda a, b: a or b, M[le], M[eq_tok])
  neg = rasp.Not(mixed_and)
  assert isinstance(neg, rasp.SelectorNot)
  assert rasp.evaluate(neg, xs) == _elementwise(lambda a, b: not (a and b), M[le], M[eq_tok])
  three = rasp.And(le, eq_tok, ge)
  assert rasp.evaluate(three, xs) == _elementwise(lambda a, b, c: a and b and c,
                                                  M[le], M[eq_tok], M[ge])
  unsimplified = rasp.selector_and(le, ge, simplify=False)
  assert isinstance(unsimplified, rasp.SelectorAnd)
  assert rasp.evaluate(unsimplified, xs) == rasp.evaluate(both, xs)
  assert isinstance(rasp.selector_not(le, simplify=False), rasp.SelectorNot)
  for f in (rasp.And, rasp.Or):
    with pytest.raises(ValueError, match="at least one"):
      f()
  with pytest.raises(ValueError, match="Selector"):
    rasp.SelectorAnd(le, t)
  # a selector built from the combinators drives an Aggregate like any other
  prev_same = rasp.Aggregate(rasp.And(rasp.Select(i, i, rasp.Comparison.LT), eq_tok), i)
  assert rasp.evaluate(prev_same, xs) == [None, None, 0, None]


def test_aggregate_and_selector_width():
  none = rasp.Select(i, i, rasp.Comparison.FALSE)
  assert rasp.evaluate(rasp.Aggregate(none, t, default=0), "abc") == [0, 0, 0]
  assert rasp.evaluate(rasp.Aggregate(none, t), "abc") == [None] * 3
  assert rasp.evaluate(rasp.Aggregate(none, t, default="pad"), "ab") == ["pad", "pad"]
  assert rasp.evaluate(rasp.SelectorWidth(none), "abc") == [0, 0, 0]
  prefix = rasp.Select(i, i, rasp.Comparison.LEQ)
  mean = rasp.numerical(rasp.Aggregate(prefix, rasp.numerical(rasp.Map(lambda x: x, t)), default=0))
  assert rasp.evaluate(mean, [1, 2, 6]) == [1, 1.5, 3]
  same = rasp.Aggregate(rasp.Select(t, t, rasp.Comparison.EQ), t)  # all-equal strings
  assert rasp.evaluate(same, "aba") == ["a", "b", "a"]
  with pytest.raises(ValueError, match="differ"):
    rasp.evaluate(rasp.Aggregate(rasp.Select(t, t, rasp.Comparison.TRUE), t), "ab")
  assert rasp.evaluate(rasp.SelectorWidth(prefix), "abcd") == [1, 2, 3, 4]
  with pytest.raises(ValueError, match="default"):
    rasp.Aggregate(prefix, t, default=[0])
  with pytest.raises(ValueError, match="selector"):
    rasp.Aggregate(t, t)
  with pytest.raises(ValueError, match="sop"):
    rasp.Aggregate(prefix, prefix)
  with pytest.raises(ValueError, match="selector"):
    rasp.SelectorWidth(t)


def test_encodings_and_annotations():
  m = t + 1
  assert rasp.get_encoding(m) is rasp.Encoding.CATEGORICAL and rasp.is_categorical(m)
  n = rasp.numerical(m)
  assert rasp.is_numerical(n) and not rasp.is_numerical(m)  # a copy; the original unchanged
  assert n is not m and rasp.evaluate(n, [1]) == [2]
  assert rasp.is_categorical(rasp.categorical(n))
  assert rasp.is_numerical(n.named("n"))  # naming keeps the encoding
  assert rasp.is_categorical(n + 0)  # an operator on a numerical SOp builds a categorical Map
  v = rasp.annotate(m, value_set=[2, 3])
  assert v.annotations["value_set"] == frozenset({2, 3}) and "value_set" not in m.annotations
  with pytest.raises(ValueError, match="value_set"):
    rasp.annotate(m, value_set=[[1]])
  with pytest.raises(ValueError, match="encoding"):
    rasp.annotate(m, encoding="numerical")
  with pytest.raises(ValueError, match="annotate"):
    rasp.annotate(3, name="x")
  with pytest.raises(ValueError, match="SOp"):
    rasp.numerical(rasp.Select(t, t, rasp.Comparison.EQ))


def test_named():
  m = t + 1
  n = m.named("plus_one")
  assert n.name == n.label == "plus_one" and m.name != "plus_one"
  assert m.name == f"map_{m.unique_id}" and n.unique_id != m.unique_id
  assert isinstance(n, rasp.Map) and rasp.evaluate(n, [1, 2]) == [2, 3]
  assert (t.name, i.name, rasp.length.name) == ("tokens", "indices", "length")
  assert t.named("toks").name == "toks" and t.name == "tokens"
  sel = rasp.Select(t, t, rasp.Comparison.EQ).named("same")
  assert isinstance(sel, rasp.Select) and sel.name == "same"
  assert repr(n) == "Map(plus_one)"
  for bad in ("", None, 3):
    with pytest.raises(ValueError, match="name"):
      m.named(bad)


def test_evaluate_memoises_a_diamond():
  calls = []

  def shared_fn(x, j):
    calls.append((x, j))
    return x + j

  a = rasp.SequenceMap(shared_fn, t, i).named("a")
  b = (a + 1).named("b")
  c = (a * 2).named("c")
  d = (b + c).named("d")
  xs = [1, 2, 3]
  assert rasp.evaluate(d, xs) == [(x + j + 1) + 2 * (x + j) for j, x in enumerate(xs)]
  assert len(calls) == 3  # a evaluated once, though both b and c read it
  assert d(xs) == rasp.evaluate(d, xs) and len(calls) == 9  # memo is per evaluation

  pred_calls = []
  shared_sel = rasp.Select(i, i, lambda k, q: pred_calls.append(1) or k <= q)
  s1 = rasp.SelectorWidth(shared_sel)
  s2 = rasp.Aggregate(shared_sel, rasp.numerical(rasp.Map(lambda x: x, t)), default=0)
  assert rasp.evaluate(rasp.SequenceMap(lambda w, m: (w, m), s1, rasp.numerical(s2)),
                       [2, 4]) == [(1, 2), (2, 3)]
  assert len(pred_calls) == 4  # one 2×2 selector evaluation, shared by both heads
  with pytest.raises(ValueError, match="RASP expression"):
    rasp.evaluate(lambda x: x, [1])

