"""jaxmem.rasp as a drop-in for tracr: tracr's public names, ``compile_rasp_to_model`` with
tracr's signature and model fields, causal compilation, and tracr's own ``lib.py`` programs
(loaded unchanged from an installed tracr-pypi but for the import line; skipped without it)
compiled == interpreted exactly, causal and not: every input of length <= 4 and random ones
of length 5, at N = 5.

Then the value rules, each with the program that was wrong before: values equal
in Python share a slot; a numerical Map of a maybe-None value is refused; a Map of a float
mean that flips within the interpreter's rounding is refused; functions raising on
unreachable inputs compile; where the interpreter raises the model raises; ``True`` is not
the token ``1``.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import random
import re

import pytest

from jaxmem import rasp
from jaxmem.rasp import conformance

C = rasp.Comparison
N = 5


def _tracr_lib():
  if importlib.util.find_spec("tracr") is None:
    pytest.skip("tracr-pypi is not installed (pip install tracr-pypi==1.0.0)")
  return conformance.tracr_lib()


def _inputs(vocab, seed=0):
  out = [list(x) for n in range(1, 5) for x in itertools.product(vocab, repeat=n)]
  rng = random.Random(seed)
  return out + [[rng.choice(vocab) for _ in range(N)] for _ in range(30)]


@functools.cache
def _compiled(name, causal):
  progs = conformance.tracr_programs(_tracr_lib(), N)
  build, vocab = progs[name]
  program = build()
  model = rasp.compile_rasp_to_model(program, set(vocab), N, causal=causal, compiler_bos="BOS")
  return program, vocab, model


TRACR_NAMES = ["length", "reverse", "hist", "sort_unique", "sort", "sort_freq", "frac_prevs", "pair_balance",
               "shuffle_dyck", "shuffle_dyck2", "shift_by", "detect_pattern", "count_less_freq", "count",
               "nary_sequencemap"]


def test_the_conformance_suite_runs_every_program_of_tracrs_lib():
  """Every public function of tracr's ``lib.py`` that builds a SOp has an entry in ``tracr_programs`` (and so in
  ``TRACR_NAMES``): a program tracr adds cannot go untested."""
  lib = _tracr_lib()
  funcs = {n for n, f in vars(lib).items()
           if callable(f) and not n.startswith("_") and getattr(f, "__module__", None) == lib.__name__}
  covered = {"make_" + n if hasattr(lib, "make_" + n) else n for n in TRACR_NAMES}
  assert funcs == covered, sorted(funcs ^ covered)
  assert set(conformance.tracr_programs(lib, N)) == set(TRACR_NAMES)


def test_every_public_name_of_tracrs_rasp_module_exists():
  spec = importlib.util.find_spec("tracr")
  if spec is None:
    pytest.skip("tracr-pypi is not installed (pip install tracr-pypi==1.0.0)")
  text = open(importlib.util.find_spec("tracr.rasp.rasp").origin, encoding="utf-8").read()
  names = set(re.findall(r"^(?:class|def) ([A-Za-z]\w*)", text, re.M))
  names |= set(re.findall(r"^([A-Za-z]\w*)(?::[^=]*)? = ", text, re.M))
  missing = sorted(n for n in names if not hasattr(rasp, n))
  assert not missing, missing


def test_tracr_names_and_meanings():
  """Without tracr installed: the names tracr programs use most, with tracr's meaning."""
  for n in ("Value", "NumericValue", "SelectorValue", "Predicate", "DefaultRASPEvaluator",
            "RASPEvaluator", "DEFAULT_ANNOTATORS", "default_name", "default_encoding"):
    assert hasattr(rasp, n), n
  ev = rasp.DefaultRASPEvaluator()
  assert ev.evaluate(rasp.tokens + 1, [1, 2]) == [2, 3]
  assert rasp.Map(lambda x: x, rasp.tokens).annotations["encoding"] is rasp.Encoding.CATEGORICAL
  assert rasp.numerical(rasp.tokens).annotations["encoding"] is rasp.Encoding.NUMERICAL


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", TRACR_NAMES)
def test_tracr_lib_program_compiled_equals_interpreted(name, causal):
  program, vocab, model = _compiled(name, causal)
  inputs = _inputs(vocab)
  got = conformance.outputs(model.compiled, inputs)
  bad = []
  for xs, g in zip(inputs, got, strict=True):
    want = conformance.interpret(program, xs, causal)
    ok = want is g if conformance.RAISED in (want, g) else \
        conformance.agree(model.compiled.meta["output"]["encoding"], want, g, atol=1e-6)[0]
    if not ok:
      bad.append((xs, want, g))
  assert not bad, f"{name} causal={causal}: {len(bad)}/{len(inputs)} wrong, e.g. {bad[:2]}"
  # the tracr interface on one input
  xs = inputs[-1]
  want = conformance.interpret(program, xs, causal)
  if want is not conformance.RAISED:
    out = model.apply(["BOS"] + xs)
    assert out.decoded[0] == "BOS"
    assert conformance.agree(model.compiled.meta["output"]["encoding"], want, out.decoded[1:])[0]


