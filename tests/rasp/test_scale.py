"""The compiler at scale: what lets `length`, `reverse` and tracr's `shuffle_dyck2` compile at large N
(the sizes and timings themselves are measured by `jaxmem bench rasp`, not here).

* the SelectorWidth gap guard is relative: `length` is exact past N = 315, where an absolute
  1e-5 guard stopped it;
* the parameter limit is checked before any weight array is built, and the message gives the estimate;
* `opens − closes` (two means over one selector) gets its value set from the sums both can have together,
  without a pair of value sets (491 × 491 at N = 40);
* an affine SequenceMap of exact integers (`length − 1 − indices`) is one lane over the affine form, so
  `reverse` grows as N², not N³;
and every one of these compiled models equals the interpreter.
"""

from __future__ import annotations

import itertools
import random

import pytest

from jaxmem import rasp
from jaxmem.rasp import conformance, lib
from jaxmem.rasp.passes import graph_to_value_sets, schedule_to_craft
from jaxmem.rasp.programs import PROGRAMS

C = rasp.Comparison


def _check(program, vocab, N, inputs, causal=False):
  model = rasp.compile(program, vocab, N, causal=causal)
  c = conformance.check_model(model, program, inputs, name="scale", compile_s=0.0)
  assert c.wrong == 0, c.example
  return model


def test_length_is_exact_beyond_the_old_absolute_gap_limit():
  N = 400   # 1/(w+1) values 6e-6 apart at w = N: refused by an absolute 1e-5 guard, exact relative to 1/N
  model = rasp.compile(lib.make_length(), list("ab"), N)
  xs = [["a"] * N, ["b"] * (N - 1), ["a", "b"] * 150, ["a"]]
  assert model.apply_batch(xs) == [[len(x)] * len(x) for x in xs]


def test_tiny_values_apart_relative_to_their_size_compile_exactly():
  # 0 and 1e-9 (and their means): 1e-9 apart, but relative to the values far apart in float32
  tiny = rasp.numerical(rasp.Map(lambda t: {"a": 0.0, "b": 1e-9}[t], rasp.tokens))
  mean = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.LEQ), tiny, default=0))
  program = rasp.Map(lambda x: x > 4e-10, mean).named("above")
  inputs = [list(x) for n in range(1, 5) for x in itertools.product("ab", repeat=n)]
  for causal in (False, True):
    _check(program, list("ab"), 4, inputs, causal)


def test_max_params_is_refused_before_any_weight_is_built(monkeypatch):
  def no_heads(*args, **kwargs):
    raise AssertionError("a head was built before the size check")
  monkeypatch.setattr(schedule_to_craft, "build_head", no_heads)
  monkeypatch.setattr(schedule_to_craft, "assemble_mlp", no_heads)
  spec = PROGRAMS["sort_freq"]
  with pytest.raises(ValueError, match=r"at least [\d,]+ parameters .*estimated before building.*"
                                       r"max_params=10,000"):
    rasp.compile(spec.build(40), sorted(spec.vocab, key=repr), 40, max_params=10_000)


def _pair_balance():
  """tracr's make_pair_balance: two means over two (equal) prefix selectors, and their difference."""
  parts = []
  for tok in "()":
    prefix = rasp.Select(rasp.indices, rasp.indices, C.LEQ)
    bools = rasp.numerical(rasp.Map(lambda x, t=tok: x == t, rasp.tokens))
    parts.append(rasp.numerical(rasp.Aggregate(prefix, bools, default=0)))
  return rasp.numerical(rasp.LinearSequenceMap(parts[0], parts[1], 1, -1)).named("balance")


def test_difference_of_two_means_over_one_selector_has_the_joint_value_set():
  N = 40
  balance = _pair_balance()
  vs = graph_to_value_sets.ValueSets(list("()a"), N)
  got = vs[balance]
  # every value the interpreter can compute: o opens and c closes among w positions
  want = {o / w - c / w for w in range(1, N + 1) for o in range(w + 1) for c in range(w + 1 - o)} | {0}
  assert sorted(got) == sorted(want)
  assert len(got) < 2_500 < 491 * 491

  program = rasp.Map(lambda b: b < 0, balance).named("negative")
  rng = random.Random(0)
  inputs = [[rng.choice("()a") for _ in range(rng.randint(1, N))] for _ in range(60)]
  for causal in (False, True):
    _check(program, list("()a"), N, inputs, causal)


def test_tracr_shuffle_dyck2_compiles_at_n40():
  pytest.importorskip("tracr")
  program = conformance.tracr_lib().make_shuffle_dyck2()
  spec = PROGRAMS["shuffle_dyck2"]
  rng = random.Random(1)
  _check(program, list("(){}"), 40, [spec.sample(rng, n) for n in (1, 2, 7, 20, 39, 40, 40, 40)])


