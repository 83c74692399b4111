"""``rasp_fuzz``: a differential fuzzer for the RASP compiler (:mod:`jaxmem.rasp.fuzz`).

Claim tested (``jaxmem/rasp/README.md``): every program the compiler accepts computes what the
interpreter computes, on every input of every length ``n ≤ N`` — and what it refuses, it refuses
quickly with a ``ValueError``. Random programs over the whole DSL (seeded; program ``i`` of seed
``s`` is :func:`jaxmem.rasp.fuzz.generate` ``(s, i)``) are compiled, and the model, the model on the
simulator's machine and tracr's interpreter are compared with the reference interpreter on every
short input and random longer ones. Reported: programs / compiled / refused / wrong / crashes, the
slowest refusal and compile, the failure classes with a minimal reproducer each
(``rasp_fuzz/failures.md``). Sizes: ``configs/simulator_rasp_fuzz.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import time

from jaxmem.experiments import ExperimentResult, RunContext, Table, register
from jaxmem.experiments.simulator.rasp_compile import PAPER
from jaxmem.results import pyplot


@dataclasses.dataclass(frozen=True)
class RaspFuzzSettings:
  """Sizes of ``rasp_fuzz`` (``configs/simulator_rasp_fuzz.py``)."""

  seed: int
  programs: int
  start: int
  workers: int            # processes; 0: one per CPU core
  timeout_s: float        # compile time limit (a "hang" past it)
  max_exhaustive: int
  n_random: int
  machine_every: int      # the machine path on every k-th program (0: never)
  tracr: bool
  shrink: int             # failure classes shrunk to a minimal reproducer
  fast_xla: bool          # workers compile with jaxmem.rasp.fuzz.FAST_XLA_FLAGS (the test suite's)


def measure(s: RaspFuzzSettings, progress: bool = False):
  from jaxmem.rasp import fuzz
  t0 = time.perf_counter()
  step = max(1, min(250, s.programs // 10))

  def report(done: int, _r) -> None:
    if progress and (done % step == 0 or done == s.programs):
      print(f"  {done}/{s.programs} programs ({time.perf_counter() - t0:.0f} s)", flush=True)
  workers = s.workers or os.cpu_count() or 1
  return fuzz.run(s.seed, s.programs, start=s.start, workers=min(workers, s.programs), progress=report,
                  timeout_s=s.timeout_s, max_exhaustive=s.max_exhaustive, n_random=s.n_random,
                  machine_every=s.machine_every, tracr=s.tracr, fast_xla=s.fast_xla)


@register("rasp_fuzz", paper=PAPER,
          description="Random RASP programs compiled and compared with the interpreter, the machine and tracr.",
          config="simulator_rasp_fuzz", settings=RaspFuzzSettings)
def run(ctx: RunContext, s: RaspFuzzSettings) -> ExperimentResult:
  from jaxmem.rasp import fuzz
  t0 = time.perf_counter()
  summary = measure(s, ctx.progress)
  classes = sorted(summary.classes().items(), key=lambda kv: -len(kv[1]))
  firsts = [(fuzz.generate(items[0][0].seed, items[0][0].index), items[0][1]) for _, items in classes]
  workers = min(s.workers or os.cpu_count() or 1, max(1, s.shrink))
  shrunk = fuzz.shrink_all(firsts[: s.shrink], workers=workers, fast_xla=s.fast_xla, timeout_s=s.timeout_s,
                           max_exhaustive=s.max_exhaustive, n_random=s.n_random)
  rows, sections = [], []
  for k, ((key, items), (program, f)) in enumerate(zip(classes, firsts, strict=True)):
    r = items[0][0]
    title = f"## {k + 1}. {' / '.join(key[:3])} ({len(items)} programs; first: seed {r.seed}, index {r.index})"
    text = [title, "", f.message, "", "```python", program.source(f.inputs).rstrip(), "```"]
    if f.kind == "wrong":
      text.append(f"\ninterpreter: `{f.want!r}`  \n{f.path}: `{f.got!r}`")
    small = "—"
    if k < len(shrunk):
      p, g = shrunk[k]
      small = f"{p.size} lines, N = {p.max_seq_len}"
      text += ["", "Minimal reproducer:", "", "```python", p.source(g.inputs).rstrip(), "```"]
      if g.kind == "wrong":
        text.append(f"\ninterpreter: `{g.want!r}`  \n{g.path}: `{g.got!r}`")
    sections.append("\n".join(text))
    message = key[3] if len(key) > 3 else f.message
    rows.append([*key[:3], len(items), f"{r.seed}:{r.index}", small, message[:120]])
  ctx.outdir.mkdir(parents=True, exist_ok=True)
  body = "\n\n".join(sections) or "None."
  (ctx.outdir / "failures.md").write_text(f"# rasp_fuzz failures\n\n{body}\n")
  refusals = collections.Counter(fuzz.normalise(r.message) for r in summary.results if r.status == "refused")
  coverage = summary.coverage()
  tables = [
      Table(f"Programs (seed {s.seed}, {s.start}..{s.start + s.programs - 1})", fuzz.Summary.HEADERS,
            [summary.row()]),
      Table("Failure classes (rasp_fuzz/failures.md: each first program's source, and a minimal reproducer)",
            ["kind", "path", "detail", "programs", "first (seed:index)", "shrunk to", "message"], rows),
      Table("Most frequent refusals", ["refusals", "message (names and numbers elided)"],
            [[c, m] for m, c in refusals.most_common(12)]),
      Table("Constructs in the programs checked", ["construct", "occurrences"], sorted(coverage.items())),
  ]
  figure = _plot(ctx, summary)
  sr, sc = summary.slowest_refusal, summary.slowest_compile
  xla = ", XLA set for compile time as in the test suite: LLVM -O0, the classic emitter" if s.fast_xla else ""
  notes = [
      f"{summary.programs} programs in {summary.seconds:.0f} s on {summary.workers} worker processes "
      f"({summary.seconds * summary.workers / max(summary.programs, 1):.2f} s per program and core; two XLA "
      f"compiles, the model's and the machine's, dominate{xla}).",
      "Each compiled program is checked on every input of the lengths 1..L with at most "
      f"{s.max_exhaustive} such inputs, and {s.n_random} random inputs up to max_seq_len: the compiled model "
      f"(always), the model on the simulator's machine (every {s.machine_every or '—'}-th program), and "
      "tracr's interpreter on the same program in tracr's DSL (when tracr-pypi is installed; against "
      "rasp.evaluate).",
      "wrong: an output differs from the interpreter's (None only equals None; numerical values within "
      "1e-6 + 1e-6·|value|; categorical values equal with one type class); crash: an exception other than "
      "ValueError from the compiler or a path, a machine that fails to build, or a compile past "
      f"{s.timeout_s:g} s (a hang).",
  ]
  if sr is not None:
    notes.append(f"Slowest refusal: seed {sr.seed}, index {sr.index}, {sr.compile_cpu_s:.2f} s of CPU "
                 f"({sr.compile_s:.2f} s wall): {sr.message[:200]}")
  if sc is not None:
    notes.append(f"Slowest compile: seed {sc.seed}, index {sc.index}, {sc.compile_s:.2f} s.")
  failures = [{"seed": r.seed, "index": r.index, "kind": f.kind, "path": f.path, "message": f.message[:300]}
              for r in summary.results for f in r.failures]
  (ctx.outdir / "programs.json").write_text(json.dumps(
      [{"index": r.index, "status": r.status, "compile_s": r.compile_s, "compile_cpu_s": r.compile_cpu_s,
        "seconds": r.seconds}
       for r in summary.results]))
  seconds = time.perf_counter() - t0
  notes.append(f"Wall time {seconds:.0f} s (with shrinking).")
  return ExperimentResult(
      summary=f"{summary.programs} programs: {summary.compiled} compiled, {summary.count('refused')} refused, "
              f"{summary.wrong} wrong, {summary.crashes} crashes",
      tables=tables, figures=[figure], notes=notes,
      metrics={"programs": summary.programs, "compiled": summary.compiled, "refused": summary.count("refused"),
               "wrong": summary.wrong, "crashes": summary.crashes, "seconds": summary.seconds,
               "slowest_refusal_s": None if sr is None else sr.compile_s,
               "slowest_refusal_cpu_s": None if sr is None else sr.compile_cpu_s,
               "slowest_compile_s": None if sc is None else sc.compile_s,
               "classes": len(classes), "failures": failures})


def _plot(ctx: RunContext, summary) -> str:
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for label, keep in (("compiled", lambda r: r.compiled), ("refused", lambda r: r.status == "refused")):
    xs = [max(r.compile_s, 1e-4) for r in summary.results if r.compile_s is not None and keep(r)]
    if xs:
      ax.hist(xs, bins=40, alpha=0.6, label=f"{label} ({len(xs)})")
  ax.set_xscale("log")
  ax.set_xlabel("rasp.compile seconds")
  ax.set_ylabel("programs")
  ax.legend()
  return ctx.save_figure(fig, "rasp_fuzz.png", dpi=110)
