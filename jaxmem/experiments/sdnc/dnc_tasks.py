"""DNC vs Transformer (= sDNC) vs the hybrids on copy, repeat copy and associative recall.

The Tang & Xie (2026) reading (``docs/papers/sdnc.md``, claim 4) predicts where attention
falls short of a DNC: no selective write, no erase, no temporal links. Each model is trained
on short instances (lengths ≤ L) and evaluated in range and at 2L, 3L, 4L (length
generalisation). The Transformer row is also the sDNC row: its trained weights are re-run as
:class:`~jaxmem.models.SDNCTransformer` (write-once memory reads) and the report gives the
largest output difference, which should be float round-off.

Sizes: ``configs/sdnc_dnc_tasks.py`` (:class:`DNCTasksSettings`); loss
:func:`jaxmem.train.losses.sequence_loss`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxmem.data.batches import KeyedBatches
from jaxmem.experiments import ExperimentResult, RunContext, Table, register
from jaxmem.models import (
  DNC,
  DNCConfig,
  SDNCHybridConfig,
  SDNCTransformer,
  SoftmaxConfig,
  TransformerConfig,
  TransformerLM,
  copy_params,
)
from jaxmem.results import pyplot
from jaxmem.tasks import algorithmic as tasks
from jaxmem.train import TrainConfig, TrainTask, apply_model, read_metrics, sequence_loss, train

TASKS = ("copy", "repeat_copy", "associative_recall")
MODELS = ("dnc", "transformer", "+write_gate", "+erase", "+link_reads", "+all_three")
EVAL_BATCH = 32


@dataclasses.dataclass(frozen=True)
class DNCSizes:
  """The DNC's sizes (:class:`~jaxmem.models.DNCConfig`; its input / output widths come from the task)."""

  memory_size: int
  word_size: int
  num_reads: int
  hidden_size: int