def test_compile_rasp_to_model_has_tracrs_fields_and_behaviour():
  reverse = rasp.Aggregate(rasp.Select(rasp.indices, rasp.SelectorWidth(rasp.Select(
      rasp.tokens, rasp.tokens, C.TRUE)) - rasp.indices - 1, C.EQ), rasp.tokens).named("reverse")
  model = rasp.compile_rasp_to_model(reverse, {"a", "b", "c"}, 5)
  out = model.apply(["compiler_bos", "a", "b", "c"])
  assert out.decoded == ["compiler_bos", "c", "b", "a"]
  L, d = model.compiled.num_layers, len(model.residual_labels)
  assert len(out.residuals) == len(out.layer_outputs) == 2 * L and len(out.attn_logits) == L
  assert all(r.shape == (1, 4, d) for r in out.residuals) and out.transformer_output.shape == (1, 4, d)
  assert out.attn_logits[-1].shape[::2] == (1, 4) and out.attn_logits[-1].shape[-1] == 4
  assert (out.residuals[0] - out.input_embeddings == out.layer_outputs[0]).all()
  assert model.input_encoder.bos_token == "compiler_bos" and model.input_encoder.pad_token == "compiler_pad"
  assert sorted(model.output_encoder.encoding_map) == ["a", "b", "c"]
  assert model.model_config.num_layers == L and not model.model_config.causal
  # padding at the end: masked, decoded as None
  assert model.apply(["compiler_bos", "a", "b", "compiler_pad"]).decoded == ["compiler_bos", "b", "a", None]
  with pytest.raises(ValueError, match="`tokens` must start with the BOS"):
    model.apply(["a", "b"])
  with pytest.raises(ValueError, match="pad token"):
    model.apply(["compiler_bos", "compiler_pad", "a"])
  with pytest.raises(ValueError, match="compiler_pad"):
    rasp.compile_rasp_to_model(reverse, {"a", "compiler_pad"}, 5)
  with pytest.raises(ValueError, match="mlp_exactness"):
    rasp.compile_rasp_to_model(reverse, {"a"}, 5, mlp_exactness=0)


def test_causal_compilation_equals_the_causal_interpreter():
  """Every head sees the positions at or before its query (BOS always): ``length`` is the
  visible length, a mean over all positions a running mean."""
  length = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, C.TRUE)).named("length")
  frac = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, C.TRUE),
                                       rasp.numerical(rasp.tokens == "a"), default=0)).named("frac")
  prev_or_none = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices + 1, C.EQ), rasp.tokens).named("next")
  for program, want in ((length, [1, 2, 3]), (frac, [1, 0.5, 2 / 3]), (prev_or_none, [None, None, None])):
    model = rasp.compile(program, list("ab"), 4, causal=True)
    assert rasp.evaluate(program, list("aba"), causal=True) == want
    for xs in _inputs(list("ab"))[:30]:
      got, exp = model.apply(xs), rasp.evaluate(program, xs, causal=True)
      assert conformance.agree(model.meta["output"]["encoding"], exp, got)[0], (program.label, xs, got, exp)
  assert rasp.compile(length, list("ab"), 4).apply(list("aba")) == [3, 3, 3]


# ----------------------------------------------------------------------------- value rules (B)


def test_zero_and_zero_point_zero_share_a_slot():
  """``x / n if n > 0 else 0`` takes 0 and 0.0: equal in Python, one one-hot slot."""
  n = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.indices, lambda k, q: k == "a" and True)).named("n")
  x = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, C.EQ)).named("x")
  ratio = rasp.SequenceMap(lambda a, b: a / b if b > 0 else 0, x, n).named("ratio")
  out = rasp.Map(lambda r: r < 0.5, ratio).named("small")
  model = rasp.compile(out, list("ab"), 4)
  ratios = rasp.compile(ratio, list("ab"), 4)
  for xs in _inputs(list("ab"))[:30]:
    assert model.apply(xs) == rasp.evaluate(out, xs), xs
    assert ratios.apply(xs) == rasp.evaluate(ratio, xs), xs


