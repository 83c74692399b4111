"""The compiler's conformance table :data:`PROGRAMS`: each :class:`ProgramSpec` pairs a library program
(:mod:`jaxmem.rasp.lib`) with its vocabulary, its input domain, a random-input sampler
(:mod:`jaxmem.rasp.samplers`) and an independent plain-Python reference (:mod:`jaxmem.rasp.references`).
The programs and what each computes are listed in :mod:`jaxmem.rasp.lib`'s docstring."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable, Dict, Optional, Sequence

from jaxmem.rasp import rasp
from jaxmem.rasp.lib import (
  make_frac_prevs,
  make_hist,
  make_kparity,
  make_kparity_count,
  make_length,
  make_match2,
  make_pair_balance,
  make_reverse,
  make_running_sum,
  make_shuffle_dyck,
  make_shuffle_dyck2,
  make_sort,
  make_sort_freq,
  make_sort_unique,
  make_transpose,
)
from jaxmem.rasp.references import (
  ref_frac_prevs,
  ref_hist,
  ref_kparity,
  ref_length,
  ref_match2,
  ref_pair_balance,
  ref_reverse,
  ref_running_sum,
  ref_shuffle_dyck,
  ref_sort,
  ref_sort_freq,
  ref_transpose,
)
from jaxmem.rasp.samplers import distinct, dyck_sampler, transpose_sampler, uniform

__all__ = ["PROGRAMS", "ProgramSpec"]


def _any_input(xs: Sequence[Any]) -> bool:
  return True


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
  """One program of the conformance suite.

  ``build(max_seq_len)`` makes the program; it is defined on every input ``xs`` that
  :meth:`accepts` (tokens from ``vocab``, ``min_len <= len(xs) <= min(max_len,
  max_seq_len)``, ``valid(xs)``), where it equals ``reference(xs)``, a plain-Python
  implementation. ``encoding`` is the output's ("categorical" or "numerical"); ``tracr``
  is tracr's published compiled size at ``max_seq_len=5`` as ``(layers, heads per layer,
  residual width, parameters)``, or None; ``sample(rng, n)`` draws an accepted input of
  length ``n``."""

  name: str
  build: Callable[[int], rasp.SOp]
  vocab: frozenset
  reference: Callable[[list], list]
  encoding: str
  tracr: Optional[tuple]
  sample: Callable[[random.Random, int], list]
  min_len: int = 1
  max_len: Optional[int] = None  # longest input the program is defined on (None: any)
  valid: Callable[[Sequence[Any]], bool] = _any_input  # e.g. distinct keys for sort_unique
  description: str = ""

  def __post_init__(self):
    if self.encoding not in ("categorical", "numerical"):
      raise ValueError(f"`encoding` must be 'categorical' or 'numerical', got {self.encoding!r}.")

  def accepts(self, xs: Sequence[Any], max_seq_len: Optional[int] = None) -> bool:
    """Whether ``xs`` is in the program's domain (and, given ``max_seq_len``, fits it)."""
    n = len(xs)
    if n < self.min_len or (self.max_len is not None and n > self.max_len):
      return False
    if max_seq_len is not None and n > max_seq_len:
      return False
    return all(x in self.vocab for x in xs) and bool(self.valid(xs))

  def lengths(self, max_seq_len: int) -> range:
    """The input lengths the program is defined on, up to ``max_seq_len``."""
    top = max_seq_len if self.max_len is None else min(max_seq_len, self.max_len)
    return range(self.min_len, top + 1)


_ABC = frozenset("abc")
_123 = frozenset({1, 2, 3})
_KPARITY_POSITIONS = (0, 2, 3)
_SORT_UNIQUE_VOCAB = frozenset(range(1, 6))  # tracr-sized: every length up to N = 5


def _spec(**kw) -> ProgramSpec:
  kw.setdefault("sample", uniform(kw["vocab"]))
  return ProgramSpec(**kw)


