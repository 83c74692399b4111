"""Wrong results a differential fuzzing review found in the RASP compiler (each program here was
compiled to a model that disagreed with the interpreter, crashed, or took minutes to refuse),
now either exact or refused at compile time with a ``ValueError`` naming the SOp.

Every compiled program is compared with :func:`jaxmem.rasp.evaluate` on every input up to a
small length with :func:`jaxmem.rasp.conformance.agree`, which tells None from 0.
"""

from __future__ import annotations

import itertools
import time

import pytest

from jaxmem import rasp
from jaxmem.rasp import conformance
from jaxmem.rasp.passes import graph_to_value_sets

C = rasp.Comparison


def _exact(program, vocab, N, max_len=None, causal=False):
  """Compiles ``program`` and compares it with the interpreter on every input of length <= max_len."""
  model = rasp.compile(program, vocab, N, causal=causal)
  inputs = [list(x) for n in range(1, (max_len or N) + 1) for x in itertools.product(vocab, repeat=n)]
  check = conformance.check_model(model, program, inputs, name="p", compile_s=0.0)
  assert check.wrong == 0, check.example
  return model


def _prefix():
  return rasp.Select(rasp.indices, rasp.indices, C.LEQ)


# ------------------------------------------------------------------------------------- None


def test_agree_tells_none_from_zero():
  assert not conformance.agree("numerical", [None, 1.0], [0.0, 1.0])[0]
  assert not conformance.agree("numerical", [0.0], [None])[0]
  assert not conformance.agree("categorical", [None], [0])[0]
  assert conformance.agree("numerical", [None, 0.5], [None, 0.5])[0]


def test_a_numerical_mean_with_default_none_that_may_select_nothing_is_refused_as_the_output():
  """The interpreter gives None at position 0 (nothing before it); the model decoded 0.0."""
  ones = rasp.numerical(rasp.Map(lambda t: 1, rasp.tokens))
  prev = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.LT), ones)).named("prev")
  assert rasp.evaluate(prev, list("ab")) == [None, 1]
  with pytest.raises(ValueError, match="'prev' \\(the program's output\\) may be None: it has default None"):
    rasp.compile(prev, list("ab"), 4)
  # a selector that always selects the query's own position never falls back to the default
  mean = rasp.numerical(rasp.Aggregate(_prefix(), ones)).named("mean")
  _exact(mean, list("ab"), 4)


def test_a_numerical_map_of_a_maybe_none_sop_is_refused_as_the_output():
  """A numerical Map of an Aggregate that may be None: the interpreter passes None on, the model
  decoded 0.0 (or f(0.0))."""
  prev = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == q - 1), rasp.tokens)
  num = rasp.numerical(rasp.Map(lambda t: 2.0 if t == "a" else 3.0, prev)).named("num")
  assert rasp.evaluate(num, list("ab"))[0] is None
  with pytest.raises(ValueError, match="'num' \\(the program's output\\) may be None: it reads"):
    rasp.compile(num, list("ab"), 4)


def test_a_numerical_map_returning_none_is_refused_as_the_output():
  num = rasp.numerical(rasp.Map(lambda t: None if t == "a" else 1, rasp.tokens)).named("num")
  with pytest.raises(ValueError, match="'num' \\(the program's output\\) may be None: its function"):
    rasp.compile(num, list("ab"), 3)


# ------------------------------------------------------------------------------ big integers


@pytest.mark.parametrize("predicate", [C.EQ, C.LT, C.NEQ, C.GEQ])
def test_integers_above_2_to_the_53_compare_exactly(predicate):
  """float64 tables made 2⁵³ and 2⁵³ + 1 equal: a width of 2 where the interpreter has 1."""
  big = [2 ** 53, 2 ** 53 + 1]
  width = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, predicate))
  _exact(width, big, 3)
  total = rasp.LinearSequenceMap(rasp.tokens, rasp.tokens, 1, 1)   # 2⁵⁴ + 2 is not a float64 either
  _exact(total, big, 2)


# ------------------------------------------------------------------------------- float means


