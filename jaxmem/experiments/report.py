"""Runs registered experiments and writes ``REPORT.md`` (tables + PNG figures)."""

from __future__ import annotations

import datetime
import json
import pathlib
import platform
import time
import traceback
from typing import Any, Mapping, Optional, Sequence

import jax

from jaxmem.experiments import ExperimentResult, RunContext, SkipExperiment, load_all
from jaxmem.results import markdown_table


def split_overrides(overrides: Sequence[str], names: Sequence[str]) -> dict:
  """``--config.<experiment>.<field>=v`` -> ``{experiment: ["<field>=v", ...]}``."""
  out: dict = {n: [] for n in names}
  for item in overrides:
    text = item[len("--config."):] if item.startswith("--config.") else item
    exp, _, rest = text.partition(".")
    if exp not in out or not rest:
      raise ValueError(f"override {item!r} must look like --config.<experiment>.<field>=value with "
                       f"<experiment> one of the experiments being run: {list(names)}.")
    out[exp].append(rest)
  return out


def reproduce(outdir: str | pathlib.Path, *, quick: bool, only: Optional[Sequence[str]] = None,
              progress: bool = True, echo=print, overrides: Sequence[str] = (),
              configs: Optional[Mapping[str, Any]] = None) -> dict:
  """Runs experiments (all, or ``only``), writes ``outdir/REPORT.md``; returns statuses.

  Each experiment runs with its config file's ``quick`` or full settings, with ``overrides``
  (``--config.<experiment>.<field>=value``) applied, unless ``configs`` gives its settings."""
  registry = load_all()
  names = list(registry) if not only else list(only)
  unknown = [n for n in names if n not in registry]
  if unknown:
    raise ValueError(f"`--only` names unknown experiment(s) {unknown}; known: {sorted(registry)}.")
  configs = dict(configs or {})
  stray = sorted(set(configs) - set(names))
  if stray:
    raise ValueError(f"`configs` given for experiment(s) {stray} that are not being run ({names}).")
  per_exp = split_overrides(overrides, names)
  settings = {n: configs[n] if n in configs else registry[n].load_config(quick, per_exp[n]) for n in names}
  outdir = pathlib.Path(outdir).expanduser().resolve()
  from jaxmem.train.loop import prepare_workdir
  prepare_workdir(outdir)

  sections, status = [], {}
  for name in names:
    exp = registry[name]
    ctx = RunContext(quick=quick, outdir=outdir / name, report_dir=outdir, progress=progress)
    ctx.outdir.mkdir(parents=True, exist_ok=True)
    echo(f"== {name}: {exp.description}")
    t0 = time.perf_counter()
    try:
      res: ExperimentResult = exp.run(ctx, settings[name])
      status[name] = {"status": "ok", "summary": res.summary, "metrics": res.metrics}
      sections.append(_section(exp, res, time.perf_counter() - t0))
      echo(f"   ok: {res.summary}")
    except SkipExperiment as e:
      status[name] = {"status": "skipped", "reason": e.reason, "fix": e.fix}
      sections.append(f"## {name}\n\n**Skipped:** {e.reason}\n\n**Fix:** {e.fix}\n")
      echo(f"   skipped: {e.reason}")
    except Exception as e:  # noqa: BLE001 - one failing experiment must not hide the others
      status[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
      sections.append(f"## {name}\n\n**Failed:** `{type(e).__name__}: {e}`\n\n"
                      f"```\n{traceback.format_exc(limit=8)}```\n")
      echo(f"   FAILED: {type(e).__name__}: {e}")

  overview = markdown_table(
      ["experiment", "status", "result"],
      [[n, s["status"], s.get("summary") or s.get("reason") or s.get("error", "")]
       for n, s in status.items()],
  )
  header = (
      f"# jaxmem reproduction report ({'quick' if quick else 'full'})\n\n"
      f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} · jax {jax.__version__} · "
      f"{jax.device_count()}× {jax.devices()[0].platform} · python {platform.python_version()}\n\n"
      f"{overview}\n"
  )
  if jax.process_index() == 0:  # multi-process: every process runs the experiments, process 0 reports
    (outdir / "REPORT.md").write_text(header + "\n" + "\n".join(sections))
    (outdir / "results.json").write_text(json.dumps(status, indent=2))
  return status


def _section(exp, res: ExperimentResult, seconds: float) -> str:
  parts = [f"## {exp.name}\n\n_{exp.description}_ (paper: {exp.paper}; {seconds:.0f} s)\n",
           f"**Result:** {res.summary}\n"]
  for t in res.tables:
    parts.append(f"### {t.title}\n\n{markdown_table(t.headers, t.rows)}\n")
  for f in res.figures:
    parts.append(f"![{pathlib.Path(f).stem}]({f})\n")
  if res.notes:
    parts.append("\n".join(f"- {n}" for n in res.notes) + "\n")
  return "\n".join(parts)