@dataclasses.dataclass(frozen=True)
class DNCTasksSettings:
  """Tasks, their training ranges, model sizes and the training budget per (task, model) pair."""

  tasks: tuple          # names from TASKS, run in this order
  num_bits: int         # bits per vector, every task
  copy_length: int      # copy: lengths 1 … copy_length in training (L)
  repeat_length: int    # repeat copy: lengths 1 … repeat_length, 1 … max_repeats repeats
  max_repeats: int
  norm_max: int         # repeat copy's repeat-count normaliser
  item_length: int      # associative recall: items of item_length vectors, 2 … max_items items
  max_items: int
  d_model: int          # the Transformers: 2 layers, 4 heads, d_ff = 2·d_model, sinusoidal positions
  dnc: DNCSizes
  n_steps: int
  batch_size: int
  lr: float
  log_every: int
  eval_batches: tuple   # (in range, per longer length), batches of EVAL_BATCH
  models: tuple = MODELS       # names from MODELS, run in this order (the sDNC row re-runs "transformer")
  longer: tuple = (2, 3, 4)    # the longer lengths scored, as multiples k of L (the table's kL columns)

  def __post_init__(self):
    for name in ("tasks", "eval_batches", "models", "longer"):
      object.__setattr__(self, name, tuple(getattr(self, name)))
    unknown = [t for t in self.tasks if t not in TASKS]
    if unknown or not self.tasks:
      raise ValueError(f"dnc_tasks: tasks must be a non-empty subset of {TASKS}, got {self.tasks!r}.")
    unknown = [m for m in self.models if m not in MODELS]
    if unknown or not self.models:
      raise ValueError(f"dnc_tasks: models must be a non-empty subset of {MODELS}, got {self.models!r}.")
    if not self.longer or any(not isinstance(k, int) or k < 2 for k in self.longer):
      raise ValueError(f"dnc_tasks: longer must be a non-empty tuple of integers ≥ 2, got {self.longer!r}.")
    if len(self.eval_batches) != 2:
      raise ValueError(f"dnc_tasks: eval_batches must be (in range, per longer length), "
                       f"got {self.eval_batches!r}.")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A task, its training range and how to scale it to 2L–4L."""

  fn: Callable
  train_kwargs: dict
  length_key: tuple  # (min_name, max_name) of the size that is generalised
  io: tuple          # (input_dim, output_dim)

  def kwargs_at(self, size: int | None, batch_size: int) -> dict:
    kw = dict(self.train_kwargs, batch_size=batch_size)
    if size is not None:
      lo, hi = self.length_key
      kw[lo] = kw[hi] = size
    return kw

  def stream(self, seed: int, batch_size: int, size: int | None = None) -> KeyedBatches:
    """Resumable batches (``observations / targets / mask``) of the training range, or of
    exactly ``size`` when given."""
    return KeyedBatches(self.fn, seed, **self.kwargs_at(size, batch_size))


def task_specs(s: DNCTasksSettings) -> dict:
  """``{task name: TaskSpec}`` for ``s.tasks``, in that order."""
  bits = s.num_bits
  specs = {
      "copy": TaskSpec(tasks.copy_task, dict(num_bits=bits, min_length=1, max_length=s.copy_length),
                       ("min_length", "max_length"), (bits + 1, bits)),
      "repeat_copy": TaskSpec(
          tasks.repeat_copy, dict(num_bits=bits, min_length=1, max_length=s.repeat_length, min_repeats=1,
                                  max_repeats=s.max_repeats, norm_max=s.norm_max),
          ("min_length", "max_length"), (bits + 2, bits + 1)),
      "associative_recall": TaskSpec(
          tasks.associative_recall, dict(num_bits=bits, item_length=s.item_length, min_items=2,
                                         max_items=s.max_items),
          ("min_items", "max_items"), (bits + 2, bits)),
  }
  return {name: specs[name] for name in s.tasks}


def model_builders(s: DNCTasksSettings, max_test_len: int) -> dict:
  d = s.d_model
  base = TransformerConfig(d_model=d, n_layers=2, n_heads=4, d_ff=2 * d, max_len=max_test_len,
                           positions="sinusoidal", tie_embeddings=False)
  def transformer(**flags):
    return lambda io, rngs: TransformerLM(
        dataclasses.replace(base, input_dim=io[0], output_dim=io[1],
                            mixer=SDNCHybridConfig(**flags) if flags else SoftmaxConfig()), rngs=rngs)
  dnc_cfg = dataclasses.asdict(s.dnc)
  builders = {
      "dnc": lambda io, rngs: DNC(DNCConfig(input_dim=io[0], output_dim=io[1], **dnc_cfg), rngs=rngs),
      "transformer": transformer(),
      "+write_gate": transformer(write_gate=True),
      "+erase": transformer(erase=True),
      "+link_reads": transformer(link_reads=True),
      "+all_three": transformer(write_gate=True, erase=True, link_reads=True),
  }
  return {name: builders[name] for name in s.models}


def _logits(model, x: jax.Array) -> jax.Array:
  return model(x)


def _bit_errors(model, batch: dict) -> tuple:
  """(wrong bits at masked steps, masked bits) of one batch."""
  logits = model(batch["observations"])
  wrong = ((logits > 0) != (batch["targets"] > 0.5)) * batch["mask"][..., None]
  return wrong.sum(), batch["mask"].sum() * batch["targets"].shape[-1]


def evaluate(model, spec: TaskSpec, size: int | None, n_batches: int, batch_size: int, seed: int) -> float:
  stream = spec.stream(seed, batch_size, size)
  wrong = total = 0.0
  for i in range(n_batches):
    w, t = apply_model(_bit_errors, model, stream.batch_at(i))
    wrong, total = wrong + float(w), total + float(t)
  return wrong / max(total, 1.0)


@register("dnc_tasks", paper="sdnc",
          description="DNC vs Transformer(=sDNC) vs hybrids: copy, repeat copy, associative recall; "
                      "length generalisation to 2L-4L.",
          config="sdnc_dnc_tasks", settings=DNCTasksSettings)
def run(ctx: RunContext, s: DNCTasksSettings) -> ExperimentResult:
  specs = task_specs(s)
  n_steps, batch = s.n_steps, s.batch_size
  cfg = TrainConfig(n_steps=n_steps, lr=s.lr, warmup_steps=min(100, n_steps // 10),
                    min_lr_ratio=0.1, weight_decay=0.0, grad_clip=10.0,
                    ckpt_every=max(1, n_steps // 5), keep_checkpoints=1, log_every=s.log_every)
  sizes = {name: spec.train_kwargs[spec.length_key[1]] for name, spec in specs.items()}
  max_test = max(2 * (max(s.longer) * size) + 20 for size in sizes.values())
  builders = model_builders(s, max_test_len=max_test)
  results, curves, notes = {}, {}, []
  for task_name, spec in specs.items():
    L = sizes[task_name]
    for model_name in builders:
      t0 = time.perf_counter()
      workdir = ctx.outdir / task_name / model_name.strip("+")
      task = TrainTask(init_model=lambda rngs, b=builders[model_name], io=spec.io: b(io, rngs),
                       loss_fn=sequence_loss, train_iter=spec.stream(0, batch))
      res = train(task, cfg, workdir, progress=ctx.progress)
      n_in, n_out = s.eval_batches
      row = {"train": evaluate(res.model, spec, None, n_in, EVAL_BATCH, seed=10_000)}
      for k in s.longer:
        row[f"{k}L"] = evaluate(res.model, spec, k * L, n_out, EVAL_BATCH, seed=20_000 + k)
      row["seconds"] = time.perf_counter() - t0
      results[(task_name, model_name)] = row
      curves[(task_name, model_name)] = [(r["step"], r["bit_error"]) for r in read_metrics(
          workdir / "metrics.jsonl") if "bit_error" in r]
      if model_name == "transformer":
        sdnc = SDNCTransformer(res.model.cfg, rngs=nnx.Rngs(0))
        copy_params(res.model, sdnc)
        x = jnp.asarray(spec.stream(7, 8).batch_at(0)["observations"])
        diff = float(jnp.max(jnp.abs(apply_model(_logits, sdnc, x) - apply_model(_logits, res.model, x))))
        notes.append(f"{task_name}: trained Transformer re-run as SDNCTransformer (write-once memory "
                     f"reads): max |Δ logits| = {diff:.2e}.")
        results[(task_name, "sDNC (same weights)")] = dict(row, seconds=float("nan"), max_abs_diff=diff)

  longer = [f"{k}L" for k in s.longer]
  table_rows = []
  for (task_name, model_name), r in results.items():
    table_rows.append([task_name, model_name] + [f"{100 * r[k]:.2f}%" for k in ("train", *longer)]
                      + ["—" if np.isnan(r["seconds"]) else f"{r['seconds']:.0f}"])
  (ctx.outdir / "results.json").write_text(json.dumps(
      {f"{t}/{m}": {k: v for k, v in r.items()} for (t, m), r in results.items()}, indent=2))
  figure = _plot(ctx, curves, specs)
  first = next(iter(specs))   # copy, unless the settings leave it out
  lead = s.models[0]          # the DNC, unless the settings leave it out
  return ExperimentResult(
      summary=f"{_SHORT.get(lead, lead)} {first} bit error {100 * results[(first, lead)]['train']:.2f}% in "
              f"range; see table for {longer[0]}-{longer[-1]}",
      tables=[Table("Bit error rate (lower is better); in-range and length generalisation",
                    ["task", "model", "≤L (train range)", *longer, "train s"], table_rows)],
      figures=[figure],
      notes=notes + [f"L: {sizes}; {n_steps} steps, batch {batch}, AdamW lr {cfg.lr}; evaluation on "
                     f"fresh seeds ({s.eval_batches[0]}×{EVAL_BATCH} in range, "
                     f"{s.eval_batches[1]}×{EVAL_BATCH} per longer length)."],
      metrics={f"{t}/{m}": r for (t, m), r in results.items()},
  )


_SHORT = {"dnc": "DNC", "transformer": "Transformer"}


def _plot(ctx: RunContext, curves: dict, specs: dict) -> str:
  plt = pyplot()
  fig, axes = plt.subplots(1, len(specs), figsize=(4.2 * len(specs), 3.4), squeeze=False)
  for ax, task_name in zip(axes[0], specs, strict=True):
    for (t, m), pts in curves.items():
      if t == task_name and pts:
        ax.plot(*zip(*pts, strict=True), label=m, lw=1)
    ax.set_title(task_name)
    ax.set_xlabel("step")
    ax.set_ylabel("train bit error")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(0, 0.6)
  axes[0][0].legend(fontsize=7)
  return ctx.save_figure(fig, "learning_curves.png", dpi=110)
