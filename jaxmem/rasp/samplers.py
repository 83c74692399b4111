"""Random-input samplers of the RASP conformance table (:mod:`jaxmem.rasp.programs`): ``sample(rng, n)``
draws an input of length ``n`` that the program accepts."""

from __future__ import annotations

import random
from typing import Callable, Sequence

__all__ = ["balanced_word", "distinct", "dyck_sampler", "ordered", "transpose_sampler", "uniform"]


def ordered(vocab) -> list:
  return sorted(vocab, key=lambda v: (type(v).__name__, v))


def uniform(vocab) -> Callable[[random.Random, int], list]:
  values = ordered(vocab)
  return lambda rng, n: [rng.choice(values) for _ in range(n)]


def distinct(vocab) -> Callable[[random.Random, int], list]:
  values = ordered(vocab)

  def sample(rng: random.Random, n: int) -> list:
    if n > len(values):
      raise ValueError(f"no {n} distinct tokens in a vocabulary of {len(values)}.")
    return rng.sample(values, n)

  return sample


def balanced_word(rng: random.Random, n: int, pairs: Sequence[str]) -> list:
  """A uniformly-interleaved word of ``n // 2`` bracket pairs, each type balanced."""
  todo = {p: 0 for p in pairs}
  for _ in range(n // 2):
    todo[rng.choice(list(pairs))] += 1
  depth = {p: 0 for p in pairs}
  out = []
  for _ in range(2 * (n // 2)):
    moves = [(p, 0) for p in pairs if todo[p]] + [(p, 1) for p in pairs if depth[p]]
    p, close = rng.choice(moves)
    if close:
      depth[p] -= 1
    else:
      todo[p] -= 1
      depth[p] += 1
    out.append(p[close])
  return out


def dyck_sampler(pairs: Sequence[str]) -> Callable[[random.Random, int], list]:
  """Half balanced words (for even n), a quarter one-token corruptions, a quarter uniform."""
  brackets = [c for p in pairs for c in p]

  def sample(rng: random.Random, n: int) -> list:
    u = rng.random()
    if u < 0.75 and n % 2 == 0:
      word = balanced_word(rng, n, pairs)
      if u >= 0.5 and word:
        word[rng.randrange(n)] = rng.choice(brackets)
      return word
    return [rng.choice(brackets) for _ in range(n)]

  return sample


def transpose_sampler(rows: int, cols: int, vocab) -> Callable[[random.Random, int], list]:
  draw = uniform(vocab)

  def sample(rng: random.Random, n: int) -> list:
    if n != rows * cols:
      raise ValueError(f"a {rows}×{cols} transpose takes inputs of length {rows * cols}, not {n}.")
    return draw(rng, n)

  return sample
