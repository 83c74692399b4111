"""The conformance suite: every program of :data:`jaxmem.rasp.lib.PROGRAMS` compiled and
compared with the interpreter — on every accepted input of length <= 4 at N = 5, and on
1,000 random inputs of lengths up to N at N = 20 and at N = 40 (2,000+ per program).

Zero disagreements are allowed: categorical outputs identical, numerical within 1e-6.
"""

from __future__ import annotations

import pytest

from jaxmem import rasp
from jaxmem.rasp import conformance, lib

NAMES = sorted(lib.PROGRAMS)


def _assert_exact(c):
  assert c.wrong == 0, (f"{c.name} at N={c.max_seq_len}: {c.wrong}/{c.inputs} inputs disagree, "
                        f"e.g. {c.example}")
  assert c.max_abs_err <= 1e-6


@pytest.mark.parametrize("name", NAMES)
def test_every_small_input(name):
  spec = lib.PROGRAMS[name]
  N = 6 if name == "transpose" else 5   # transpose is defined on length 6 only
  c = conformance.check_spec(spec, N, exhaustive_len=N if name == "transpose" else 4, n_random=100)
  assert c.inputs >= 100
  _assert_exact(c)


@pytest.mark.slow
@pytest.mark.parametrize("N", [20, 40])
@pytest.mark.parametrize("name", NAMES)
def test_random_inputs_up_to_n(name, N):
  c = conformance.check_spec(lib.PROGRAMS[name], N, exhaustive_len=2, n_random=1000, seed=N)
  _assert_exact(c)


@pytest.mark.parametrize("name", [n for n in NAMES if lib.PROGRAMS[n].tracr is not None])
def test_residual_width_and_params_at_most_tracrs_at_n5(name):
  spec = lib.PROGRAMS[name]
  c = conformance.check_spec(spec, 5, exhaustive_len=0, n_random=10)
  layers, heads, width, params = spec.tracr
  assert c.residual_width <= width, (name, c.residual_width, width)
  assert c.params <= params, (name, c.params, params)


def test_kparity_and_match2_are_exact_at_every_length_by_construction():
  """No training: the compiled weights solve k-PARITY and Match2 on every input of every
  length up to N (exhaustively up to 10 bits for parity)."""
  for name, N, ex in (("kparity", 10, 10), ("kparity_count", 10, 10), ("match2", 7, 5)):
    c = conformance.check_spec(lib.PROGRAMS[name], N, exhaustive_len=ex, n_random=200)
    _assert_exact(c)
    want = sum(len(lib.PROGRAMS[name].vocab) ** n for n in range(1, ex + 1))
    assert c.inputs >= want
    # and against the plain-Python definition directly, not only the interpreter
    spec = lib.PROGRAMS[name]
    model = rasp.compile(spec.build(N), sorted(spec.vocab), N)
    xs = conformance.inputs_for(sorted(spec.vocab), spec.lengths(N), exhaustive_len=ex,
                                n_random=0, seed=0)
    assert model.apply_batch(xs) == [spec.reference(x) for x in xs]