def _affine_programs():
  i = rasp.numerical(rasp.Map(lambda x: x, rasp.indices, simplify=False)).named("i")
  n = rasp.length
  yield rasp.SequenceMap(lambda size, j: size - 1 - j, n, rasp.indices).named("opp")       # categorical
  yield rasp.SequenceMap(lambda a, b: a - 2 * b + 1, i, n).named("mixed")                 # numerical operand
  yield rasp.numerical(rasp.SequenceMap(lambda a, b: 3 - a + 2 * b, n, rasp.indices)).named("num_out")
  opp = rasp.SequenceMap(lambda size, j: size - 1 - j, n, rasp.indices).named("opp2")
  yield rasp.Aggregate(rasp.Select(rasp.indices, opp, C.EQ), rasp.tokens).named("reverse")


@pytest.mark.parametrize("k", range(4))
def test_affine_sequence_maps_equal_the_interpreter(k):
  program = list(_affine_programs())[k]
  inputs = [list(x) for n in range(1, 5) for x in itertools.product("ab", repeat=n)]
  for causal in (False, True):
    _check(program, list("ab"), 6, inputs, causal)


def test_reverse_grows_as_n_squared():
  spec = PROGRAMS["reverse"]
  p80, p160 = (rasp.compile(spec.build(N), sorted(spec.vocab), N).num_params for N in (80, 160))
  assert p160 / p80 < 4.5   # N²: 4; the N³ pair table of n − 1 − i: 8
  rng = random.Random(2)
  _check(spec.build(256), sorted(spec.vocab), 256, [spec.sample(rng, n) for n in (256, 255, 100, 1)])


# every input over {a, b, c} up to length 4, and every 7th of length 6
ABC_INPUTS = ([list(x) for n in range(1, 5) for x in itertools.product("abc", repeat=n)]
              + [list(x) for x in itertools.product("abc", repeat=6)][::7])


def _check_abc_both_ways(program):
  """:func:`_check` at N = 6 on :data:`ABC_INPUTS`, non-causal then causal; returns the causal model."""
  for causal in (False, True):
    model = _check(program, list("abc"), 6, ABC_INPUTS, causal)
  return model


def _widths_of_sort_keys():
  x = rasp.Map(lambda t: {"a": 1, "b": 2, "c": 3}[t], rasp.tokens).named("x")
  for pred in (C.LT, C.LEQ, C.GT, C.GEQ):
    key = rasp.SequenceMap(lambda k, i: k + i / 8, x, rasp.indices).named("key")   # lexicographic: split
    yield rasp.SelectorWidth(rasp.Select(key, key, pred)).named(f"w_{pred.name}")
  key = rasp.SequenceMap(lambda i, k: k - i / 8, rasp.indices, x).named("key_rev")  # indices first, decreasing
  yield rasp.SelectorWidth(rasp.Select(key, key, C.LT)).named("w_rev")
  key = rasp.SequenceMap(lambda k, i: k + i / 2, x, rasp.indices).named("key_overlap")  # overlap: not split
  yield rasp.SelectorWidth(rasp.Select(key, key, C.LT)).named("w_overlap")


@pytest.mark.parametrize("k", range(6))
def test_width_over_a_lexicographic_key_equals_the_interpreter(k):
  model = _check_abc_both_ways(list(_widths_of_sort_keys())[k])
  split = any(name.endswith(":major") for name in model.meta["residual"])
  assert split == (k < 5)


def test_sort_freq_compiles_at_n80_without_the_key_one_hot():
  spec = PROGRAMS["sort_freq"]
  rng = random.Random(3)
  inputs = [spec.sample(rng, n) for n in (80, 79, 33, 1)]
  model = _check(spec.build(80), sorted(spec.vocab, key=repr), 80, inputs)
  assert model.num_params < 5_000_000   # with the one-hot of −hist + i/N (N² values): 184M


def _or_widths():
  hist = lib.make_hist()
  earlier = rasp.Select(rasp.indices, rasp.indices, C.LT)
  tie_break = rasp.Select(hist, hist, C.GT) | (rasp.Select(hist, hist, C.EQ) & earlier)
  rank = rasp.SelectorWidth(tie_break).named("rank")   # disjoint terms: split into two widths
  yield rasp.Aggregate(rasp.Select(rank, rasp.indices, C.EQ), rasp.tokens).named("most_frequent_first")
  three = (rasp.Select(rasp.tokens, rasp.tokens, C.LT) | rasp.Select(rasp.tokens, rasp.tokens, C.GT)
           | (rasp.Select(rasp.tokens, rasp.tokens, C.EQ) & rasp.Select(rasp.indices, rasp.indices, C.GT)))
  yield rasp.SelectorWidth(three).named("three_terms")
  overlap = rasp.Select(hist, hist, C.GEQ) | rasp.Select(rasp.indices, rasp.indices, C.LT)   # not disjoint
  yield rasp.SelectorWidth(overlap).named("overlap")


