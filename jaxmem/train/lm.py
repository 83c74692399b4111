"""Language modelling on byte corpora: bits-per-byte evaluation and a train entry point (the loss
is :func:`jaxmem.train.losses.lm_loss`)."""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import pathlib
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem import config_files, distributed
from jaxmem import sharding as jaxmem_sharding
from jaxmem.data import RandomWindows, eval_windows, load_corpus
from jaxmem.data.corpora import Corpus
from jaxmem.data.packing import PackedDocuments, split_documents
from jaxmem.models import bodies
from jaxmem.train import loop
from jaxmem.train.config import LMConfig
from jaxmem.train.losses import LN2, lm_loss, token_nll, with_ponder_cost


@functools.partial(jax.jit, static_argnums=0)
def _masked_nll_sum(graphdef, state, batch):
  """Summed masked NLL of one batch; jitted once per model structure (graphdef is static)."""
  nll = token_nll(nnx.merge(graphdef, state)(batch["inputs"]), batch["targets"])
  return (nll * batch["mask"]).sum(dtype=jnp.float32)


def evaluate_bpb(model: nnx.Module, tokens: np.ndarray, seq_len: int, batch_size: int = 64,
                 max_windows: int = 0, mesh=None) -> dict:
  """Bits per byte over deterministic non-overlapping windows of ``tokens``.

  Every byte after the first is predicted exactly once (or the first ``max_windows``
  windows only, when > 0). Batches are sharded over the ``data`` mesh axis; in a multi-process
  run every process calls this and feeds its own rows of each batch.
  """
  w = eval_windows(tokens, seq_len)
  if max_windows:
    w = {k: v[:max_windows] for k, v in w.items()}
  mesh = loop.make_mesh() if mesh is None else mesh
  n_data, n_proc, proc = mesh.shape["data"], jax.process_count(), jax.process_index()
  step = math.lcm(n_data, n_proc)
  bs = -(-batch_size // step) * step
  n = w["inputs"].shape[0]
  pad = (-n) % bs
  w = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for k, v in w.items()}
  graphdef, state = nnx.split(model)
  on_mesh = set(mesh.devices.flat)
  if any(getattr(x, "sharding", None) is None or x.sharding.device_set != on_mesh
         for x in jax.tree.leaves(state)):
    # e.g. a checkpoint restored onto one device (jaxmem eval): lay it out on the mesh by its logical axes
    state = jaxmem_sharding.put_global(state, jaxmem_sharding.state_shardings(state, mesh))
  sharding = NamedSharding(mesh, P("data"))
  local = bs // n_proc
  total = 0.0
  with jax.set_mesh(mesh):  # the mixers' per-head kernels (jaxmem.sharding.map_heads) see the mesh
    for i in range(0, w["inputs"].shape[0], bs):
      batch = {k: jax.make_array_from_process_local_data(
          sharding, v[i + proc * local:i + (proc + 1) * local], (bs,) + v.shape[1:]) for k, v in w.items()}
      total += float(_masked_nll_sum(graphdef, state, batch))
  count = float(w["mask"].sum())
  return {"nll": total / count, "bpb": total / count / LN2, "n_bytes": int(count)}


def lm_config_from(cfg) -> LMConfig:
  """ConfigDict / dict / LMConfig -> LMConfig (unknown fields raise ValueError)."""
  if isinstance(cfg, LMConfig):
    return cfg
  return config_files.to_dataclass(LMConfig, cfg)


def config_diff(old, new, path: str = "") -> list:
  """The leaves where two config dicts differ, as ``"path: old → new"`` (``<missing>`` for an absent key)."""
  if isinstance(old, dict) and isinstance(new, dict):
    out = []
    for key in sorted(set(old) | set(new), key=str):
      sub = f"{path}.{key}" if path else str(key)
      out += config_diff(old.get(key, _MISSING), new.get(key, _MISSING), sub)
    return out
  if old == new:
    return []
  show = lambda v: "<missing>" if v is _MISSING else repr(v)
  return [f"{path or '<root>'}: {show(old)} → {show(new)}"]


_MISSING = object()


