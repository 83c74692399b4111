"""The RASP compiler: compiled == interpreted, exactly, on every input of small sizes and on
many random inputs at the lengths where tracr's soft attention fails; its invariants (BOS
holds no SOp value, scores are integers and half-integers); its export; its errors.

The reference is :func:`jaxmem.rasp.evaluate` (tracr's semantics), itself checked against
plain-Python functions in ``test_lib.py``; for the tracr failure cases also against the
plain-Python answer directly. Numerical outputs: within 1e-6, with the interpreter's None
(an empty selection with default None) read as 0 and bools as 0/1.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from jaxmem import rasp
from jaxmem.rasp import conformance

C = rasp.Comparison


def _length():
  return rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, C.TRUE)).named("length")


def _reverse():
  opp = (_length() - rasp.indices).named("opp_idx")
  opp = (opp - 1).named("opp_idx-1")
  return rasp.Aggregate(rasp.Select(rasp.indices, opp, C.EQ), rasp.tokens).named("reverse")


def _frac_prevs():
  bools = rasp.numerical(rasp.tokens == "x").named("is_x")
  prevs = rasp.Select(rasp.indices, rasp.indices, C.LEQ)
  return rasp.numerical(rasp.Aggregate(prevs, bools, default=0)).named("frac_prevs")


def _frac():
  return rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.LEQ),
                                       rasp.numerical(rasp.tokens == "a"), default=0)).named("frac")


def _programs():
  """(name, program, vocab): every construct the compiler has a rule for."""
  frac = _frac()
  same = rasp.Select(rasp.tokens, rasp.tokens, C.EQ)
  before = rasp.Select(rasp.indices, rasp.indices, C.LT)
  prev = rasp.Select(rasp.indices, rasp.indices - 1, C.EQ)
  psum = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.LEQ),
                                       rasp.numerical(rasp.Map(lambda t: {"a": 0, "b": 1, "c": 2}[t],
                                                               rasp.tokens)), default=0)).named("pmean")
  return [
      ("length", _length(), "abc"),
      ("length_primitive", rasp.length - rasp.indices, "ab"),
      ("reverse", _reverse(), "abc"),
      ("frac_prevs", _frac_prevs(), "xy"),
      ("hist", rasp.SelectorWidth(same).named("hist"), "abc"),
      ("numerical_map_of_numerical", rasp.numerical(rasp.Map(lambda x: 3 * x * x - 1, frac)), "ab"),
      ("categorical_map_of_numerical", rasp.Map(lambda x: x > 0.5, frac).named("majority"), "ab"),
      ("numerical_select_keys", rasp.SelectorWidth(rasp.Select(frac, frac, C.EQ)).named("w"), "ab"),
      ("and", rasp.SelectorWidth(same & before).named("and"), "abc"),
      ("or", rasp.SelectorWidth(rasp.Or(same, before)).named("or"), "abc"),
      ("not_and", rasp.SelectorWidth(rasp.Not(rasp.And(same, before))).named("nand"), "abc"),
      ("not_select", rasp.SelectorWidth(~same).named("not_same"), "abc"),
      ("default_categorical", rasp.Aggregate(prev, rasp.tokens, default="z").named("prev"), "abc"),
      ("default_then_map", rasp.Map(str.upper, rasp.Aggregate(prev, rasp.tokens, default="z")), "abc"),
      ("default_numerical", rasp.numerical(rasp.Aggregate(prev, rasp.numerical(rasp.Map(
          lambda t: ord(t) - 96, rasp.tokens)), default=7)).named("prevn"), "abc"),
      ("numerical_x_numerical", rasp.SequenceMap(lambda x, y: round(x * y, 6) >= 0.25, psum,
                                                 rasp.numerical(rasp.Map(lambda x: x, frac))), "abc"),
      ("numerical_x_categorical", rasp.SequenceMap(lambda x, i: int(round(x * (i + 1))), psum,
                                                   rasp.indices).named("running_sum"), "abc"),
      ("linear_sequence_map", rasp.numerical(rasp.LinearSequenceMap(psum, frac, 2.0, -0.5)), "abc"),
      ("full", rasp.SequenceMap(lambda a, b: a + b, rasp.tokens, rasp.Full("!")), "ab"),
      ("numerical_aggregate_of_categorical", rasp.numerical(rasp.Aggregate(
          rasp.Select(rasp.indices, rasp.indices, C.GEQ), rasp.Map(lambda t: t == "a", rasp.tokens))), "ab"),
      ("sort_unique", rasp.Aggregate(rasp.Select(rasp.SelectorWidth(rasp.Select(
          rasp.tokens, rasp.tokens, C.LT)), rasp.indices, C.EQ), rasp.tokens).named("sort"), "abcd"),
  ]


def _mismatches(model, program, inputs):
  got = model.apply_batch(inputs)
  bad = []
  for xs, g in zip(inputs, got, strict=True):
    want = rasp.evaluate(program, xs)
    ok, _ = conformance.agree(model.meta["output"]["encoding"], want, g)
    if not ok:
      bad.append((xs, want, g))
  return bad


@pytest.mark.parametrize("name,program,vocab", _programs(), ids=[p[0] for p in _programs()])
def test_compiled_equals_interpreted_on_every_small_input(name, program, vocab):
  N = 5
  model = rasp.compile(program, list(vocab), N)
  inputs = [list(x) for n in range(1, N + 1) for x in itertools.product(vocab, repeat=n)]
  bad = _mismatches(model, program, inputs)
  assert not bad, f"{name}: {len(bad)} of {len(inputs)} wrong, e.g. {bad[:2]}"


@pytest.mark.parametrize("name,program,vocab", _programs()[:8], ids=[p[0] for p in _programs()[:8]])
def test_compiled_equals_interpreted_on_random_inputs_up_to_length_16(name, program, vocab):
  N = 16
  model = rasp.compile(program, list(vocab), N)
  rng = random.Random(0)
  inputs = [[rng.choice(vocab) for _ in range(rng.randint(1, N))] for _ in range(300)]
  bad = _mismatches(model, program, inputs)
  assert not bad, f"{name}: {len(bad)} wrong, e.g. {bad[:2]}"


def test_tracr_failure_cases_are_exact_here():
  """tracr's default soft attention gets ``length`` and ``reverse`` wrong at N = 10 and 71 of
  2,081 ``frac_prevs`` outputs wrong at N = 80 (docs/papers/simulator.md)."""
  rng = random.Random(1)
  for make, N in ((_length, 10), (_reverse, 10)):
    model = rasp.compile(make(), list("abc"), N)
    inputs = [[rng.choice("abc") for _ in range(n)] for n in range(1, N + 1) for _ in range(30)]
    got = model.apply_batch(inputs)
    for xs, g in zip(inputs, got, strict=True):
      assert g == ([len(xs)] * len(xs) if make is _length else xs[::-1])
  model = rasp.compile(_frac_prevs(), list("xy"), 80)
  inputs = [[rng.choice("xy") for _ in range(rng.randint(1, 80))] for _ in range(200)]
  inputs.append(list("x" * 80))
  worst = 0.0
  for xs, g in zip(inputs, model.apply_batch(inputs), strict=True):
    want = [sum(t == "x" for t in xs[: i + 1]) / (i + 1) for i in range(len(xs))]
    worst = max(worst, max(abs(a - b) for a, b in zip(want, g, strict=True)))
  assert worst <= 1e-6


def test_sizes_are_within_tracr_at_n5():
  """Residual width and parameters at N = 5 against tracr's published sizes."""
  for make, vocab, (width, params) in ((_length, [1, 2, 3], (19, 912)),
                                       (_reverse, [1, 2, 3], (43, 18_600)),
                                       (_frac_prevs, ["x", "y"], (14, 840))):
    m = rasp.compile(make(), vocab, 5)
    assert m.residual_width <= width and m.num_params <= params, (m.summary(), width, params)


