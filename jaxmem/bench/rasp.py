"""``jaxmem bench rasp``: the RASP compiler's compile time, and compiled-model throughput as a
ratio against the reference interpreter on the same inputs, in the same run.

Compile time is ``rasp.compile`` up to a runnable NNX model (median of ``repeats``), next
to tracr's published 372 s for ``reverse`` at N = 80 (docs/papers/simulator.md) — a
published number, not a same-run baseline, so it is shown but not divided. Throughput:
``CompiledModel.apply_batch`` (one jitted call, after compilation) against
``rasp.evaluate`` looped over the same batch of random length-N inputs.

The full run adds the scale table (:func:`scale_rows`): each program of :data:`SCALE_PROGRAMS`
(tracr's own ``make_shuffle_dyck2`` among them, from :func:`jaxmem.rasp.conformance.tracr_lib`
when tracr-pypi is installed) at every ``N`` of :data:`SCALE_NS` it compiles at under
:data:`SCALE_MAX_PARAMS`: layers, heads, residual width, parameters, compile seconds, and
compiled vs interpreted on random inputs (half of length ``N``, half of random lengths).
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Callable, List, Optional, Sequence

from jaxmem.bench.timing import time_host
from jaxmem.results import markdown_table

TRACR_REVERSE_N80_S = 372.0
PROGRAMS = ("reverse", "sort", "frac_prevs", "shuffle_dyck2")   # names in jaxmem.rasp.programs.PROGRAMS
QUICK_NS, QUICK_BATCH = (20, 40), 64                            # the quick run's lengths and batch
SCALE_PROGRAMS = ("length", "hist", "reverse", "sort", "sort_freq", "frac_prevs", "tracr:shuffle_dyck2")
SCALE_NS = (5, 10, 20, 40, 80, 256, 1024)
SCALE_MAX_PARAMS = 100_000_000
# random inputs checked per (program, N) (the interpreter takes ~0.5 s an input at N = 1024)
SCALE_INPUTS = {5: 300, 10: 300, 20: 300, 40: 300, 80: 300, 256: 300, 1024: 200}
SCALE_CHUNK = 20   # inputs per forward call (a batch of 1024-token residuals is large)
# tracr's published sizes beyond N = 5 (docs/papers/simulator.md): (program, N) -> (params, seconds)
TRACR_PUBLISHED = {("reverse", 80): (26_700_000, 372.0)}


def _scale_program(name: str, N: int):
  """(program, vocab, sampler) of a library program, or of tracr's own (``tracr:NAME``)."""
  from jaxmem.rasp import conformance, programs
  if name.startswith("tracr:"):
    build, vocab = conformance.tracr_programs(conformance.tracr_lib(), N)[name[len("tracr:"):]]
    own = programs.PROGRAMS.get(name[len("tracr:"):])
    sample = own.sample if own is not None else (lambda rng, n: [rng.choice(vocab) for _ in range(n)])
    return build(), list(vocab), sample
  spec = programs.PROGRAMS[name]
  return spec.build(N), sorted(spec.vocab, key=repr), spec.sample


def scale_rows(names: Sequence[str] = SCALE_PROGRAMS, Ns: Sequence[int] = SCALE_NS, *,
               inputs: Optional[dict] = None, max_params: int = SCALE_MAX_PARAMS, seed: int = 0,
               progress: Optional[Callable[[list], None]] = None) -> List[list]:
  """One row per (program, N): ``[name, N, layers, heads, width, params, compile s, inputs,
  wrong]``, or ``[name, N, "refused: …"]`` where ``rasp.compile`` refuses (a documented
  limit; the message says why)."""
  from jaxmem import rasp
  from jaxmem.rasp import conformance
  inputs = SCALE_INPUTS if inputs is None else inputs
  rows = []
  for name in names:
    for N in Ns:
      program, vocab, sample = _scale_program(name, N)
      t0 = time.perf_counter()
      try:
        model = rasp.compile(program, vocab, N, max_params=max_params)
      except ValueError as e:
        rows.append([name, N, f"refused after {time.perf_counter() - t0:.1f} s: {str(e)[:160]}"])
        if progress:
          progress(rows[-1])
        continue
      seconds = time.perf_counter() - t0
      rng = random.Random(seed)
      n = inputs.get(N, 20)
      xs = [sample(rng, N if i % 2 == 0 else rng.randint(1, N)) for i in range(n)]
      wrong = sum(conformance.check_model(model, program, xs[i: i + SCALE_CHUNK], name=name,
                                          compile_s=seconds).wrong for i in range(0, len(xs), SCALE_CHUNK))
      rows.append([name, N, model.num_layers, model.num_heads, model.residual_width, model.num_params, seconds,
                   len(xs), wrong])
      if progress:
        progress(rows[-1])
  return rows


def scale_table(rows: List[list]) -> str:
  from jaxmem.results import markdown_table as table
  out = []
  for r in rows:
    if len(r) == 3:
      out.append([r[0], r[1], "—", "—", "—", "—", "—", "—", r[2]])
      continue
    tracr = TRACR_PUBLISHED.get((r[0], r[1]))
    note = "" if tracr is None else f"tracr: {tracr[0] / 1e6:.1f}M params, {tracr[1]:.0f} s"
    out.append([r[0], r[1], r[2], r[3], r[4], f"{r[5]:,}", f"{r[6]:.2f}", f"{r[8]} / {r[7]}", note])
  return table(["program", "N", "layers", "heads/layer", "residual", "params", "compile s",
                "wrong / inputs", "note"], out)


def bench_rasp(quick: bool = False, repeats: int = 5) -> str:
  from jaxmem import rasp
  from jaxmem.rasp import programs
  Ns = QUICK_NS if quick else (20, 40, 80)
  names = PROGRAMS
  batch = QUICK_BATCH if quick else 256
  rows = []
  for name in names:
    spec = programs.PROGRAMS[name]
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
  text = ("## rasp: compile time and compiled vs interpreted throughput\n\n"
          + markdown_table(["program", "N", "layers", "residual", "params", "compile s",
                            "compiled seq/s", "interpreter seq/s", "compiled / interpreter"], rows)
          + "\n\n" + note + "\n")
  if not quick:
    text += ("\n## rasp: compiled size and exactness against N\n\n" + scale_table(scale_rows())
             + "\n\nwrong / inputs: random inputs (half of length N) on which the compiled model and "
             "rasp.evaluate differ. Refused: over max_params "
             f"{SCALE_MAX_PARAMS:,} (estimated before building) or another compile-time limit.\n")
  return text