def _check_saved_config(workdir: pathlib.Path, cfg: LMConfig) -> None:
  """The run in ``workdir`` (if any) must have this model and data config; then writes config.json.
  Every process checks; after all agree on the config, process 0 writes."""
  path = workdir / "config.json"
  new = config_files.to_dict(cfg)
  distributed.check_same_config(new, "LM config")
  if path.exists():
    old = json.loads(path.read_text())
    try:  # through the current dataclasses: a field added since the run was saved takes its default
      now = config_files.to_dict(lm_config_from(old))
      old = {**old, **{s: v for s, v in now.items() if s in ("model", "data")}}
    except (ValueError, TypeError):
      pass  # a config this version cannot read at all: compared as saved
    diffs = {s: config_diff(old.get(s), new[s]) for s in ("model", "data")}
    diffs = {s: d for s, d in diffs.items() if d}
    if diffs:
      listed = "; ".join(f"{s}.{d}" for s, ds in diffs.items() for d in ds)
      raise ValueError(f"`workdir` {str(workdir)!r} holds a run with a different {' and '.join(diffs)} config "
                       f"(saved → now: {listed}); use a new workdir.")
  distributed.barrier("jaxmem-config-checked")  # nobody reads config.json while process 0 writes it
  if distributed.is_main():
    path.write_text(json.dumps(new, indent=2))


def train_lm(cfg, workdir, *, corpus: Optional[Corpus] = None, stop_after: Optional[int] = None,
             progress: bool = True, devices=None) -> loop.TrainResult:
  """Trains the byte LM of ``cfg.model`` (any registered body, :mod:`jaxmem.models.bodies`); ``final_metrics``
  gets ``val_bpb`` over the whole split. ``cfg.train.ponder_cost > 0`` adds ACT's ponder cost (a model
  that does not report its ponder raises ``ValueError`` at the first step)."""
  cfg = lm_config_from(cfg)
  workdir = loop.prepare_workdir(workdir)
  if corpus is None:  # before the first collective, so that a host without the corpus fails alone and fast
    corpus = load_corpus(cfg.data.corpus, cfg.data.path)
  _check_saved_config(workdir, cfg)
  mesh = loop.make_mesh(devices, cfg.train.model_axis)
  shard = dict(seed=cfg.train.seed, process_index=jax.process_index(), process_count=jax.process_count())
  if cfg.data.pack:
    if "segment_ids" not in inspect.signature(bodies.lookup(cfg.model.body)[1].__call__).parameters:
      raise ValueError(f"data.pack=True trains on packed documents, which needs a body that takes segment_ids; "
                       f"the {cfg.model.body!r} body does not.")
    train_iter = PackedDocuments(split_documents(corpus["train"], cfg.data.corpus), cfg.data.seq_len,
                                 cfg.data.batch_size, **shard)
  else:
    train_iter = RandomWindows(corpus["train"], cfg.data.seq_len, cfg.data.batch_size, **shard)

  def evaluate(model, step):
    full = step == cfg.train.n_steps
    r = evaluate_bpb(model, corpus["validation"], cfg.data.seq_len, cfg.data.eval_batch_size,
                     0 if full else cfg.data.eval_max_windows, mesh)
    return {"val_bpb": r["bpb"]}

  task = loop.TrainTask(
      init_model=lambda rngs: bodies.build(cfg.model, rngs=rngs),
      loss_fn=with_ponder_cost(lm_loss, cfg.train.ponder_cost) if cfg.train.ponder_cost else lm_loss,
      train_iter=train_iter, evaluate=evaluate,
  )
  return loop.train(task, cfg.train, workdir, stop_after=stop_after, progress=progress,
                    devices=devices)


def load_trained_lm(workdir: str | os.PathLike, step: Optional[int] = None) -> tuple:
  """(model, LMConfig, step) from a training workdir's config.json and latest checkpoint (or ``step``), for
  every body (:mod:`jaxmem.models.bodies`); the model is in eval mode (no dropout)."""
  workdir = pathlib.Path(workdir).expanduser().resolve()
  cfg_path = workdir / "config.json"
  if not cfg_path.exists():
    raise ValueError(f"`workdir` {str(workdir)!r} has no config.json: not a jaxmem training run.")
  cfg = lm_config_from(json.loads(cfg_path.read_text()))
  from jaxmem.train.checkpoint import Checkpointer
  ckpt = Checkpointer(workdir / "checkpoints", keep=cfg.train.keep_checkpoints)
  step = ckpt.latest_step() if step is None else step
  if step is None:
    raise ValueError(f"`workdir` {str(workdir)!r} has no checkpoint yet.")
  model = bodies.build(cfg.model, rngs=nnx.Rngs(cfg.train.seed))
  model.eval()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = loop.make_optimizer(cfg.train)
  target = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
  state, _ = ckpt.restore(step, target)
  ckpt.close()
  return nnx.merge(graphdef, state["params"], rest), cfg, step