def test_bos_holds_no_sop_value_and_scores_are_half_integers():
  """The invariant the BOS default rests on: after every layer, every SOp dimension is
  exactly 0 at the BOS position (scratch ``1/(w+1)`` dims excepted; inside a layer a
  non-zero default sits at BOS until the layer's MLP removes it)."""
  for name, program, vocab in _programs():
    model = rasp.compile(program, list(vocab), 6)
    tr = model.trace(list(vocab[: 3]) * 2)
    sop_dims = [i for i, n in enumerate(tr["names"]) if n not in ("one", "bos")
                and not n.endswith(":1/(w+1)")]
    for r in tr["residuals"][::2]:
      assert np.all(r[0, sop_dims] == 0.0), name
    for layer in model._layers_np:
      if "heads" in layer:
        for w in ("wq", "wk"):
          assert np.all(np.asarray(layer["heads"][w]) * 2 == np.round(np.asarray(layer["heads"][w]) * 2))


def test_attention_maps_of_reverse_are_the_anti_diagonal():
  model = rasp.compile(_reverse(), list("abc"), 8)
  tr = model.trace(list("abcab"))
  att = tr["attention"][model.num_layers - 1][0]   # the reverse head, BOS at row/col 0
  n = 5
  assert np.array_equal(att[1:, 1:], np.eye(n)[::-1])
  assert tr["heads"][model.num_layers - 1] == ["reverse"]


