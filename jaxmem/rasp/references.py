"""The independent plain-Python references of the RASP conformance table (:mod:`jaxmem.rasp.programs`):
``ref_NAME(xs)`` is what program ``NAME`` computes, written without RASP."""

from __future__ import annotations

import itertools
from typing import Any, Dict

__all__ = ["ref_frac_prevs", "ref_hist", "ref_kparity", "ref_length", "ref_match2", "ref_pair_balance",
           "ref_reverse", "ref_running_sum", "ref_shuffle_dyck", "ref_sort", "ref_sort_freq", "ref_transpose"]


def ref_length(xs):
  return [len(xs)] * len(xs)


def ref_reverse(xs):
  return list(xs)[::-1]


def ref_hist(xs):
  return [list(xs).count(x) for x in xs]


def ref_sort(xs):
  return sorted(xs)


def ref_sort_freq(xs):
  counts: Dict[Any, int] = {}
  for x in xs:
    counts[x] = counts.get(x, 0) + 1
  order = sorted(range(len(xs)), key=lambda i: (-counts[xs[i]], i))
  return [xs[i] for i in order]


def ref_frac_prevs(xs, target="x"):
  out, hits = [], 0
  for i, x in enumerate(xs):
    hits += x == target
    out.append(hits / (i + 1))
  return out


def ref_pair_balance(xs, open_token="(", close_token=")"):
  out, depth = [], 0
  for i, x in enumerate(xs):
    depth += (x == open_token) - (x == close_token)
    out.append(depth / (i + 1))
  return out


def ref_shuffle_dyck(xs, pairs=("()",)):
  for o, c in pairs:
    depth = 0
    for x in xs:
      depth += (x == o) - (x == c)
      if depth < 0:
        return [False] * len(xs)
    if depth != 0:
      return [False] * len(xs)
  return [True] * len(xs)


def ref_kparity(xs, positions=(0, 2, 3)):
  bit = 0
  for p in positions:
    if p < len(xs):
      bit ^= int(xs[p])
  return [bit] * len(xs)


def ref_match2(xs, M=5):
  return [1 if any((x + y) % M == 0 for y in xs) else 0 for x in xs]


def ref_running_sum(xs):
  return list(itertools.accumulate(xs))


def ref_transpose(xs, rows=2, cols=3):
  n, out = len(xs), []
  for i in range(n):
    if i >= rows * cols:
      out.append(None)
      continue
    src = (i % rows) * cols + i // rows
    out.append(xs[src] if src < n else None)
  return out