PROGRAMS: Dict[str, ProgramSpec] = {s.name: s for s in [
    _spec(name="length", build=lambda N: make_length(), vocab=_ABC, reference=ref_length,
          encoding="categorical", tracr=(1, 1, 19, 912),
          description="n at every position"),
    _spec(name="reverse", build=lambda N: make_reverse(rasp.tokens), vocab=_ABC,
          reference=ref_reverse, encoding="categorical", tracr=(4, 1, 43, 18600),
          description="the tokens in reverse order"),
    _spec(name="hist", build=lambda N: make_hist(), vocab=_ABC, reference=ref_hist,
          encoding="categorical", tracr=(1, 1, 19, 912),
          description="how many positions hold this position's token"),
    _spec(name="sort_unique", build=lambda N: make_sort_unique(rasp.tokens, rasp.tokens),
          vocab=_SORT_UNIQUE_VOCAB, reference=ref_sort, encoding="categorical",
          tracr=(2, 1, 25, 2600), sample=distinct(_SORT_UNIQUE_VOCAB),
          max_len=len(_SORT_UNIQUE_VOCAB), valid=lambda xs: len(set(xs)) == len(xs),
          description="distinct tokens sorted ascending"),
    _spec(name="sort",
          build=lambda N: make_sort(rasp.tokens, rasp.tokens, max_seq_len=N, min_key=1),
          vocab=_123, reference=ref_sort, encoding="categorical", tracr=(3, 1, 50, 23700),
          description="tokens sorted ascending, duplicates allowed"),
    _spec(name="sort_freq", build=lambda N: make_sort_freq(N), vocab=_ABC,
          reference=ref_sort_freq, encoding="categorical", tracr=(5, 1, 66, 62000),
          description="tokens by descending frequency, ties in input order"),
    _spec(name="frac_prevs", build=lambda N: make_frac_prevs((rasp.tokens == "x").named("is_x")),
          vocab=frozenset("xy"), reference=ref_frac_prevs, encoding="numerical",
          tracr=(2, 1, 14, 840), description='running fraction of "x" tokens'),
    _spec(name="pair_balance", build=lambda N: make_pair_balance(rasp.tokens, "(", ")"),
          vocab=frozenset("()x"), reference=ref_pair_balance, encoding="numerical",
          tracr=(2, 2, 15, 1920), sample=uniform(frozenset("()x")),
          description='(#"(" - #")") in the prefix, over the prefix length'),
    _spec(name="shuffle_dyck1", build=lambda N: make_shuffle_dyck(["()"]),
          vocab=frozenset("()"), reference=ref_shuffle_dyck, encoding="categorical",
          tracr=None, sample=dyck_sampler(["()"]),
          description="True everywhere iff the parentheses are balanced, else False"),
    _spec(name="shuffle_dyck2", build=lambda N: make_shuffle_dyck2(),
          vocab=frozenset("(){}"),
          reference=lambda xs: ref_shuffle_dyck(xs, pairs=("()", "{}")),
          encoding="categorical", tracr=(8, 4, 55, 243000), sample=dyck_sampler(["()", "{}"]),
          description="True everywhere iff () and {} are each balanced, else False"),
    _spec(name="kparity", build=lambda N: make_kparity(_KPARITY_POSITIONS),
          vocab=frozenset({0, 1}), reference=ref_kparity, encoding="categorical", tracr=None,
          description="XOR of the bits at positions 0, 2, 3 (0 past the end), one select each"),
    _spec(name="kparity_count", build=lambda N: make_kparity_count(_KPARITY_POSITIONS),
          vocab=frozenset({0, 1}), reference=ref_kparity, encoding="categorical", tracr=None,
          description="the same XOR via a numerical mean of the bits"),
    _spec(name="match2", build=lambda N: make_match2(5), vocab=frozenset(range(5)),
          reference=ref_match2, encoding="categorical", tracr=None,
          description="1 at i iff some j has (x_i + x_j) % 5 == 0"),
    _spec(name="running_sum", build=lambda N: make_running_sum(rasp.tokens),
          vocab=frozenset(range(4)), reference=ref_running_sum, encoding="numerical",
          tracr=None, description="prefix sums of the tokens 0..3"),
    _spec(name="transpose", build=lambda N: make_transpose(2, 3), vocab=_ABC,
          reference=ref_transpose, encoding="categorical", tracr=None,
          sample=transpose_sampler(2, 3, _ABC), min_len=6, max_len=6,
          description="a row-major 2x3 matrix to its 3x2 transpose (inputs of length 6)"),
]}