def test_apply_with_and_without_bos():
  model = rasp.compile(_reverse(), list("abc"), 6)
  assert model.apply(list("abc")) == list("cba")
  assert model.apply(["BOS"] + list("abc")) == ["BOS"] + list("cba")
  assert model.apply([]) == []


def test_export_and_load_round_trip(tmp_path):
  for make, vocab in ((_reverse, list("abc")), (_frac_prevs, list("xy"))):
    model = rasp.compile(make(), vocab, 7)
    path = model.export(tmp_path / "w.npz")
    with np.load(path) as z:
      assert "embed/token" in z.files and "layer0/mlp/w0" in z.files and "meta" in z.files
      assert z["embed/token"].shape == (len(vocab) + 1, model.residual_width)
    loaded = rasp.load(path)
    assert loaded.num_params == model.num_params and loaded.num_layers == model.num_layers
    xs = [[random.Random(i).choice(vocab) for _ in range(1 + i % 7)] for i in range(40)]
    assert loaded.apply_batch(xs) == model.apply_batch(xs)
    for k, v in model.arrays().items():
      assert np.array_equal(loaded.arrays()[k], v)


def test_numpy_forward_from_exported_arrays_matches(tmp_path):
  """The documented .npz layout is enough to run the model without jaxmem."""
  model = rasp.compile(_reverse(), list("abc"), 6)
  z = np.load(model.export(tmp_path / "w.npz"))
  import json
  meta = json.loads(str(z["meta"]))
  xs = list("abcba")
  ids = [len(meta["vocab"])] + [meta["vocab"].index(t) for t in xs]
  x = z["embed/token"][ids] + z["embed/position"][: len(ids)]
  for i, info in enumerate(meta["layers"]):
    if f"layer{i}/attn/wq" in z.files:
      q = np.einsum("td,hdk->htk", x, z[f"layer{i}/attn/wq"])
      k = np.einsum("td,hdk->htk", x, z[f"layer{i}/attn/wk"])
      v = np.einsum("td,hdk->htk", x, z[f"layer{i}/attn/wv"])
      s = np.einsum("htk,hsk->hts", q, k)
      w = (s >= s.max(-1, keepdims=True) - meta["tie_tol"]).astype(float)
      w /= w.sum(-1, keepdims=True)
      x = x + np.einsum("hts,hsk,hkd->td", w, v, z[f"layer{i}/attn/wo"])
    h = x
    for j in range(info["mlp_depth"]):
      h = h @ z[f"layer{i}/mlp/w{j}"] + z[f"layer{i}/mlp/b{j}"]
      if j < info["mlp_depth"] - 1:
        h = np.maximum(h, 0)
    x = x + (h if info["mlp_depth"] else 0)
  dims = meta["output"]["dims"]
  out = [meta["output"]["values"][int(np.argmax(r))] for r in x[1:, dims]]
  assert out == xs[::-1]


def test_reverse_at_n80_is_exact_and_smaller_than_tracr():
  model = rasp.compile(_reverse(), list("abc"), 80)
  assert model.num_params < 26_700_000
  rng = random.Random(2)
  xs = [[rng.choice("abc") for _ in range(n)] for n in (1, 2, 39, 79, 80)]
  assert model.apply_batch(xs) == [x[::-1] for x in xs]