def test_an_indicator_of_a_float_mean_flipping_inside_its_rounding_is_refused():
  """``x == sum([0.3] * 46) / 46`` of a running mean of 0.3s: the interpreter's float sum hits it at
  positions 45..47, the exact mean (0.3) does not; the old check sampled the rounding interval
  (its ends and 4 floats each side of the value) and missed it."""
  x = rasp.numerical(rasp.Map(lambda t: 0.3 if t == "a" else 0.5, rasp.tokens))
  mean = rasp.numerical(rasp.Aggregate(_prefix(), x, default=0)).named("mean")
  target = sum([0.3] * 46) / 46
  hit = rasp.Map(lambda v: v == target, mean).named("hit")
  assert rasp.evaluate(hit, ["a"] * 48)[44:] == [False, True, True, True]
  t0 = time.process_time()
  with pytest.raises(ValueError, match="'hit' gives False at \\(0.3,\\) but True at"):
    rasp.compile(hit, list("ab"), 48)
  assert time.process_time() - t0 < 1.0


def test_a_threshold_away_from_every_float_mean_is_proved_and_exact():
  x = rasp.numerical(rasp.Map(lambda t: 0.3 if t == "a" else 0.5, rasp.tokens))
  mean = rasp.numerical(rasp.Aggregate(_prefix(), x, default=0))
  _exact(rasp.Map(lambda v: v > 0.31, mean), list("ab"), 6)


def test_a_map_of_a_difference_of_float_means_is_refused_not_unchecked():
  """The rounding of a LinearSequenceMap of two float means was not passed on, so a Map of it
  was not checked at all."""
  x = rasp.numerical(rasp.Map(lambda t: 0.1 if t == "a" else 0.7, rasp.tokens))
  y = rasp.numerical(rasp.Map(lambda t: 0.2 if t == "b" else 0.3, rasp.tokens))
  diff = rasp.numerical(rasp.LinearSequenceMap(rasp.numerical(rasp.Aggregate(_prefix(), x, default=0)),
                                               rasp.numerical(rasp.Aggregate(_prefix(), y, default=0)), 2, -1))
  with pytest.raises(ValueError, match="'zero' reads '.*', whose interpreter value is known only"):
    rasp.compile(rasp.Map(lambda v: v == 0, diff).named("zero"), list("ab"), 5)


def test_a_categorical_linear_sequence_map_of_two_means_compiles():
  """Refused with an internal 'value -0.25 is not in the value set' error (the joint value set of
  a numerical difference was used for the table of a categorical one)."""
  a = rasp.numerical(rasp.Map(lambda t: 1 if t == "a" else 0, rasp.tokens))
  b = rasp.numerical(rasp.Map(lambda t: 1 if t == "b" else 0, rasp.tokens))
  sel = _prefix()
  diff = rasp.LinearSequenceMap(rasp.numerical(rasp.Aggregate(sel, a, default=0)),
                                rasp.numerical(rasp.Aggregate(sel, b, default=0)), 1, -1)
  _exact(diff, list("abc"), 4)


# ----------------------------------------------------------------------- crashes and hangs


def test_a_select_whose_keys_raise_on_every_value_compiles_and_raises_where_the_interpreter_does():
  """IndexError in build_head: an empty value set (keys and queries) indexed the weights with an
  empty float array."""
  keys = rasp.Map(lambda t: 1 / 0, rasp.tokens)
  queries = rasp.Map(lambda t: [][0], rasp.tokens)
  for program in (rasp.Aggregate(rasp.Select(keys, queries, C.EQ), rasp.tokens),
                  rasp.Aggregate(rasp.Select(keys, rasp.tokens, C.EQ), rasp.tokens)):
    model = _exact(program, list("ab"), 3)
    with pytest.raises(ValueError, match="raises"):
      model.apply(list("ab"))


def test_a_numerical_sop_with_an_empty_value_set_compiles():
  """IndexError in map_lane (fuzz seed 0, index 20): a numerical SOp whose function raises on every
  value, read as a Select key through its categorical copy, had no value to discretise."""
  fill = rasp.Full("ab")
  number = rasp.numerical(rasp.Map(lambda x: int(x), fill))
  program = rasp.numerical(rasp.Aggregate(rasp.Select(number, fill, C.EQ), number, default=-1))
  _exact(program, ["", "a", "ab"], 3)


