"""Shared by the Pavlovian experiment tests: settings from the config files, a run context, and a
way to keep the raw data an experiment summarised."""

import dataclasses
import pathlib

import numpy as np

from jaxmem.experiments import REGISTRY, RunContext


def quick_settings(name: str, **changes):
  """Experiment ``name``'s quick config (``configs/<config>.py:quick``) with ``changes`` replaced; its module
  must be imported (it registers itself)."""
  return dataclasses.replace(REGISTRY[name].load_config(True), **changes)


def make_ctx(tmp_path: pathlib.Path, name: str) -> RunContext:
  (tmp_path / name).mkdir()
  return RunContext(quick=True, outdir=tmp_path / name, report_dir=tmp_path, progress=False)


def capture(monkeypatch, module, name: str) -> list:
  """Wraps ``module.name`` so that what it returns while an experiment runs is kept: ``[(args, result)]``, the
  raw data the experiment summarised (no recomputation, so no extra runtime)."""
  calls, orig = [], getattr(module, name)

  def wrapped(*args, **kwargs):
    out = orig(*args, **kwargs)
    calls.append((args, out))
    return out

  monkeypatch.setattr(module, name, wrapped)
  return calls


def run_capturing(tmp_path_factory, module, name: str, settings, captured: str) -> tuple:
  """One run of experiment ``name`` (``module.run``) in a fresh directory, recording the calls of
  ``module.<captured>`` (:func:`capture`): returns (its result, the report dir, the recorded calls)."""
  import pytest
  tmp_path = tmp_path_factory.mktemp(name)
  with pytest.MonkeyPatch.context() as mp:
    raw = capture(mp, module, captured)
    res = module.run(make_ctx(tmp_path, name), settings)
  return res, tmp_path, raw


def first_failure_n(n, ok) -> int:
  """Largest n with ok there and at every smaller n (0 if the first already fails), as a plain loop."""
  best = 0
  for n_i, ok_i in zip(n, ok, strict=True):
    if not ok_i:
      break
    best = int(n_i)
  return best


def ls_slope(x, y) -> float:
  """Least-squares slope of y on x (closed form)."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  return float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))


def keep_trained_models(monkeypatch, module) -> dict:
  """Wraps ``module.train_recall`` so every model the experiment trains is kept, by work-dir name, for the
  test to re-evaluate independently of the experiment's own summary."""
  trained, train_recall = {}, module.train_recall

  def keep(mcfg, stream, cfg, workdir, progress):
    trained[workdir.name] = model = train_recall(mcfg, stream, cfg, workdir, progress)
    return model

  monkeypatch.setattr(module, "train_recall", keep)
  return trained
