"""``rasp_compile``: every library program compiled at several ``N``: size, compile time and
exactness, beside tracr's published sizes.

Claim tested (``docs/papers/simulator.md``): RASP programs compile to *exact* average-hard-
attention transformers — compiled == interpreted on every input of every length ``n ≤ N``
— where tracr's soft attention is approximate and fails as ``N`` grows (``length``,
``reverse`` wrong at N = 10; ``frac_prevs`` 71 of 2,081 outputs wrong at N = 80) and builds
slowly (``reverse`` at N = 80: 26.7M parameters, 372 s). Each program is checked on every
input of length ≤ ``exhaustive_len`` and ``n_random`` random ones up to ``N``
(:func:`jaxmem.rasp.conformance.check_spec`). Sizes: ``configs/simulator_rasp_compile.py``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Tuple

from jaxmem.experiments import ExperimentResult, RunContext, Table, register
from jaxmem.results import pyplot

PAPER = "simulator"
# tracr's published points beyond N = 5 (docs/papers/simulator.md): (program, N, params, seconds)
TRACR_LARGE = [("reverse", 80, 26_700_000, 372.0)]


@dataclasses.dataclass(frozen=True)
class RaspCompileSettings:
  """Sizes of ``rasp_compile`` (``configs/simulator_rasp_compile.py``)."""

  programs: Tuple[str, ...]       # names in jaxmem.rasp.programs.PROGRAMS; empty = all
  max_seq_lens: Tuple[int, ...]
  exhaustive_len: int             # every input of length <= this is checked
  n_random: int                   # plus this many random inputs of lengths up to N
  max_params: int                 # larger models are refused (reported as not compiled)
  seed: int


def measure(s: RaspCompileSettings, progress=None) -> list:
  from jaxmem.rasp import conformance, programs
  names = list(s.programs) or list(programs.PROGRAMS)
  unknown = [n for n in names if n not in programs.PROGRAMS]
  if unknown:
    raise ValueError(f"unknown programs {unknown}; choose from {sorted(programs.PROGRAMS)}.")
  rows = []
  for name in names:
    spec = programs.PROGRAMS[name]
    for N in s.max_seq_lens:
      if not spec.lengths(N):
        rows.append({"name": name, "max_seq_len": N, "skipped": f"accepts no length <= {N}"})
        continue
      t0 = time.perf_counter()
      try:
        c = conformance.check_spec(spec, N, exhaustive_len=s.exhaustive_len, n_random=s.n_random,
                                   seed=s.seed, max_params=s.max_params)
        row = c.row()
        row["example"] = None if c.example is None else repr(c.example)[:200]
      except ValueError as e:   # a size the compiler refuses (documented limits)
        row = {"name": name, "max_seq_len": N, "skipped": str(e)[:200]}
      row["wall_s"] = time.perf_counter() - t0
      rows.append(row)
      if progress:
        progress(row)
  return rows


@register("rasp_compile", paper=PAPER,
          description="RASP library compiled to exact hard-attention models: size, compile time, exactness.",
          config="simulator_rasp_compile", settings=RaspCompileSettings)
def run(ctx: RunContext, s: RaspCompileSettings) -> ExperimentResult:
  from jaxmem.rasp import programs
  t0 = time.perf_counter()
  rows = measure(s, (lambda r: print(f"  {r['name']} N={r['max_seq_len']}: "
                                     f"{'skipped' if 'skipped' in r else str(r['wrong']) + ' wrong'}",
                                     flush=True)) if ctx.progress else None)
  done = [r for r in rows if "skipped" not in r]
  total_inputs = sum(r["inputs"] for r in done)
  total_wrong = sum(r["wrong"] for r in done)
  table = [[r["name"], r["max_seq_len"], r["layers"], r["heads"], r["residual_width"],
            f"{r['params']:,}", f"{r['compile_s']:.2f}", r["inputs"], r["wrong"],
            f"{r['max_abs_err']:.1e}"] for r in done]
  skipped = [[r["name"], r["max_seq_len"], r["skipped"]] for r in rows if "skipped" in r]
  vs_tracr = []
  for r in done:
    t = programs.PROGRAMS[r["name"]].tracr
    if r["max_seq_len"] == 5 and t is not None:
      vs_tracr.append([r["name"], f"{t[0]} / {r['layers']}", f"{t[1]} / {r['heads']}",
                       f"{t[2]} / {r['residual_width']}", f"{t[3]:,} / {r['params']:,}",
                       "yes" if r["residual_width"] <= t[2] else "NO",
                       "yes" if r["params"] <= t[3] else "NO"])
  for prog, N, params, _ in TRACR_LARGE:
    mine = [r for r in done if r["name"] == prog and r["max_seq_len"] == N]
    if mine:
      vs_tracr.append([f"{prog} (N = {N})", "—", "—", "—", f"{params:,} / {mine[0]['params']:,}",
                       "—", "yes" if mine[0]["params"] <= params else "NO"])
  tables = [
      Table("Compiled size, compile time and exactness (compiled vs interpreted)",
            ["program", "N", "layers", "heads/layer", "residual width", "params", "compile s",
             "inputs checked", "wrong", "max |err| (numerical)"], table),
      Table("Against tracr at N = 5 (tracr / jaxmem)",
            ["program", "layers", "heads/layer", "residual width", "params", "width ≤ tracr",
             "params ≤ tracr"], vs_tracr),
  ]
  if skipped:
    tables.append(Table("Not compiled", ["program", "N", "why"], skipped))
  figure = _plot(ctx, done)
  seconds = time.perf_counter() - t0
  notes = [
      f"Inputs: every accepted input of length ≤ {s.exhaustive_len} plus {s.n_random} random "
      "accepted inputs per (program, N), lengths uniform in the program's domain up to N. "
      "'wrong' counts inputs where any output differs (categorical: not identical; numerical: "
      "|err| > 1e-6 with the interpreter's None read as 0).",
      "params counts every entry of every dense weight array, zeros included (embeddings, "
      "W_Q/W_K/W_V/W_O per head padded to a common width, MLP weights and biases).",
      "compile s: rasp.compile up to a runnable NNX model (graph passes, value sets, weights), "
      "on this machine's CPU; jit compilation of the forward pass happens at first apply and "
      "is not included (tracr's 372 s is its own compile_rasp_to_model).",
      f"Wall time {seconds:.0f} s.",
  ]
  return ExperimentResult(
      summary=f"{len(done)} (program, N) pairs compiled; {total_wrong} of {total_inputs:,} checked "
              "inputs disagree with the interpreter",
      tables=tables, figures=[figure], notes=notes,
      metrics={"wrong": total_wrong, "inputs": total_inputs, "seconds": seconds,
               "rows": [{k: v for k, v in r.items() if k != "example"} for r in rows]})


def _plot(ctx: RunContext, rows: list) -> str:
  from jaxmem.rasp import programs
  plt = pyplot()
  fig, (ax_p, ax_t) = plt.subplots(1, 2, figsize=(11, 4))
  names = sorted({r["name"] for r in rows})
  for name in names:
    rs = sorted((r for r in rows if r["name"] == name), key=lambda r: r["max_seq_len"])
    N = [r["max_seq_len"] for r in rs]
    line, = ax_p.plot(N, [r["params"] for r in rs], marker="o", ms=3, lw=1, label=name)
    ax_t.plot(N, [max(r["compile_s"], 1e-3) for r in rs], marker="o", ms=3, lw=1, color=line.get_color())
    t = programs.PROGRAMS[name].tracr
    if t is not None:
      ax_p.scatter([5], [t[3]], marker="x", s=30, color=line.get_color())
  for prog, N, params, secs in TRACR_LARGE:
    ax_p.scatter([N], [params], marker="x", s=50, color="k", label=f"tracr {prog}")
    ax_t.scatter([N], [secs], marker="x", s=50, color="k", label=f"tracr {prog}")
  for ax, title in ((ax_p, "parameters (x: tracr's published)"), (ax_t, "compile time, s")):
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("max_seq_len N")
    ax.set_title(title)
  ax_p.legend(fontsize=6, ncol=2)
  return ctx.save_figure(fig, "rasp_compile.png", dpi=120)