def test_an_oversize_mean_is_refused_within_a_second_and_inferred_once(monkeypatch):
  """A mean of a mean of many float values: its sum-set was summed as Fractions with the cap
  checked after each full step, and inferred twice per compile (minutes to refuse)."""
  calls = []
  means = graph_to_value_sets.ValueSets._means
  monkeypatch.setattr(graph_to_value_sets.ValueSets, "_means",
                      lambda self, e: calls.append(e.label) or means(self, e))
  x = rasp.numerical(rasp.Map(lambda t: t * 0.37, rasp.tokens))
  m1 = rasp.numerical(rasp.Aggregate(_prefix(), x, default=0)).named("m1")
  m2 = rasp.numerical(rasp.Aggregate(_prefix(), rasp.numerical(rasp.Map(lambda v: v * 1.1, m1)),
                                     default=0)).named("m2")
  program = rasp.Map(lambda v: v > 0.5, m2)
  for N in (8, 16, 40):
    calls.clear()
    t0 = time.process_time()   # CPU time: the suite shares the machine's cores with other workers
    with pytest.raises(ValueError, match="'m[12]'.*can take more than|'m[12]'.*takes more than"):
      rasp.compile(program, list(range(1, 12)), N)
    assert time.process_time() - t0 < 1.0, N
    assert sorted(calls) == sorted(set(calls)), calls   # each mean's values inferred once


# --------------------------------------------------------------------- tracr's semantics


def test_a_categorical_mean_of_equal_numbers_is_a_float_as_in_tracr():
  """tracr's ``_mean``: one selected value as it is, a mean of several as ``sum / len`` (1.0 for
  [1, 1]); jaxmem's interpreter returned 1."""
  ones = rasp.Map(lambda t: 1, rasp.tokens)
  mean = rasp.Aggregate(rasp.Select(rasp.tokens, rasp.tokens, C.EQ), ones)
  out = rasp.evaluate(mean, list("aab"))
  assert out == [1.0, 1.0, 1] and [type(v) for v in out] == [float, float, int]
  # a function that sees the type is refused; one that sees the value compiles
  with pytest.raises(ValueError, match="Map 'shown' gives '1' at \\(1,\\) but '1.0' at \\(1.0,\\)"):
    rasp.compile(rasp.Map(str, mean).named("shown"), list("ab"), 4)
  _exact(rasp.Map(lambda v: v + 1, mean), list("ab"), 4)


def test_a_numerical_mean_of_strings_names_the_aggregate():
  mean = rasp.numerical(rasp.Aggregate(_prefix(), rasp.tokens, default=0)).named("mean_of_strings")
  with pytest.raises(ValueError, match="numerical Aggregate 'mean_of_strings' averages the non-numerical"):
    rasp.compile(mean, list("ab"), 3)


def test_tracr_interpreter_agrees_on_the_means():
  tracr_rasp = pytest.importorskip("tracr.rasp.rasp")
  ones = tracr_rasp.Map(lambda t: 1, tracr_rasp.tokens)
  mean = tracr_rasp.Aggregate(tracr_rasp.Select(tracr_rasp.tokens, tracr_rasp.tokens,
                                                tracr_rasp.Comparison.EQ), ones)
  want = tracr_rasp.evaluate(mean, list("aab"))
  ours = rasp.Aggregate(rasp.Select(rasp.tokens, rasp.tokens, C.EQ), rasp.Map(lambda t: 1, rasp.tokens))
  got = rasp.evaluate(ours, list("aab"))
  assert got == want and [type(v) for v in got] == [type(v) for v in want]


# ------------------------------------------------------------- the 5,000-program fuzz run


def test_a_categorical_mean_of_equal_numbers_that_the_interpreter_rounds_is_refused():
  """Several positions holding 0.2 average to 0.20000000000000004 in the interpreter (a float sum,
  then a division), 2**53 + 1 twice to 2**53; the model decoded the value itself (fuzz 1149, 694).
  Integers, dyadic fractions and strings average exactly and still compile."""
  both = rasp.Select(rasp.length, rasp.length, lambda k, q: k * q > 1)   # everything once length > 1
  with pytest.raises(ValueError, match="categorical Aggregate 'avg' may select several positions holding "
                                       "0.2, whose mean the interpreter computes as 0.20000000000000004"):
    rasp.compile(rasp.Aggregate(both, rasp.tokens).named("avg"), [0.2], 3)
  big = 2 ** 53 + 1
  with pytest.raises(ValueError, match="holding 9007199254740993, whose mean .* 9007199254740992.0"):
    rasp.compile(rasp.Aggregate(both, rasp.tokens).named("avg"), [big], 2)
  same = rasp.Select(rasp.tokens, rasp.tokens, C.EQ)
  for vocab in ([1, 2, 3], [0.5, 0.25], ["a", "b"]):
    _exact(rasp.Aggregate(same, rasp.tokens), vocab, 4)