@pytest.mark.parametrize("k", range(3))
def test_width_of_a_disjoint_or_equals_the_interpreter(k):
  model = _check_abc_both_ways(list(_or_widths())[k])
  assert any(":or[" in name for name in model.meta["residual"]) == (k < 2)


def test_most_frequent_first_is_small_at_n40():
  program = next(_or_widths())
  rng = random.Random(4)
  inputs = [[rng.choice("abc") for _ in range(n)] for n in (40, 39, 17, 1)]
  assert _check(program, list("abc"), 40, inputs).num_params < 1_000_000   # the product one-hot: 35M


def test_a_large_pair_table_is_refused_before_its_units_are_built():
  # (a + 2b) mod 97 is not affine: a table of 200 × 200 pair units, refused from its unit count alone
  table = rasp.SequenceMap(lambda a, b: (a + 2 * b) % 97, rasp.indices, rasp.indices).named("table")
  with pytest.raises(ValueError, match=r"at least [\d,]+ parameters .*max_params=1,000,000"):
    rasp.compile(table, list("ab"), 200, max_params=1_000_000)


def test_an_mlp_only_chain_takes_one_layer():
  program = lib.make_kparity(tuple(range(10)))   # 10 single-position heads, then 9 XORs in a chain
  model = rasp.compile(program, [0, 1], 12)
  assert model.num_layers == 1   # one layer per XOR: 9
  inputs = [list(x) for n in range(1, 11) for x in itertools.product([0, 1], repeat=n)][::5]
  for causal in (False, True):
    _check(program, [0, 1], 12, inputs, causal)


def test_a_fused_chain_reads_negative_residual_numbers_and_earlier_stages():
  step = rasp.numerical(rasp.Map(lambda t: -1 if t == "a" else 2, rasp.tokens)).named("step")
  prefix = rasp.Select(rasp.indices, rasp.indices, C.LEQ)
  mean = rasp.numerical(rasp.Aggregate(prefix, step, default=0)).named("mean")    # negative at times
  positive = rasp.Map(lambda x: x > 0, mean).named("positive")                    # stage 0
  signed = rasp.numerical(rasp.SequenceMap(lambda p, x: x if p else -x, positive, mean)).named("signed")
  program = rasp.Map(lambda v: round(v * 6), signed).named("scaled")              # stages 1, 2
  inputs = [list(x) for n in range(1, 6) for x in itertools.product("ab", repeat=n)]
  for causal in (False, True):
    model = _check(program, list("ab"), 6, inputs, causal)
  assert model.num_layers == 2


def test_selectors_reading_the_same_sops_share_one_product():
  """An Or over `(tokens, indices)` read by two Aggregates, and one whose keys and queries are the same SOps
  in another order: one tuple SOp `(tokens, indices)` serves every keys and queries side (four before)."""
  x, i = rasp.tokens, rasp.indices
  sel = rasp.Select(x, x, C.LT) | rasp.Select(i, i, C.EQ)
  crossed = rasp.Select(i, x, C.GT) | rasp.Select(x, i, C.LT)   # keys (i, x), queries (x, i): the same tuple
  a = rasp.numerical(rasp.Aggregate(sel, rasp.numerical(rasp.Map(lambda t: t / 4, x)), default=0)).named("a")
  b = rasp.numerical(rasp.Aggregate(sel, rasp.numerical(rasp.Map(lambda t: t / 2, x)), default=0)).named("b")
  eighth = rasp.numerical(rasp.Map(lambda t: t / 8, x))
  c = rasp.numerical(rasp.Aggregate(crossed, eighth, default=0)).named("c")
  program = rasp.numerical(rasp.LinearSequenceMap(rasp.numerical(rasp.LinearSequenceMap(a, b, 1, 1)), c, 1, 1))
  vocab = [1, 2, 3, 4]
  inputs = [list(t) for n in range(1, 5) for t in itertools.product(vocab, repeat=n)][::3]
  for causal in (False, True):
    model = _check(program, vocab, 6, inputs, causal)
  split = [name.rsplit(":", 1) for name in model.meta["residual"]]
  tuple_sops = {parts[0] for parts in split if parts[-1].startswith("(")}
  assert tuple_sops == {"(tokens, indices)"}
