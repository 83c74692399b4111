"""``jaxmem bench``: throughput as ratios against a baseline measured in the same run.

Absolute times on a shared 2-core machine mean little; a ratio of two kernels timed
back to back, each the median of several runs after compilation, is what we report.
Each benchmark is a module here with a function ``(quick: bool, repeats: int) -> str``
(a Markdown section); :data:`BENCHES` maps its name to ``"module:function"``. A benchmark may
also take ``emit``, a callback it calls with each table's text as soon as that table is computed
(the pieces concatenate to its section), so that a later failure or interrupt loses nothing shown.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

BENCHES = {
    "attention": "jaxmem.bench.attention:bench_attention",
    "dnc": "jaxmem.bench.dnc:bench_dnc",
    "assoc": "jaxmem.bench.assoc:bench_assoc",
    "ops": "jaxmem.bench.ops:bench_ops",
    "precision": "jaxmem.bench.precision:bench_precision",
    "rasp": "jaxmem.bench.rasp:bench_rasp",
    "unimatrix": "jaxmem.bench.unimatrix:bench_unimatrix",
    "decode": "jaxmem.bench.decode:bench_decode",
}


def run_benches(names, quick: bool = False, repeats: int = 5,
                emit: Callable[[str], None] | None = None) -> str:
  """The named benchmarks' sections (all when ``names`` is empty), joined by newlines.

  ``emit``, if given, receives the same text in pieces as it is computed: each table of a benchmark that
  takes ``emit``, each other benchmark's section when it completes, and the separators, in order; the
  pieces concatenate to the returned string.
  """
  names = list(names) or list(BENCHES)
  unknown = [n for n in names if n not in BENCHES]
  if unknown:
    raise ValueError(f"unknown benchmark(s) {unknown}; known: {sorted(BENCHES)}.")
  sections = []
  for name in names:
    module, fn = BENCHES[name].split(":")
    bench = getattr(importlib.import_module(module), fn)
    if emit is None:
      sections.append(bench(quick=quick, repeats=repeats))
      continue
    if sections:
      emit("\n")
    if "emit" in inspect.signature(bench).parameters:
      sections.append(bench(quick=quick, repeats=repeats, emit=emit))
    else:
      sections.append(bench(quick=quick, repeats=repeats))
      emit(sections[-1])
  return "\n".join(sections)
