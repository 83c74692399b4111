"""``jaxmem bench rasp``: the RASP compiler's compile time, and compiled-model throughput as a
ratio against the reference interpreter on the same inputs, in the same run.

Compile time is ``rasp.compile`` up to a runnable NNX model (median of ``repeats``), next
to tracr's published 372 s for ``reverse`` at N = 80 (docs/papers/simulator.md) — a
published number, not a same-run baseline, so it is shown but not divided. Throughput:
``CompiledModel.apply_batch`` (one jitted call, after compilation) against
``rasp.evaluate`` looped over the same batch of random length-N inputs.
"""

from __future__ import annotations

import random
import statistics
import time

from jaxmem.bench.timing import time_host
from jaxmem.results import markdown_table

TRACR_REVERSE_N80_S = 372.0
PROGRAMS = ("reverse", "sort", "frac_prevs", "shuffle_dyck2")   # names in jaxmem.rasp.lib.PROGRAMS
QUICK_NS, QUICK_BATCH = (20, 40), 64                            # the quick run's lengths and batch


def bench_rasp(quick: bool = False, repeats: int = 5) -> str:
  from jaxmem import rasp
  from jaxmem.rasp import lib
  Ns = QUICK_NS if quick else (20, 40, 80)
  names = PROGRAMS
  batch = QUICK_BATCH if quick else 256
  rows = []
  for name in names:
    spec = lib.PROGRAMS[name]
    vocab = sorted(spec.vocab, key=repr)
    for N in Ns:
      program = spec.build(N)
      times = []
      for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        model = rasp.compile(program, vocab, N)
        times.append(time.perf_counter() - t0)
      rng = random.Random(0)
      xs = [spec.sample(rng, N) for _ in range(batch)]
      model.apply_batch(xs)  # jit compilation
      t_model = time_host(lambda: model.apply_batch(xs), repeats=repeats, warmup=0)
      t_interp = time_host(lambda: [rasp.evaluate(program, x) for x in xs], repeats=max(1, repeats // 2),
                           warmup=0)
      rows.append([name, N, model.num_layers, model.residual_width, f"{model.num_params:,}",
                   f"{statistics.median(times):.3f}",
                   f"{batch / t_model:,.0f}", f"{batch / t_interp:,.0f}", f"{t_interp / t_model:.1f}×"])
  note = (f"tracr compiles `reverse` at N = 80 in {TRACR_REVERSE_N80_S:.0f} s (published); "
          "throughput is sequences of length N per second, batch of "
          f"{batch}, on this machine's CPU.")
  return ("## rasp: compile time and compiled vs interpreted throughput\n\n"
          + markdown_table(["program", "N", "layers", "residual", "params", "compile s",
                            "compiled seq/s", "interpreter seq/s", "compiled / interpreter"], rows)
          + "\n\n" + note + "\n")
