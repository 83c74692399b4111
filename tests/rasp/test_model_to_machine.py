"""A compiled RASP model run on the universal simulator's machine (`jaxmem.rasp.model_to_machine`): the
same program of AHAT, linear and ReLU layers U is built from decodes what the interpreter computes, causal
and not."""

from __future__ import annotations

import itertools

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


@pytest.mark.parametrize("name,causal", CASES)
def test_a_compiled_model_on_the_machine_equals_the_interpreter(name, causal):
  spec = PROGRAMS[name]
  program = spec.build(N)
  model = rasp.compile(program, spec.vocab, N, causal=causal)
  machine = to_machine(model)
  kinds = {type(layer) for layer in machine.program.layers}
  assert kinds <= {AHATLayer, LinearLayer, UnaryLayer}
  assert all(layer.op == "relu" for layer in machine.program.layers if isinstance(layer, UnaryLayer))
  ahat = [layer for layer in machine.program.layers if isinstance(layer, AHATLayer)]
  assert len(ahat) == sum(h > 0 for h in model.heads_per_layer) and all(a.causal == causal for a in ahat)
  xs = [x for x in _inputs(spec.vocab) if spec.accepts(x, max_seq_len=N)]
  want = [conformance.interpret(program, x, causal=causal) for x in xs]
  got = machine.apply_batch(xs)
  assert got == model.apply_batch(xs)
  for x, w, g in zip(xs, want, got, strict=True):
    ok, _ = conformance.agree(model.meta["output"]["encoding"], w, g)
    assert ok, (x, w, g)


def test_to_machine_refuses_what_is_not_a_compiled_model():
  with pytest.raises(ValueError, match="`model` must be a CompiledModel"):
    to_machine(PROGRAMS["reverse"].build(N))


def test_constant_maps_run_on_the_machine():
  """An MLP with no hidden units (its Maps write only None or 0.0) made an empty slot, and a
  dimension no layer writes was 'read before any layer writes' it (4 of 149 fuzzed models)."""
  zero = rasp.numerical(rasp.Map(lambda t: 0, rasp.tokens))
  programs = [rasp.Map(lambda t: None, rasp.tokens),
              rasp.numerical(rasp.Map(lambda t: 0.0, rasp.tokens)),
              rasp.numerical(rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.LEQ), zero,
                                            default=0))]
  xs = _inputs("ab")
  for program in programs:
    model = rasp.compile(program, list("ab"), N)
    got = to_machine(model).apply_batch(xs)
    assert got == model.apply_batch(xs)
    for x, g in zip(xs, got, strict=True):
      assert conformance.agree(model.meta["output"]["encoding"], rasp.evaluate(program, x), g)[0], (x, g)
