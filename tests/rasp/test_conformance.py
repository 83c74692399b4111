"""The conformance suite: every program of :data:`jaxmem.rasp.programs.PROGRAMS` compiled once at
N = 40 and compared with the interpreter (:func:`jaxmem.rasp.evaluate`) and with the
program's plain-Python reference on

* every accepted input of length <= 4 (every token of the vocabulary at every position of the
  short inputs, every length-1 input); kparity and kparity_count on every bit string of
  length <= 10, match2 on every input of length <= 5, transpose on every input of its one
  length 6;
* random accepted inputs of *every* length 1..N (three per length), drawn
  with the program's own sampler (balanced and corrupted bracket words for the Dyck programs);
* the constant inputs ``[t] * n`` of every token ``t`` at the shortest and the longest length
  (the extremes of counts, fractions and sums, so the ends of every inferred value set).

N = 40 is the largest length of the suite: the value sets the compiled MLPs discretise
(fractions with denominators <= N, counts <= N) grow with N, so the float32 gaps they must
separate are narrowest there; a model compiled for N also runs every shorter length.
Zero disagreements are allowed: categorical outputs identical, numerical within 1e-6.
The compiled sizes at N = 5 are compared with tracr's published ones.

Each model is compiled once (module cache) and called with one batch shape, so its forward
pass is one XLA compilation.
"""

from __future__ import annotations

import functools
import itertools
import math
import random

import pytest

from jaxmem import rasp
from jaxmem.rasp import conformance, programs

NAMES = sorted(programs.PROGRAMS)
N = 40
EXHAUSTIVE_LEN = {"kparity": 10, "kparity_count": 10, "match2": 5, "transpose": 6}
RANDOM_PER_LENGTH = {}
MAX_CHUNK = 512


def _vocab(spec):
  return sorted(spec.vocab, key=repr)


def _inputs(spec):
  vocab, lengths = _vocab(spec), list(spec.lengths(N))
  ex = EXHAUSTIVE_LEN.get(spec.name, 4)
  exhaustive = [list(x) for n in lengths if n <= ex for x in itertools.product(vocab, repeat=n)
                if spec.accepts(list(x), N)]
  rng = random.Random(N)
  per_length = [spec.sample(rng, n) for n in lengths for _ in range(RANDOM_PER_LENGTH.get(spec.name, 3))]
  constant = [[t] * n for t in vocab for n in (lengths[0], lengths[-1]) if spec.accepts([t] * n, N)]
  return exhaustive, per_length + constant


def _apply(model, inputs):
  """``model.apply_batch`` in equal chunks (the list padded with copies of its first input), so
  the jitted forward sees one batch shape."""
  n_chunks = math.ceil(len(inputs) / MAX_CHUNK)
  chunk = math.ceil(len(inputs) / n_chunks)
  padded = list(inputs) + [inputs[0]] * (n_chunks * chunk - len(inputs))
  return model.apply_batch(padded, chunk=chunk)[: len(inputs)]


@functools.cache
def _checked(name):
  """(spec, exhaustive inputs, all inputs, compiled outputs, interpreted outputs) at N."""
  spec = programs.PROGRAMS[name]
  program = spec.build(N)
  model = rasp.compile(program, _vocab(spec), N)
  exhaustive, extra = _inputs(spec)
  inputs = exhaustive + extra
  return spec, model, exhaustive, inputs, _apply(model, inputs), [rasp.evaluate(program, x) for x in inputs]


def _disagreements(encoding, wants, gots, inputs):
  bad, worst = [], 0.0
  for xs, want, got in zip(inputs, wants, gots, strict=True):
    ok, err = conformance.agree(encoding, want, got)
    worst = max(worst, err)
    if not ok:
      bad.append((xs, want, got))
  return bad, worst


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_compiled_equals_interpreted_and_reference_at_every_length(name):
  spec, model, exhaustive, inputs, got, interpreted = _checked(name)
  assert model.meta["output"]["encoding"] == spec.encoding
  # the inputs cover every accepted length and every token
  assert {len(x) for x in inputs} == set(spec.lengths(N))
  assert {t for x in inputs for t in x} == set(spec.vocab)
  for n in spec.lengths(min(N, EXHAUSTIVE_LEN.get(name, 4))):
    assert sum(len(x) == n for x in exhaustive) == sum(
        spec.accepts(list(x)) for x in itertools.product(_vocab(spec), repeat=n))
  bad, worst = _disagreements(spec.encoding, interpreted, got, inputs)
  assert not bad, f"{name} at N={N}: {len(bad)}/{len(inputs)} inputs disagree, e.g. {bad[:2]}"
  assert worst <= 1e-6
  # and against the plain-Python definition directly, not only the interpreter
  bad, worst = _disagreements(spec.encoding, [spec.reference(x) for x in inputs], got, inputs)
  assert not bad, f"{name} vs its reference: {len(bad)} disagree, e.g. {bad[:2]}"


def test_kparity_and_match2_are_exact_at_every_length_by_construction():
  """No training: the compiled weights solve k-PARITY and Match2 on every input of every
  length up to N (exhaustively up to 10 bits for parity, 5 tokens for Match2)."""
  for name, ex in (("kparity", 10), ("kparity_count", 10), ("match2", 5)):
    spec, model, exhaustive, inputs, got, _ = _checked(name)
    want = sum(len(spec.vocab) ** n for n in range(1, ex + 1))
    assert len(exhaustive) == want and len({tuple(x) for x in exhaustive}) == want
    assert got == [spec.reference(x) for x in inputs]


@pytest.mark.parametrize("name", [n for n in NAMES if programs.PROGRAMS[n].tracr is not None])
@pytest.mark.slow
def test_residual_width_and_params_at_most_tracrs_at_n5(name):
  spec = programs.PROGRAMS[name]
  model = rasp.compile(spec.build(5), _vocab(spec), 5)   # sizes only: no forward pass
  layers, heads, width, params = spec.tracr
  assert model.residual_width <= width, (name, model.residual_width, width)
  assert model.num_params <= params, (name, model.num_params, params)


def test_check_spec_reports_an_exact_check():
  """The library's own entry point (what ``jaxmem compile --check`` and ``rasp_compile`` run)
  counts inputs and disagreements as the suite above does."""
  spec = programs.PROGRAMS["frac_prevs"]
  c = conformance.check_spec(spec, 5, exhaustive_len=3, n_random=20, seed=1)
  assert c.inputs == 2 + 4 + 8 + 20 and c.wrong == 0 and c.max_abs_err <= 1e-6 and c.example is None
  assert (c.name, c.max_seq_len) == ("frac_prevs", 5) and c.params > 0 and c.compile_s > 0