# ----------------------------------------------------------------------------- errors


def test_ill_typed_programs_raise():
  num = rasp.numerical(rasp.Map(lambda t: 1.0, rasp.tokens))
  with pytest.raises(ValueError, match="numerical where categorical is needed"):
    rasp.compile(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.EQ), num), ["a"], 4)
  with pytest.raises(ValueError, match="non-numerical value"):
    rasp.compile(rasp.numerical(rasp.Map(lambda t: t + "!", rasp.tokens)), ["a"], 4)
  with pytest.raises(ValueError, match="cannot be compiled"):
    rasp.compile(rasp.Map(lambda x: x, rasp.ConstantSOp([1, 2])), ["a"], 2)


def test_map_leaving_its_declared_value_set_raises():
  m = rasp.annotate(rasp.Map(lambda t: t * 2, rasp.tokens), value_set={2, 4})
  with pytest.raises(ValueError, match="outside its declared value_set"):
    rasp.compile(m, [1, 2, 3], 4)
  with pytest.raises(ValueError, match="raised ZeroDivisionError"):
    rasp.compile(rasp.Map(lambda t: 1 // t, rasp.tokens), [0, 1], 4)


def test_bad_inputs_at_apply_time_raise():
  model = rasp.compile(_reverse(), list("abc"), 4)
  with pytest.raises(ValueError, match="not in the compiled vocab"):
    model.apply(list("abd"))
  with pytest.raises(ValueError, match="longer than max_seq_len"):
    model.apply(list("abcab"))


def test_bad_compile_arguments_raise():
  for bad in (0, -1, 2.5, True):
    with pytest.raises(ValueError, match="max_seq_len"):
      rasp.compile(_length(), ["a"], bad)
  with pytest.raises(ValueError, match="equals a token in `vocab`"):
    rasp.compile(_length(), ["a", "BOS"], 3)
  with pytest.raises(ValueError, match="vocab"):
    rasp.compile(_length(), [], 3)
  with pytest.raises(ValueError, match="must be a SOp"):
    rasp.compile(rasp.Select(rasp.tokens, rasp.tokens, C.EQ), ["a"], 3)


def test_categorical_mean_of_different_values_is_refused_not_decoded():
  """Averaging different categorical values has no categorical answer: the interpreter
  raises for strings; the compiled model raises at decode instead of guessing."""
  everything = rasp.Aggregate(rasp.Select(rasp.tokens, rasp.tokens, C.TRUE), rasp.tokens)
  model = rasp.compile(everything, list("ab"), 3)
  assert model.apply(list("aa")) == ["a", "a"]
  with pytest.raises(ValueError, match="not one-hot"):
    model.apply(list("ab"))
  with pytest.raises(ValueError, match="differ"):
    rasp.evaluate(everything, list("ab"))


def test_values_too_close_for_float32_are_refused():
  tiny = rasp.numerical(rasp.Map(lambda t: {"a": 0.0, "b": 1e-9}[t], rasp.tokens))
  mean = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.EQ), tiny, default=0))
  with pytest.raises(ValueError, match="float32"):
    rasp.compile(rasp.Map(lambda x: x > 0, mean), list("ab"), 3)


# ----------------------------------------------------------------------------- review findings


def test_nonzero_defaults_read_in_the_same_layer_leave_bos_clean():
  """A numerical default > 1 sits at BOS until its layer's MLP cleans it; an MLP in that layer
  reading the Aggregate must still be off at BOS, or later heads read junk there."""
  prev = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices - 1, C.EQ),
                                       rasp.numerical(rasp.Map(lambda t: ord(t) - 96, rasp.tokens)),
                                       default=5)).named("prev")
  plus = rasp.numerical(rasp.Map(lambda x: x + 1, prev)).named("plus")
  key = rasp.Map(lambda x: "a" if x > 3 else "z", prev).named("key")
  out = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.GT), plus, default=0))
  out2 = rasp.SelectorWidth(rasp.Select(key, rasp.tokens, C.EQ))
  for program in (out.named("out"), out2.named("out2")):
    model = rasp.compile(program, list("abc"), 5)
    inputs = [list(x) for n in range(1, 5) for x in itertools.product("abc", repeat=n)]
    assert not _mismatches(model, program, inputs)


