"""Registered experiments for ``jaxmem reproduce``.

An experiment is ``run(ctx) -> ExperimentResult``: it trains / measures what one paper
claim needs and returns tables, figures and notes; :mod:`jaxmem.experiments.report`
assembles them into ``REPORT.md``. Raise :class:`SkipExperiment` (with the reason and
the fix) when something it needs, such as a corpus, is missing.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Callable


class SkipExperiment(Exception):
  """An experiment cannot run here; ``reason`` and ``fix`` go into the report."""

  def __init__(self, reason: str, fix: str = ""):
    super().__init__(reason)
    self.reason, self.fix = reason, fix


@dataclasses.dataclass
class Table:
  title: str
  headers: list
  rows: list


@dataclasses.dataclass
class ExperimentResult:
  summary: str
  tables: list = dataclasses.field(default_factory=list)
  figures: list = dataclasses.field(default_factory=list)  # PNG paths relative to the out dir
  notes: list = dataclasses.field(default_factory=list)
  metrics: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RunContext:
  quick: bool
  outdir: pathlib.Path   # this experiment's own folder
  report_dir: pathlib.Path
  progress: bool = True

  def save_figure(self, fig, filename: str, dpi: int = 110) -> str:
    """Lays out, saves and closes a matplotlib figure in this experiment's folder; returns its
    path relative to the report (what ``ExperimentResult.figures`` holds)."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    path = self.outdir / filename
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return str(path.relative_to(self.report_dir))


@dataclasses.dataclass(frozen=True)
class Experiment:
  name: str
  paper: str
  description: str
  run: Callable[[RunContext], ExperimentResult]


REGISTRY: dict = {}


def register(name: str, paper: str, description: str):
  def wrap(fn):
    if name in REGISTRY:
      raise ValueError(f"experiment {name!r} registered twice.")
    REGISTRY[name] = Experiment(name, paper, description, fn)
    return fn
  return wrap


def load_all() -> dict:
  """Imports every experiment module (each registers itself) and returns the registry."""
  from jaxmem.experiments import depth_width, dnc_tasks, lm_baseline, mqar, pavlovian, pavlovian_depth  # noqa: F401
  return REGISTRY