def test_numbers_that_are_one_float_are_refused_in_a_numerical_dimension():
  """2**53 and 2**53 + 1 are one float: a Select on them through the numerical dimension selected
  2**53 + 1 <= 2**53 (fuzz 896)."""
  x = rasp.numerical(rasp.tokens).named("x")
  program = rasp.numerical(rasp.Aggregate(rasp.Select(x, x, C.LEQ), x, default=0.5))
  with pytest.raises(ValueError, match="numerical SOp 'x' holds the values 9007199254740992 and "
                                       "9007199254740993, which are one number as floats"):
    rasp.compile(program, [2 ** 53, 2 ** 53 + 1, 3], 3, causal=True)


def test_an_or_whose_other_side_raises_is_refused_as_the_interpreter_raises():
  """The interpreter evaluates both Selects of an Or on every pair and raises on ``2 < 'b'``; the
  product Select short-circuited past it and the model gave -1s (fuzz 4665)."""
  letters = rasp.Map(lambda t: "abc"[t % 3], rasp.tokens)
  mixed = rasp.SequenceMap(lambda i, s: s if i else i, rasp.indices, letters).named("mixed")
  flag = rasp.numerical(rasp.Map(lambda v: v == "a", mixed, simplify=False)).named("flag")
  either = rasp.Select(flag, flag, C.TRUE) | rasp.Select(rasp.length, mixed, C.LT)
  program = rasp.numerical(rasp.Aggregate(either, flag, default=0.5))
  with pytest.raises(TypeError):
    rasp.evaluate(program, [1, 1])
  with pytest.raises(ValueError, match="raised TypeError: '<' not supported between instances of 'int' and"):
    rasp.compile(program, [1, 2, 3], 5)


def test_a_product_selects_table_equals_its_predicate_on_every_pair():
  """The table of an And / Or / Not over several SOps is built from each Select's own table; it
  equals the tuple predicate called on every pair (what the head used to be built from)."""
  from jaxmem.rasp.craft.attention import _predicate_table  # noqa: PLC0415
  from jaxmem.rasp.passes.rasp_to_normal_form import ProductPredicate  # noqa: PLC0415
  a, b, c = rasp.tokens, rasp.indices, rasp.Map(lambda t: t % 2, rasp.tokens)
  sel = (rasp.Select(a, b, C.LT) & ~rasp.Select(c, c, C.EQ)) | rasp.Select(b, a, lambda k, q: k + q == 3)
  pred = ProductPredicate(sel, {a.unique_id: 0, c.unique_id: 1, b.unique_id: 2},
                          {b.unique_id: 0, c.unique_id: 1, a.unique_id: 2}, 3, 3)
  keys = [(t, t % 2, i) for t in range(4) for i in range(3)]
  queries = [(i, t % 2, t) for i in range(3) for t in range(4)]
  table = _predicate_table(rasp.Select(rasp.tokens, rasp.tokens, pred), queries, keys)
  want = [[1.0 if pred(k, q) else 0.0 for k in keys] for q in queries]
  assert table.tolist() == want and 0 < table.sum() < table.size


def test_programs_that_ran_past_the_fuzzers_time_limit_are_refused_within_a_second():
  """A type check over every pair of two mean value sets (fuzz 432, 4323: minutes) and a product
  Select's table called per tuple pair (fuzz 554: 25 s) were the fuzz run's hangs."""
  sel1 = rasp.Select(rasp.tokens, rasp.tokens, C.TRUE)
  s2 = rasp.numerical(rasp.Aggregate(sel1, rasp.tokens, default=-1))
  s4 = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.tokens, rasp.length, C.NEQ), s2, default=-1))
  program = rasp.numerical(rasp.SequenceMap(lambda x, y: x if y else -1, s4, s4))
  t0 = time.process_time()   # CPU time: the suite shares the machine's cores with other workers
  with pytest.raises(ValueError):
    rasp.compile(program, [1, 2, 3], 6)
  assert time.process_time() - t0 < 1.0


def test_max_pairs_bounds_a_sequence_maps_table_and_is_checked():
  program = rasp.SequenceMap(lambda a, b: a < b, rasp.tokens, rasp.indices)
  with pytest.raises(ValueError, match="has 5×4 input pairs, more than max_pairs=19"):
    rasp.compile(program, [0, 1, 2, 3, 4], 4, max_pairs=19)
  _exact(program, [0, 1, 2, 3, 4], 4, max_len=2)
  for bad in (0, True, 2.5):
    with pytest.raises(ValueError, match="`max_pairs` must be a positive integer"):
      rasp.compile(program, [0, 1], 4, max_pairs=bad)
