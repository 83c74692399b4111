"""DNC vs Transformer (= sDNC) vs the hybrids on copy, repeat copy and associative recall.

The Tang & Xie (2026) reading predicts where attention falls short of a DNC: no
selective write, no erase, no temporal links. Each model is trained on short instances
(lengths ≤ L) and evaluated in range and at 2L, 3L, 4L (length generalisation). The
Transformer row is also the sDNC row: its trained weights are re-run as
:class:`~jaxmem.models.SDNCTransformer` (write-once memory reads) and the report gives the
largest output difference, which should be float round-off.
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
from jaxmem.models import DNC, DNCConfig, SDNCTransformer, TransformerConfig, TransformerLM, copy_params
from jaxmem.tasks import algorithmic as tasks
from jaxmem.train import TrainConfig, TrainTask, read_metrics, train

# Algorithmic-task batches at positions of a seed (resumable); fields observations/targets/mask.
TaskStream = KeyedBatches


def sequence_loss(model, batch):
  logits = model(batch["observations"])
  loss = tasks.masked_sigmoid_cross_entropy(logits, batch["targets"], batch["mask"])
  return loss, {"bit_error": tasks.bit_error_rate(logits, batch["targets"], batch["mask"])}


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


def task_specs(quick: bool) -> dict:
  L = 6 if quick else 10
  bits = 6
  return {
      "copy": TaskSpec(tasks.copy_task, dict(num_bits=bits, min_length=1, max_length=L),
                       ("min_length", "max_length"), (bits + 1, bits)),
      "repeat_copy": TaskSpec(
          tasks.repeat_copy, dict(num_bits=bits, min_length=1, max_length=max(2, L // 2), min_repeats=1,
                                  max_repeats=2 if quick else 3, norm_max=10),
          ("min_length", "max_length"), (bits + 2, bits + 1)),
      "associative_recall": TaskSpec(
          tasks.associative_recall, dict(num_bits=bits, item_length=2 if quick else 3, min_items=2,
                                         max_items=4 if quick else 6),
          ("min_items", "max_items"), (bits + 2, bits)),
  }


def run_settings(quick: bool) -> dict:
  """Training budget per (task, model) pair."""
  if quick:
    return {"n_steps": 1500, "batch_size": 16, "lr": 3e-3, "log_every": 25, "eval_batches": (8, 4)}
  return {"n_steps": 20000, "batch_size": 32, "lr": 1e-3, "log_every": 100, "eval_batches": (16, 8)}


def model_builders(quick: bool, max_test_len: int) -> dict:
  d = 48 if quick else 128
  base = TransformerConfig(d_model=d, n_layers=2, n_heads=4, d_ff=2 * d, max_len=max_test_len,
                           positions="sinusoidal", tie_embeddings=False)
  def transformer(**flags):
    return lambda io, rngs: TransformerLM(
        dataclasses.replace(base, input_dim=io[0], output_dim=io[1], **flags), rngs=rngs)
  dnc_cfg = dict(memory_size=64 if quick else 128, word_size=16 if quick else 32,
                 num_reads=1 if quick else 4, hidden_size=64 if quick else 256)
  return {
      "dnc": lambda io, rngs: DNC(DNCConfig(input_dim=io[0], output_dim=io[1], **dnc_cfg), rngs=rngs),
      "transformer": transformer(),
      "+write_gate": transformer(write_gate=True),
      "+erase": transformer(erase=True),
      "+link_reads": transformer(link_reads=True),
      "+all_three": transformer(write_gate=True, erase=True, link_reads=True),
  }


def evaluate(model, spec: TaskSpec, size: int | None, n_batches: int, batch_size: int, seed: int) -> float:
  stream = TaskStream(spec.fn, seed, **spec.kwargs_at(size, batch_size))
  graphdef, state = nnx.split(model)

  @jax.jit
  def errs(state, batch):
    m = nnx.merge(graphdef, state)
    logits = m(batch["observations"])
    wrong = ((logits > 0) != (batch["targets"] > 0.5)) * batch["mask"][..., None]
    return wrong.sum(), batch["mask"].sum() * batch["targets"].shape[-1]

  wrong = total = 0.0
  for i in range(n_batches):
    w, t = errs(state, stream.batch_at(i))
    wrong, total = wrong + float(w), total + float(t)
  return wrong / max(total, 1.0)


@register("dnc_tasks", paper="sdnc",
          description="DNC vs Transformer(=sDNC) vs hybrids: copy, repeat copy, associative recall; "
                      "length generalisation to 2L-4L.")
def run(ctx: RunContext) -> ExperimentResult:
  quick = ctx.quick
  specs = task_specs(quick)
  settings = run_settings(quick)
  n_steps, batch = settings["n_steps"], settings["batch_size"]
  cfg = TrainConfig(n_steps=n_steps, lr=settings["lr"], warmup_steps=min(100, n_steps // 10),
                    min_lr_ratio=0.1, weight_decay=0.0, grad_clip=10.0,
                    ckpt_every=max(1, n_steps // 5), keep_checkpoints=1, log_every=settings["log_every"])
  sizes = {name: spec.train_kwargs[spec.length_key[1]] for name, spec in specs.items()}
  max_test = max(2 * (4 * s) + 20 for s in sizes.values())
  builders = model_builders(quick, max_test_len=max_test)
  results, curves, notes = {}, {}, []
  for task_name, spec in specs.items():
    L = sizes[task_name]
    for model_name in builders:
      t0 = time.perf_counter()
      workdir = ctx.outdir / task_name / model_name.strip("+")
      stream = TaskStream(spec.fn, seed=0, **spec.kwargs_at(None, batch))
      task = TrainTask(init_model=lambda rngs, b=builders[model_name], io=spec.io: b(io, rngs),
                       loss_fn=sequence_loss, train_iter=stream)
      res = train(task, cfg, workdir, progress=ctx.progress)
      n_in, n_out = settings["eval_batches"]
      row = {"train": evaluate(res.model, spec, None, n_in, 32, seed=10_000)}
      for k in (2, 3, 4):
        row[f"{k}L"] = evaluate(res.model, spec, k * L, n_out, 32, seed=20_000 + k)
      row["seconds"] = time.perf_counter() - t0
      results[(task_name, model_name)] = row
      curves[(task_name, model_name)] = [(r["step"], r["bit_error"]) for r in read_metrics(
          workdir / "metrics.jsonl") if "bit_error" in r]
      if model_name == "transformer":
        sdnc = SDNCTransformer(res.model.cfg, rngs=nnx.Rngs(0))
        copy_params(res.model, sdnc)
        x = jnp.asarray(TaskStream(spec.fn, 7, **spec.kwargs_at(None, 8)).batch_at(0)["observations"])
        diff = float(jnp.max(jnp.abs(sdnc(x) - res.model(x))))
        notes.append(f"{task_name}: trained Transformer re-run as SDNCTransformer (write-once memory "
                     f"reads): max |Δ logits| = {diff:.2e}.")
        results[(task_name, "sDNC (same weights)")] = dict(row, seconds=float("nan"), max_abs_diff=diff)

  table_rows = []
  for (task_name, model_name), r in results.items():
    table_rows.append([task_name, model_name] + [f"{100 * r[k]:.2f}%" for k in ("train", "2L", "3L", "4L")]
                      + ["—" if np.isnan(r["seconds"]) else f"{r['seconds']:.0f}"])
  (ctx.outdir / "results.json").write_text(json.dumps(
      {f"{t}/{m}": {k: v for k, v in r.items()} for (t, m), r in results.items()}, indent=2))
  figure = _plot(ctx, curves, specs)
  dnc_copy = results[("copy", "dnc")]["train"]
  return ExperimentResult(
      summary=f"DNC copy bit error {100 * dnc_copy:.2f}% in range; see table for 2L-4L",
      tables=[Table("Bit error rate (lower is better); in-range and length generalisation",
                    ["task", "model", "≤L (train range)", "2L", "3L", "4L", "train s"], table_rows)],
      figures=[figure],
      notes=notes + [f"L: {sizes}; {n_steps} steps, batch {batch}, AdamW lr {cfg.lr}; evaluation on "
                     f"fresh seeds ({settings['eval_batches'][0]}×32 in range, "
                     f"{settings['eval_batches'][1]}×32 per longer length)."],
      metrics={f"{t}/{m}": r for (t, m), r in results.items()},
  )


def _plot(ctx, curves, specs):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
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