def test_numerical_map_of_a_maybe_none_value_is_refused():
  """``['a', 'b']``: the interpreter has [None, 11]; a numerical dimension held 0 for None and
  the SequenceMap after it made a value of it."""
  prev = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, lambda k, q: q == k + 1), rasp.tokens)
  num = rasp.numerical(rasp.Map(lambda t: 10 if t == "a" else 20, prev.named("prev"))).named("num")
  out = rasp.SequenceMap(lambda v, i: v + 1, num, rasp.indices).named("out")
  assert rasp.evaluate(out, ["a", "b"]) == [None, 11]
  with pytest.raises(ValueError, match="numerical SOp 'num' .* may be None: it reads 'prev'"):
    rasp.compile(out, list("ab"), 3)


def test_map_flipping_within_the_interpreters_float_rounding_is_refused():
  """``x == 0.1`` of a running mean of 0.1s: the interpreter's float sum gives [T, T, F] on
  'aaa', the exact mean [T, T, T]."""
  x = rasp.numerical(rasp.Map(lambda t: 0.1 if t == "a" else 0.2, rasp.tokens)).named("x")
  prevs = rasp.Select(rasp.indices, rasp.indices, C.LEQ)
  mean = rasp.numerical(rasp.Aggregate(prevs, x, default=0)).named("mean")
  assert rasp.evaluate(mean == 0.1, list("aaa")) == [True, True, False]
  with pytest.raises(ValueError, match="within the float rounding"):
    rasp.compile(rasp.Map(lambda m: m == 0.1, mean).named("is_tenth"), list("ab"), 3)
  # a threshold away from every mean compiles, and is exact
  big = rasp.Map(lambda m: m > 0.12, mean).named("big")
  model = rasp.compile(big, list("ab"), 3)
  for xs in _inputs(list("ab"))[:14]:
    assert model.apply(xs) == rasp.evaluate(big, xs), xs


def test_function_raising_on_unreachable_pairs_compiles():
  """``1 / (n − i)`` with n the length, i the index: n = i never occurs (tracr treats the
  ZeroDivisionError as unreachable too)."""
  length = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, C.TRUE)).named("length")
  inv = rasp.numerical(rasp.SequenceMap(lambda n, i: 1 / (n - i), length, rasp.indices)).named("inv")
  model = rasp.compile(inv, list("ab"), 5)
  for xs in _inputs(list("ab"))[:30]:
    assert model.apply(xs) == rasp.evaluate(inv, xs), xs
  assert model.apply(list("aba")) == [1 / 3, 0.5, 1.0]


def test_model_raises_where_the_interpreter_raises():
  """A Comparison on a None key raises in the interpreter ('key is None!'); the compiled head
  matched nothing and returned the default."""
  prev = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, lambda k, q: q == k + 1), rasp.tokens)
  same = rasp.Aggregate(rasp.Select(prev.named("prev"), rasp.tokens, C.EQ), rasp.indices, default=0)
  model = rasp.compile(rasp.numerical(same).named("same"), list("ab"), 3)
  with pytest.raises(ValueError, match="key is None"):
    rasp.evaluate(same, list("ab"))
  with pytest.raises(ValueError, match="'prev' is None at position 0"):
    model.apply(list("ab"))


def test_apply_refuses_true_for_the_token_1():
  model = rasp.compile(rasp.Map(lambda t: t + 1, rasp.tokens), [1, 2], 3)
  assert model.apply([1, 2]) == [2, 3]
  with pytest.raises(ValueError, match=r"input token True \(bool\) at position 1"):
    model.apply([1, True])


def test_numerical_mean_of_a_numerical_map_returning_none_is_refused():
  """A numerical Map that returns None, averaged by the output Aggregate: the interpreter raises on ``['a',
  'b']`` (a mean of None and 1); a numerical dimension holds 0 for None, so the model returned 0.5."""
  x = rasp.numerical(rasp.Map(lambda t: None if t == "a" else 1, rasp.tokens)).named("x")
  out = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.TRUE), x,
                                      default=0)).named("mean")
  with pytest.raises(ValueError):
    rasp.evaluate(out, ["a", "b"])
  with pytest.raises(ValueError, match="numerical SOp 'x' .* may be None: its function returns None"):
    rasp.compile(out, ["a", "b"], 4)
