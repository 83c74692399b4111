"""Compiled == interpreted: the check the tests, ``jaxmem compile --check`` and the
``rasp_compile`` experiment share.

:func:`check` compiles a program and compares the compiled model's outputs with
:func:`jaxmem.rasp.evaluate` on every accepted input up to ``exhaustive_len`` and on
``n_random`` random ones of lengths up to ``max_seq_len``. Categorical outputs must be
identical, type included; numerical ones within ``atol + rtol·|value|`` (the interpreter's
None read as 0, bools as 0/1).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from typing import Any, List, Optional, Sequence

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
  """(equal?, max abs error) of one output sequence. Numerical: ``|w − g| <= atol + rtol·|w|``
  at every position (float32 holds ~7 significant digits, so large values need ``rtol``)."""
  if encoding == "numerical":
    ws = [0.0 if w is None else float(w) for w in want]
    errs = [abs(w - g) for w, g in zip(ws, got, strict=True)]
    ok = all(e <= atol + rtol * abs(w) for e, w in zip(errs, ws, strict=True))
    return ok, max(errs, default=0.0)
  return list(want) == list(got) and all(type(w) is type(g) or w is None or g is None
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


def check_model(model: CompiledModel, program: rasp.SOp, inputs: Sequence[list], *, name: str,
                compile_s: float, atol: float = 1e-6) -> Check:
  enc = model.meta["output"]["encoding"]
  wrong, worst, example = 0, 0.0, None
  for xs, got in zip(inputs, model.apply_batch(inputs), strict=True):
    want = rasp.evaluate(program, xs)
    ok, err = agree(enc, want, got, atol)
    worst = max(worst, err)
    if not ok:
      wrong += 1
      example = example or (xs, want, got)
  return Check(name, model.max_seq_len, model.num_layers, model.num_heads, model.residual_width,
               model.num_params, compile_s, len(inputs), wrong, worst, example)


def check_spec(spec, max_seq_len: int, *, exhaustive_len: int = 4, n_random: int = 1000,
               seed: int = 0, max_params: Optional[int] = None) -> Check:
  """Compiles a :class:`jaxmem.rasp.lib.ProgramSpec` at ``max_seq_len`` and checks it."""
  if not spec.lengths(max_seq_len):
    raise ValueError(f"{spec.name} accepts no input length <= {max_seq_len}.")
  program = spec.build(max_seq_len)
  t0 = time.perf_counter()
  model = compile_program(program, sorted(spec.vocab, key=repr), max_seq_len, max_params=max_params)
  compile_s = time.perf_counter() - t0
  inputs = inputs_for(sorted(spec.vocab, key=repr), spec.lengths(max_seq_len),
                      exhaustive_len=exhaustive_len, n_random=n_random, seed=seed,
                      sample=spec.sample, accepts=lambda x: spec.accepts(x, max_seq_len))
  return check_model(model, program, inputs, name=spec.name, compile_s=compile_s)
