"""A compiled RASP model run on the universal simulator's machine (`jaxmem.rasp.model_to_machine`): the
same program of AHAT, linear and ReLU layers U is built from decodes what the interpreter computes, causal
and not."""

from __future__ import annotations

import itertools
import random

import pytest

from jaxmem import rasp
from jaxmem.machine import AHATLayer, LinearLayer, UnaryLayer
from jaxmem.rasp import conformance
from jaxmem.rasp.model_to_machine import to_machine
from jaxmem.rasp.programs import PROGRAMS

N = 5
CASES = [("reverse", False), ("reverse", True), ("frac_prevs", False), ("kparity", False)]


def _inputs(vocab):
  vocab = sorted(vocab, key=repr)
  return [list(x) for n in range(1, 4) for x in itertools.product(vocab, repeat=n)] + \
      [[vocab[(i * 7 + n) % len(vocab)] for i in range(n)] for n in (4, 5)]


def _assert_machine_agrees(program, vocab, model, causal=False, max_seq_len=N, accepts=lambda x: True):
  """The machine decodes what the NNX model decodes, and what the interpreter computes."""
  machine = to_machine(model)
  kinds = {type(layer) for layer in machine.program.layers}
  assert kinds <= {AHATLayer, LinearLayer, UnaryLayer}
  assert all(layer.op == "relu" for layer in machine.program.layers if isinstance(layer, UnaryLayer))
  ahat = [layer for layer in machine.program.layers if isinstance(layer, AHATLayer)]
  assert len(ahat) == sum(h > 0 for h in model.heads_per_layer) and all(a.causal == causal for a in ahat)
  xs = [x for x in _inputs(vocab) if len(x) <= max_seq_len and accepts(x)]
  want = [conformance.interpret(program, x, causal=causal) for x in xs]
  got = machine.apply_batch(xs)
  assert got == model.apply_batch(xs)
  for x, w, g in zip(xs, want, got, strict=True):
    ok, _ = conformance.agree(model.meta["output"]["encoding"], w, g)
    assert ok, (x, w, g)
  return machine


@pytest.mark.parametrize("name,causal", CASES)
def test_a_compiled_model_on_the_machine_equals_the_interpreter(name, causal):
  spec = PROGRAMS[name]
  program = spec.build(N)
  model = rasp.compile(program, spec.vocab, N, causal=causal)
  _assert_machine_agrees(program, spec.vocab, model, causal, accepts=lambda x: spec.accepts(x, max_seq_len=N))


def _constant_programs():
  """MLPs that compute a constant (4 of 149 fuzzed programs failed to_machine on them): a Map whose value
  encodes to nothing (numerical 0, categorical None) is an MLP with no hidden unit; its dimension is never
  written, and an Aggregate reads it; constant Maps inside a bigger program; two SelectorWidths of one
  label share a scratch dimension's name."""
  same = rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.EQ)
  zero = rasp.numerical(rasp.Map(lambda x: 0.0, rasp.tokens))
  w1 = rasp.numerical(rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.LEQ))).named("w")
  w2 = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.LT)).named("w")
  return {
      "numerical_zero": zero,
      "categorical_none": rasp.categorical(rasp.Map(lambda x: None, rasp.tokens)),
      "aggregate_of_zero": rasp.numerical(rasp.Aggregate(same, zero, default=0)),
      "aggregate_of_constant": rasp.numerical(rasp.Aggregate(
          same, rasp.numerical(rasp.Map(lambda x: 2.0, rasp.tokens)), default=0)),
      "categorical_constant": rasp.categorical(rasp.Map(lambda x: 1, rasp.tokens)),
      "same_named_widths": rasp.numerical(rasp.SequenceMap(lambda a, b: a + b, w1, w2)),
  }


@pytest.mark.parametrize("name", list(_constant_programs()))
def test_constant_maps_run_on_the_machine(name):
  program = _constant_programs()[name]
  model = rasp.compile(program, {1, 2, 3}, N)
  _assert_machine_agrees(program, {1, 2, 3}, model)


@pytest.mark.parametrize("name,n", [("sort", 40), ("reverse", 40), ("hist", 20)])
def test_the_machine_stores_no_more_parameters_than_the_compiled_model(name, n):
  """The machine's AHAT layers hold the compiled heads' matrices over the compiled residual (their span),
  and each MLP matrix is one block (its bias one more row); hidden units that are always 0 are left out,
  and the embeddings stay with the compiled model. So the machine stores at most the compiled model's
  parameters (a dense [width, width] matrix per linear layer stored 36-68x as many: sort at N = 40,
  156k -> 10.6M)."""
  spec = PROGRAMS[name]
  model = rasp.compile(spec.build(n), spec.vocab, n)
  machine = to_machine(model)
  assert machine.program.num_params <= model.num_params
  if name == "sort":   # and runs at that size as the compiled model does
    rng = random.Random(0)
    xs = [spec.sample(rng, n), spec.sample(rng, n // 2)]
    assert all(spec.accepts(x, max_seq_len=n) for x in xs)
    assert machine.apply_batch(xs) == model.apply_batch(xs)


def test_to_machine_refuses_what_is_not_a_compiled_model():
  with pytest.raises(ValueError, match="`model` must be a CompiledModel"):
    to_machine(PROGRAMS["reverse"].build(N))



def test_the_machine_adds_each_mlp_bias_after_its_product_as_the_model_does():
  """Fuzz program 4247: ``0.5 · width + length`` fused with the width's clean-up. With each MLP bias
  folded into the machine's matrix as a row of ``one``, a one-hot of ``length`` came out 1.000001 and the
  output 4.000044 at length 4, where the model (``h @ W + b``) gives 4.0 exactly."""
  width = rasp.SelectorWidth(rasp.Select(rasp.length, rasp.length, rasp.Comparison.LT))
  program = rasp.numerical(rasp.SequenceMap(lambda x, y: 0.5 * x + y, width, rasp.length))
  model = rasp.compile(program, [True, False], 7)
  xs = [[True] * n for n in range(1, 8)]
  assert to_machine(model).apply_batch(xs) == model.apply_batch(xs) == [[float(n)] * n for n in range(1, 8)]
