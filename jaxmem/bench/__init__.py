"""``jaxmem bench``: throughput as ratios against a baseline measured in the same run.

Absolute times on a shared 2-core machine mean little; a ratio of two kernels timed
back to back, each the median of several runs after compilation, is what we report.
Each benchmark is a module here with a function ``(quick: bool, repeats: int) -> str``
(a Markdown section); :data:`BENCHES` maps its name to ``"module:function"``.
"""

from __future__ import annotations

import importlib

BENCHES = {
    "attention": "jaxmem.bench.attention:bench_attention",
    "dnc": "jaxmem.bench.dnc:bench_dnc",
    "assoc": "jaxmem.bench.assoc:bench_assoc",
    "precision": "jaxmem.bench.precision:bench_precision",
    "rasp": "jaxmem.bench.rasp:bench_rasp",
    "unimatrix": "jaxmem.bench.unimatrix:bench_unimatrix",
    "decode": "jaxmem.bench.decode:bench_decode",
}


def run_benches(names, quick: bool = False, repeats: int = 5) -> str:
  names = list(names) or list(BENCHES)
  unknown = [n for n in names if n not in BENCHES]
  if unknown:
    raise ValueError(f"unknown benchmark(s) {unknown}; known: {sorted(BENCHES)}.")
  sections = []
  for name in names:
    module, fn = BENCHES[name].split(":")
    sections.append(getattr(importlib.import_module(module), fn)(quick=quick, repeats=repeats))
  return "\n".join(sections)
