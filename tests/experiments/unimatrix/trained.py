"""What the UniMatrix experiment tests share: the models an experiment trains, kept by work-dir tag (the name's
part before the first ``-``), so that a test can recount a reported number from the very model."""

from __future__ import annotations


def keep_models(monkeypatch, module) -> dict:
  """Wraps ``module.train_on_stream``: ``{tag: model}`` of every run."""
  kept, orig = {}, module.train_on_stream

  def wrapped(init, stream, n_steps, lr, workdir, progress, **kw):
    model, history = orig(init, stream, n_steps, lr, workdir, progress, **kw)
    kept[workdir.name.split("-")[0]] = model
    return model, history

  monkeypatch.setattr(module, "train_on_stream", wrapped)
  return kept


def keep_trained(monkeypatch, module, record=lambda result, task, cfg: result.model,
                 key=lambda workdir, cfg: workdir.name.split("-")[0]) -> dict:
  """Wraps ``module.train``: ``{key(workdir, cfg): record(result, task, cfg)}`` of every run (by default the
  model under its tag)."""
  kept, orig = {}, module.train

  def wrapped(task, cfg, workdir, **kw):
    result = orig(task, cfg, workdir, **kw)
    kept[key(workdir, cfg)] = record(result, task, cfg)
    return result

  monkeypatch.setattr(module, "train", wrapped)
  return kept
