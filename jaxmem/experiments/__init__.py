"""Registered experiments for ``jaxmem reproduce``, one package per paper.

``experiments/<paper>/<claim>.py`` holds one experiment: ``run(ctx, cfg) -> ExperimentResult``
over library code, registered with :func:`register`. Its sizes live in a config file,
``configs/<paper>_<experiment>.py``, whose ``get_config("quick" | "full")`` returns a
``ConfigDict`` that becomes the experiment's frozen settings dataclass at the edge
(:meth:`Experiment.load_config`), so ``jaxmem reproduce --config.<experiment>.<field>=v``
and the tests pass a config instead of patching module functions.
:mod:`jaxmem.experiments.report` assembles the results into ``REPORT.md``. Raise
:class:`SkipExperiment` (with the reason and the fix) when something it needs, such as a
corpus, is missing.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import pkgutil
from typing import Any, Callable, Optional, Sequence

from jaxmem.results import Table, save_figure

__all__ = ["REGISTRY", "Experiment", "ExperimentResult", "RunContext", "SkipExperiment", "Table", "load_all",
           "register"]


class SkipExperiment(Exception):
  """An experiment cannot run here; ``reason`` and ``fix`` go into the report."""

  def __init__(self, reason: str, fix: str = ""):
    super().__init__(reason)
    self.reason, self.fix = reason, fix


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
    return str(save_figure(fig, self.outdir / filename, dpi).relative_to(self.report_dir))


@dataclasses.dataclass(frozen=True)
class Experiment:
  """``name`` (what ``--only`` takes), the paper it belongs to, the config file holding its
  sizes (``configs/<config>.py``) and the settings dataclass that file's dicts become."""

  name: str
  paper: str
  description: str
  run: Callable[[RunContext, Any], ExperimentResult]
  config: str
  settings: type

  def load_config(self, quick: bool, overrides: Sequence[str] = ()) -> Any:
    """The settings for ``quick`` (else full) size, with ``a.b=value`` overrides applied."""
    from jaxmem import config_files
    cd = config_files.load_config(f"{self.config}:{'quick' if quick else 'full'}")
    cd = config_files.apply_overrides(cd, overrides)
    return config_files.to_dataclass(self.settings, cd, self.name)


REGISTRY: dict = {}


def register(name: str, *, paper: str, description: str, config: str, settings: type):
  """Decorator registering ``run(ctx, cfg)`` as experiment ``name``."""
  if not dataclasses.is_dataclass(settings):
    raise ValueError(f"experiment {name!r}: settings must be a dataclass, got {settings!r}.")

  def wrap(fn):
    if name in REGISTRY:
      raise ValueError(f"experiment {name!r} registered twice.")
    REGISTRY[name] = Experiment(name, paper, description, fn, config, settings)
    return fn
  return wrap


def load_all() -> dict:
  """Imports every experiment module (each registers itself) and returns the registry."""
  for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
    importlib.import_module(info.name)
  return REGISTRY


def get(name: str) -> Experiment:
  registry = load_all()
  if name not in registry:
    raise ValueError(f"unknown experiment {name!r}; known: {sorted(registry)}.")
  return registry[name]


def run_experiment(name: str, ctx: RunContext, cfg: Optional[Any] = None) -> ExperimentResult:
  """Runs experiment ``name`` with ``cfg`` (default: its config file at ``ctx.quick`` size)."""
  exp = get(name)
  return exp.run(ctx, exp.load_config(ctx.quick) if cfg is None else cfg)
