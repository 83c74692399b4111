"""Compiled == interpreted: the check the tests, ``jaxmem compile --check`` and the
``rasp_compile`` experiment share.

:func:`check` compiles a program and compares the compiled model's outputs with
:func:`jaxmem.rasp.evaluate` on every accepted input up to ``exhaustive_len`` and on
``n_random`` random ones of lengths up to ``max_seq_len``. Categorical outputs must be
identical, type included (numbers of different types that are equal in Python share one
one-hot slot, so ``0`` and ``0.0`` agree); numerical ones within ``atol + rtol·|value|`` (bools
as 0/1). None (no value) equals only None, in either encoding. Where the interpreter raises, the
compiled model must raise too.

:func:`tracr_programs` loads tracr's own ``lib.py`` from an installed ``tracr-pypi``
unchanged but for its import line (``from tracr.rasp import rasp`` → ``from jaxmem import
rasp``) and builds each of its programs with a small vocabulary: the drop-in check.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import numbers
import random
import time
import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from jaxmem.rasp import rasp
from jaxmem.rasp.compiler import compile as compile_program
from jaxmem.rasp.model import CompiledModel


@dataclasses.dataclass
class Check:
  name: str
  max_seq_len: int
  layers: int
  heads: int
  residual_width: int
  params: int
  compile_s: float
  inputs: int
  wrong: int
  max_abs_err: float
  example: Optional[tuple] = None   # (inputs, interpreted, compiled) of a wrong one

  def row(self) -> dict:
    d = dataclasses.asdict(self)
    d.pop("example")
    return d


def agree(encoding: str, want: Sequence[Any], got: Sequence[Any], atol: float = 1e-6,
          rtol: float = 1e-6):
  """(equal?, max abs error) of one output sequence. None equals only None (an error of inf
  otherwise). Numerical: ``|w − g| <= atol + rtol·|w|`` at every position (float32 holds ~7
  significant digits, so large values need ``rtol``)."""
  if len(want) != len(got):
    return False, float("inf")
  if any((w is None) != (g is None) for w, g in zip(want, got, strict=True)):
    return False, float("inf")   # None is no value, never 0
  if encoding == "numerical":
    pairs = [(float(w), float(g)) for w, g in zip(want, got, strict=True) if w is not None]
    errs = [abs(w - g) for w, g in pairs]
    ok = all(e <= atol + rtol * abs(w) for e, (w, _) in zip(errs, pairs, strict=True))
    return ok, max(errs, default=0.0)
  return list(want) == list(got) and all(
      type(w) is type(g) or w is None or g is None
      or (isinstance(w, numbers.Number) and isinstance(g, numbers.Number))
      for w, g in zip(want, got, strict=True)), 0.0


def inputs_for(vocab: Sequence[Any], lengths: Sequence[int], *, exhaustive_len: int, n_random: int,
               seed: int, sample=None, accepts=None) -> List[list]:
  """Every input of length <= ``exhaustive_len`` (among ``lengths``) plus ``n_random``
  random ones with lengths drawn uniformly from ``lengths``."""
  vocab = list(vocab)
  out = [list(x) for n in lengths if n <= exhaustive_len
         for x in itertools.product(vocab, repeat=n)]
  if accepts is not None:
    out = [x for x in out if accepts(x)]
  rng = random.Random(seed)
  lengths = list(lengths)
  for _ in range(n_random):
    n = rng.choice(lengths)
    out.append(list(sample(rng, n)) if sample else [rng.choice(vocab) for _ in range(n)])
  return out


RAISED = "<raised>"   # the outcome of an input on which the interpreter or the model raises


def interpret(program: rasp.SOp, xs: Sequence[Any], causal: bool = False):
  """``rasp.evaluate(program, xs, causal=causal)``, or :data:`RAISED`."""
  try:
    return rasp.evaluate(program, xs, causal=causal)
  except Exception:  # noqa: BLE001 - any error of the program's own functions
    return RAISED


def outputs(model: CompiledModel, inputs: Sequence[list]) -> list:
  """``model.apply_batch(inputs)``, with :data:`RAISED` for each input on which it raises
  (retried one by one when the batch raises)."""
  try:
    return model.apply_batch(inputs)
  except ValueError:
    out = []
    for xs in inputs:
      try:
        out.append(model.apply_batch([xs])[0])
      except ValueError:
        out.append(RAISED)
    return out


def check_model(model: CompiledModel, program: rasp.SOp, inputs: Sequence[list], *, name: str,
                compile_s: float, atol: float = 1e-6) -> Check:
  enc = model.meta["output"]["encoding"]
  wrong, worst, example = 0, 0.0, None
  for xs, got in zip(inputs, outputs(model, inputs), strict=True):
    want = interpret(program, xs, model.causal)
    if RAISED in (want, got):
      ok, err = want is got, 0.0
    else:
      ok, err = agree(enc, want, got, atol)
    worst = max(worst, err)
    if not ok:
      wrong += 1
      example = example or (xs, want, got)
  return Check(name, model.max_seq_len, model.num_layers, model.num_heads, model.residual_width,
               model.num_params, compile_s, len(inputs), wrong, worst, example)


def check_spec(spec, max_seq_len: int, *, exhaustive_len: int = 4, n_random: int = 1000,
               seed: int = 0, max_params: Optional[int] = None, causal: bool = False) -> Check:
  """Compiles a :class:`jaxmem.rasp.programs.ProgramSpec` at ``max_seq_len`` (causally masked with
  ``causal=True``, then compared with ``rasp.evaluate(..., causal=True)``) and checks it."""
  if not spec.lengths(max_seq_len):
    raise ValueError(f"{spec.name} accepts no input length <= {max_seq_len}.")
  program = spec.build(max_seq_len)
  t0 = time.perf_counter()
  model = compile_program(program, sorted(spec.vocab, key=repr), max_seq_len, max_params=max_params,
                          causal=causal)
  compile_s = time.perf_counter() - t0
  inputs = inputs_for(sorted(spec.vocab, key=repr), spec.lengths(max_seq_len),
                      exhaustive_len=exhaustive_len, n_random=n_random, seed=seed,
                      sample=spec.sample, accepts=lambda x: spec.accepts(x, max_seq_len))
  return check_model(model, program, inputs, name=spec.name, compile_s=compile_s)


def tracr_lib() -> types.ModuleType:
  """tracr's ``tracr/compiler/lib.py`` (from an installed ``tracr-pypi``), executed against
  :mod:`jaxmem.rasp`: its text with only the line ``from tracr.rasp import rasp`` replaced.
  Raises ``ImportError`` when tracr-pypi is not installed."""
  spec = importlib.util.find_spec("tracr.compiler.lib") if importlib.util.find_spec("tracr") else None
  if spec is None or spec.origin is None:
    raise ImportError("tracr-pypi is not installed (pip install tracr-pypi==1.0.0).")
  with open(spec.origin, encoding="utf-8") as f:
    text = f.read()
  line = "from tracr.rasp import rasp"
  if text.count(line) != 1:
    raise ImportError(f"{spec.origin} does not import rasp as `{line}` exactly once.")
  mod = types.ModuleType("tracr_lib_on_jaxmem")
  mod.__file__ = spec.origin
  exec(compile(text.replace(line, "from jaxmem import rasp"), spec.origin, "exec"), mod.__dict__)  # noqa: S102
  return mod


def tracr_programs(lib: types.ModuleType, max_seq_len: int
                   ) -> Dict[str, Tuple[Callable[[], rasp.SOp], List[Any]]]:
  """Every program of tracr's ``lib.py`` as ``name -> (build, vocab)``, with the arguments
  tracr's own tests and docstrings use and a vocabulary of 2–4 tokens."""
  t = rasp.tokens
  return {
      "length": (lib.make_length, list("abc")),
      "reverse": (lambda: lib.make_reverse(t), list("abc")),
      "hist": (lib.make_hist, list("abc")),
      "sort_unique": (lambda: lib.make_sort_unique(t, t), [1, 2, 3]),
      "sort": (lambda: lib.make_sort(t, t, max_seq_len=max_seq_len, min_key=1), [1, 2, 3]),
      "sort_freq": (lambda: lib.make_sort_freq(max_seq_len), [1, 2, 3]),
      "frac_prevs": (lambda: lib.make_frac_prevs(t == "a"), list("ab")),
      "pair_balance": (lambda: lib.make_pair_balance(t, "(", ")"), list("()a")),
      "shuffle_dyck": (lambda: lib.make_shuffle_dyck(["()"]), list("()")),
      "shuffle_dyck2": (lib.make_shuffle_dyck2, list("(){}")),
      "shift_by": (lambda: lib.shift_by(2, t), list("ab")),
      "detect_pattern": (lambda: lib.detect_pattern(t, "abc"), list("abc")),
      "count_less_freq": (lambda: lib.make_count_less_freq(2), list("abc")),
      "count": (lambda: lib.make_count(t, "a"), list("ab")),
      "nary_sequencemap": (lambda: lib.make_nary_sequencemap(lambda x, y, z: x + y - z, t, t, rasp.indices),
                           [1, 2]),
  }