def test_integer_means_are_exact_and_value_sets_unrounded():
  """The mean of fifteen 1989s is 1989 exactly; x >= 1/3 on prefix fractions is decided on
  the exact value sets (no 12-digit rounding)."""
  big = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.LEQ),
                                      rasp.numerical(rasp.Map(lambda t: 1989, rasp.tokens)), default=0))
  assert rasp.compile(big, ["a"], 15).apply(["a"] * 15) == [1989.0] * 15
  third = rasp.Map(lambda x: x >= 1 / 3, _frac()).named("third")
  model = rasp.compile(third, list("ab"), 6)
  inputs = [list(x) for n in range(1, 7) for x in itertools.product("ab", repeat=n)]
  assert not _mismatches(model, third, inputs)


def test_fusion_keeps_none_propagation():
  g = rasp.SequenceMap(lambda t, i: None if i == 0 else t, rasp.tokens, rasp.indices)
  out = rasp.Map(lambda v: "none" if v is None else v, g).named("out")
  model = rasp.compile(out, list("ab"), 3)
  assert model.apply(list("ab")) == rasp.evaluate(out, list("ab")) == [None, "b"]


def test_none_keys_with_custom_predicates_and_numerical_none_defaults_are_refused():
  prev_tok = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices - 1, C.EQ), rasp.tokens)
  with pytest.raises(ValueError, match="may be None"):
    rasp.compile(rasp.SelectorWidth(rasp.Select(rasp.tokens, prev_tok, lambda k, q: True)), ["a"], 3)
  prevn = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices - 1, C.EQ),
                                        rasp.numerical(rasp.Map(lambda t: 1, rasp.tokens))))
  with pytest.raises(ValueError, match="default None and is read"):
    rasp.compile(rasp.numerical(rasp.Map(lambda x: x + 1, prevn)), ["a"], 3)
  assert rasp.compile(prevn, ["a"], 3).apply(["a", "a"]) == [0.0, 1.0]   # as the output: None reads 0


def test_internal_categorical_mixtures_raise_and_types_are_kept():
  agg = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.LEQ), rasp.tokens).named("agg")
  model = rasp.compile(rasp.Map(lambda x: x == 2, agg), [1, 3], 3)
  with pytest.raises(ValueError, match="'agg' at position 1 is not one-hot"):
    model.apply([1, 3])
  assert model.apply([1, 1]) == [False, False]
  one = rasp.Aggregate(rasp.Select(rasp.tokens, rasp.tokens, C.EQ), rasp.Map(lambda t: 1, rasp.tokens))
  s = rasp.Map(str, one)
  assert rasp.compile(s, list("ab"), 4).apply(list("aab")) == rasp.evaluate(s, list("aab")) == ["1"] * 3
  with pytest.raises(ValueError, match="different types"):
    rasp.compile(rasp.Map(lambda t: t, rasp.tokens), [True, 1, 2], 3)
  with pytest.raises(ValueError, match="unhashable"):
    rasp.compile(rasp.Map(lambda t: [t], rasp.tokens), ["a"], 3)
  with pytest.raises(ValueError, match="equals a token"):
    rasp.compile(_length(), [1, 2], 3, compiler_bos=1.0)


def test_export_round_trips_tuples_frozensets_and_returns_the_written_path(tmp_path):
  pair = rasp.SequenceMap(lambda t, i: ((t, i % 2), frozenset(t)), rasp.tokens, rasp.indices)
  model = rasp.compile(pair, list("ab"), 3)
  path = model.export(tmp_path / "noext")
  assert path.endswith("noext.npz")
  assert rasp.load(path).apply(list("ab")) == model.apply(list("ab")) == rasp.evaluate(pair, list("ab"))
  tup = rasp.compile(rasp.Map(lambda t: t, rasp.tokens), [("a", 1), ("b", 2)], 2)
  assert rasp.load(tup.export(tmp_path / "t.npz")).apply([("b", 2)]) == [("b", 2)]
