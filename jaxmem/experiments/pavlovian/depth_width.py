"""Depth vs width at equal parameters on associative recall, trained (Pavlovian paper, result 2).

Claim probed (``docs/papers/pavlovian.md``, result 2): stacked conditioning circuits err as
``r* ∝ L · (n/d_k)^H`` — linearly in depth ``L``, exponentially suppressed by heads ``H`` —
"hence a depth–width trade-off: wide-and-shallow models beat narrow-and-deep ones on
associative reasoning at equal parameters". ``assoc_error_propagation`` measures the bound's
shape without training; this experiment trains models.

Models: :class:`~jaxmem.models.TransformerLM` with a conditioning-circuit memory
(the ``assoc`` mixer, each rule in ``rules``; ``"softmax"`` is attention for reference),
a short convolution on q/k/v (as in Zoology/DeltaNet), a fixed head width ``head_dim``
(so width = heads: ``H = d_model / head_dim``) and ``d_ff = 2·d_model``. The shapes
``(L, d_model)`` in ``shapes`` hold ``L·d_model²`` (the block parameters) fixed as far as
integer head counts allow; the table reports the exact block and total parameter counts.

Tasks (:mod:`jaxmem.tasks.mqar`): MQAR (one hop) and multi-hop recall (``hops`` ≥ 2:
the recalled item is the next query). Every model is deep enough for the hops
(``L ≥ hops``), so depth is not a hard requirement in any cell; the question is which
shape spends a fixed parameter budget better.

The quick size trains MQAR only (three seeds): in probes at quick sizes on this 2-core CPU,
2-hop recall (3 chains, T=64) was not learned within 1500 steps even by a 2-layer softmax
Transformer (0.29 accuracy), so multi-hop tasks are in the full settings only.

Sizes: ``configs/pavlovian_depth_width.py`` (:class:`DepthWidthSettings`). Training and
scoring are :mod:`jaxmem.train.recall`'s.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx

from jaxmem.data.batches import KeyedBatches
from jaxmem.experiments import ExperimentResult, RunContext, Table, register
from jaxmem.models import TransformerConfig, TransformerLM, count_params
from jaxmem.results import pyplot
from jaxmem.tasks.mqar import mqar_stream, multihop_stream
from jaxmem.train.recall import recall_accuracy, recall_mixer, recall_train_config, train_recall

PAPER = "pavlovian"
EVAL_SEED, EVAL_BATCH = 1_000_000, 64   # held-out stream: a seed no training run uses


@dataclasses.dataclass(frozen=True)
class RecallTask:
  name: str
  hops: int          # 1: MQAR (Zoology's generator); ≥ 2: multihop_recall
  num_items: int     # key-value pairs (MQAR) or chains (multi-hop)


@dataclasses.dataclass(frozen=True)
class DepthWidthSettings:
  """Every (task, rule, shape, seed) is one trained model.

  ``tasks`` are :class:`RecallTask` s; a config file gives each as a mapping
  ``{name, hops, num_items}`` (or a ``(name, hops, num_items)`` sequence), turned into a
  :class:`RecallTask` here, and ``shapes`` as ``(L, d_model)`` pairs."""

  tasks: tuple
  shapes: tuple      # (L, d_model), wide-shallow first, narrow-deep last
  rules: tuple       # assoc rules, or registered mixers by name ("softmax", ...)
  head_dim: int
  vocab_size: int
  seq_len: int
  short_conv: int
  n_steps: int
  batch_size: int
  lr: float
  eval_batches: int  # held-out batches of 64 sequences
  seeds: tuple

  def __post_init__(self):
    tasks = tuple(t if isinstance(t, RecallTask) else RecallTask(**t) if isinstance(t, Mapping)
                  else RecallTask(*t) for t in self.tasks)
    object.__setattr__(self, "tasks", tasks)
    object.__setattr__(self, "shapes", tuple(tuple(int(x) for x in shape) for shape in self.shapes))
    for name in ("rules", "seeds"):
      object.__setattr__(self, name, tuple(getattr(self, name)))


def model_config(rule: str, L: int, d: int, s: DepthWidthSettings) -> TransformerConfig:
  if d % s.head_dim:
    raise ValueError(f"d_model={d} is not a multiple of head_dim={s.head_dim}.")
  return TransformerConfig(vocab_size=s.vocab_size, d_model=d, n_layers=L, n_heads=d // s.head_dim,
                           d_ff=2 * d, max_len=s.seq_len, mixer=recall_mixer(rule, s.short_conv))


def stream(task: RecallTask, s: DepthWidthSettings, seed: int, batch_size: int) -> KeyedBatches:
  common = dict(batch_size=batch_size, vocab_size=s.vocab_size, seq_len=s.seq_len)
  if task.hops == 1:
    return mqar_stream(seed, num_kv_pairs=task.num_items, **common)
  return multihop_stream(seed, num_chains=task.num_items, hops=task.hops, **common)


def block_params(model: TransformerLM) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(model.blocks, nnx.Param)))


def evaluate(model, task: RecallTask, s: DepthWidthSettings) -> float:
  return recall_accuracy(model, stream(task, s, seed=EVAL_SEED, batch_size=EVAL_BATCH), s.eval_batches)


@register("assoc_depth_width", paper=PAPER,
          description="Trained wide-shallow vs narrow-deep conditioning-circuit Transformers at equal "
                      "parameters on MQAR and multi-hop recall.",
          config="pavlovian_depth_width", settings=DepthWidthSettings)
def run(ctx: RunContext, s: DepthWidthSettings) -> ExperimentResult:
  for L, _ in s.shapes:
    for task in s.tasks:
      if L < task.hops:
        raise ValueError(f"shape with L={L} cannot chain {task.hops} hops; every shape needs L >= hops.")
  results, t_all = {}, time.perf_counter()
  for task in s.tasks:
    for rule in s.rules:
      for L, d in s.shapes:
        accs, secs = [], []
        for seed in s.seeds:
          t0 = time.perf_counter()
          mcfg = model_config(rule, L, d, s)
          model = train_recall(mcfg, stream(task, s, seed, s.batch_size),
                               recall_train_config(s.n_steps, s.lr, seed),
                               ctx.outdir / f"{task.hops}hop_{rule}_L{L}_d{d}_s{seed}", ctx.progress)
          accs.append(evaluate(model, task, s))
          secs.append(time.perf_counter() - t0)
        results[(task.name, rule, L, d)] = {
            "accuracy": float(np.mean(accs)), "accuracies": accs, "seconds": float(np.sum(secs)),
            "block_params": block_params(model), "params": count_params(model),
            "heads": mcfg.n_heads,
            "state_floats_per_layer": mcfg.state_floats(s.seq_len) // L}
  seconds = time.perf_counter() - t_all
  (ctx.outdir / "results.json").write_text(json.dumps({"/".join(map(str, k)): v for k, v in results.items()},
                                                      indent=2))
  shape_names = [f"L={L}, d={d}" for L, d in s.shapes]
  acc_rows, verdict_rows, held, cells = [], [], 0, 0
  for task in s.tasks:
    for rule in s.rules:
      r = [results[(task.name, rule, L, d)] for L, d in s.shapes]
      spread = lambda x: (f" ± {np.std(x['accuracies']):.3f} ({', '.join(f'{a:.2f}' for a in x['accuracies'])})"
                          if len(s.seeds) > 1 else "")
      acc_rows.append([task.name, rule] + [f"{x['accuracy']:.3f}{spread(x)}" for x in r])
      wide, deep = r[0]["accuracy"], r[-1]["accuracy"]
      best = shape_names[int(np.argmax([x["accuracy"] for x in r]))]
      ok = wide >= deep
      cells += 1
      held += ok
      seed_wins = sum(a > b for a, b in zip(r[0]["accuracies"], r[-1]["accuracies"], strict=True))
      verdict_rows.append([task.name, rule, f"{wide:.3f}", f"{deep:.3f}", f"{seed_wins}/{len(s.seeds)}", best,
                           "yes" if ok else "NO"])
  any_task, any_rule = s.tasks[0].name, s.rules[0]
  param_rows = [[f"L={L}, d={d}", results[(any_task, any_rule, L, d)]["heads"], s.head_dim,
                 f"{L * d * d:,}", f"{results[(any_task, any_rule, L, d)]['block_params']:,}",
                 f"{results[(any_task, any_rule, L, d)]['params']:,}",
                 f"{results[(any_task, any_rule, L, d)]['state_floats_per_layer']:,}"]
                for L, d in s.shapes]
  notes = [
      f"Vocabulary {s.vocab_size}, T = {s.seq_len}, short convolution width {s.short_conv}, head width "
      f"{s.head_dim}, d_ff = 2·d_model, {s.n_steps} AdamW steps (lr {s.lr}, batch {s.batch_size}, warmup + "
      f"cosine), seeds {list(s.seeds)}; accuracy on {s.eval_batches}×{EVAL_BATCH} held-out sequences (query "
      "positions only). Delta-family rules use L2-normalised keys.",
      "Tasks: " + "; ".join(f"{t.name}: {t.num_items} {'pairs' if t.hops == 1 else 'chains'} of {t.hops} hop(s)"
                            for t in s.tasks) + ". Chance ≈ 1/(number of candidate values).",
      "Equal parameters means equal L·d_model² (the block parameters scale as ≈ 8·L·d² + small terms); "
      "embedding parameters (vocab × d) favour the wide model and are listed separately.",
      "Recall is learned in a sudden transition; a seed that has not crossed it by the last step sits near "
      "chance, so the spread across seeds is large and the per-seed values are listed.",
      f"Wall time of this invocation {seconds:.0f} s (runs whose final checkpoint is already in the output "
      "directory are restored and evaluated, not retrained).",
  ]
  metrics = {"/".join(map(str, k)): v["accuracy"] for k, v in results.items()}
  metrics.update(wide_beats_deep=held, cells=cells, seconds=seconds)
  return ExperimentResult(
      summary=(f"wide-shallow ≥ narrow-deep in {held}/{cells} (task, rule) cells; "
               + "; ".join(f"{row[0]}/{row[1]}: {row[2]} vs {row[3]}" for row in verdict_rows)),
      tables=[Table("Accuracy at equal parameters (columns: shape, wide-shallow → narrow-deep; "
                    "mean ± std (per seed))",
                    ["task", "rule"] + shape_names, acc_rows),
              Table("Shapes", ["shape", "heads H", "head width", "L·d²", "block params", "all params",
                               "state floats per layer"], param_rows),
              Table("Does wide-shallow beat narrow-deep? (mean accuracy; seeds: same-seed pairs where the "
                    "widest shape beats the deepest)", ["task", "rule", "wide-shallow", "narrow-deep", "seeds",
                                                       "best shape", "holds"],
                    verdict_rows)],
      figures=[_plot(ctx, s, results, shape_names)], notes=notes, metrics=metrics)


def _plot(ctx: RunContext, s: DepthWidthSettings, results: dict, shape_names: list) -> str:
  plt = pyplot()
  fig, axes = plt.subplots(1, len(s.tasks), figsize=(4.2 * len(s.tasks), 3.4), squeeze=False)
  depths = [L for L, _ in s.shapes]
  for ax, task in zip(axes[0], s.tasks, strict=True):
    for rule in s.rules:
      ax.plot(depths, [results[(task.name, rule, L, d)]["accuracy"] for L, d in s.shapes], "o-", label=rule)
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, shape_names, fontsize=7)
    ax.minorticks_off()
    ax.set_ylim(0, 1.02)
    ax.set_title(task.name)
    ax.set_xlabel("shape at equal L·d² (wide-shallow → narrow-deep)")
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7)
  return ctx.save_figure(fig, "depth_width.png", dpi=110)
