"""The paper's associative recall, its model table and its slot ablation, re-run causally with seeds.

Task (``jaxmem.tasks.unimatrix.recall_batch``; ``docs/papers/unimatrix.md``): vocabulary 64,
``[BOS] + [k v SEP] × P + filler + [QUERY k_q ANSWER]``, length 128, loss and accuracy at the
last position only; chance 1/8, "one of the values present" 1/P. Paper (P = 4): Transformer
25.4%; Core / ROSA / Discovery 12.9–13.7%; Assoc (here ``dense_memory``) 26.5%; SparsePointer 75.6%
(dropout 0.1) and 99.2% (no dropout). Ablation at 4 / 6 / 8 pairs: 4–8 slots ≈ 12.5%; 16 slots
24.2 / 17.5 / 13.6; 32 slots without pointer 95.7 / 90.3 / 86.6; 32 + pointer 98.9 / 98.3 / 97.9;
32 + pointer, no write gate 100 / 100 / 100.

Every model here is at the paper's sizes (d 64, 3 shared steps, 4 heads, state 16; the
Transformer 3 layers), trained with the same optimiser, steps and batches, once per seed (the
seed draws the initial weights, the dropout masks and the training stream), and scored on one
held-out stream (in eval mode). Dropout is off except in ``sparse_pointer_dropout`` (0.1, the
paper's 75.6% row). Sizes: ``configs/unimatrix_recall.py``.

Slot-key merging, measured on every run with slots: the slot memory merges a write into a slot
whose key has cosine > 0.85 with it, and its keys are embedding rows ``E[x_{t−1}]``, so two
distinct tokens whose embeddings drift together share a slot silently. :func:`slot_merge_stats`
counts it on the held-out stream: the largest cosine between the embeddings of two distinct tokens
of the task, and at the answer's read the distinct key tokens merged into each used slot.

``unimatrix_pointer_check`` (:mod:`jaxmem.experiments.unimatrix.pointer_check`) is the short
regression of the recall row: SparsePointer with its default options, three seeds, with and without
dropout.
"""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
from flax import nnx

from jaxmem.experiments import ExperimentResult, RunContext, Table, register
from jaxmem.experiments.unimatrix.common import (
    LABELS,
    masked_accuracy,
    model_factory,
    plot_accuracy_curves,
    run_tag,
    train_on_stream,
)
from jaxmem.kernels.slots import slot_memory
from jaxmem.models import UniMatrixLM, count_params
from jaxmem.results import pyplot
from jaxmem.tasks.unimatrix import RECALL_VOCAB, recall_stream
from jaxmem.train.loop import apply_model

EVAL_SEED, EVAL_BATCH = 1_000_000, 64
PAPER_TABLE = {"transformer": "25.4", "core": "12.9–13.7", "rosa": "12.9–13.7", "discovery": "12.9–13.7",
               "dense_memory": "26.5", "sparse_pointer": "99.2", "sparse_pointer_dropout": "75.6"}
# the paper's ablation: (slots, pointer, write gate) -> accuracy at 4 / 6 / 8 pairs
PAPER_ABLATION = {(4, True, True): "≈12.5", (8, True, True): "≈12.5", (16, True, True): "24.2 / 17.5 / 13.6",
                  (32, False, True): "95.7 / 90.3 / 86.6", (32, True, True): "98.9 / 98.3 / 97.9",
                  (32, True, False): "100 / 100 / 100"}
# rows that are not in the paper, by name: (label, options)
EXTRA_ROWS = {
    # jaxmem's earlier merge (strength s + g): with the paper's score the answer slot is never read
    "accumulate": ("32 slots + pointer, strengths accumulated", dict(n_slots=32, slot_strength="accumulate")),
    # the slot query in the keys' own space (E[x_{t−1}]) instead of learned: the lookup by construction
    "prev_token": ("32 slots + pointer, query E[x_{t−1}]", dict(n_slots=32, slot_query="prev_token")),
    # merges by the key's token id instead of the cosine: distinct key tokens never share a slot
    "merge_by_id": ("32 slots + pointer, merge by key id", dict(n_slots=32, slot_merge="key_id")),
}


def ablation_row(spec: str) -> tuple[str, dict, str]:
  """``(label, UniMatrixConfig options, paper)`` of an ablation row: ``"<slots>"`` with the flags
  ``no-pointer`` / ``no-gate`` (e.g. ``"32 no-pointer"``), or a name in :data:`EXTRA_ROWS`."""
  if spec in EXTRA_ROWS:
    label, options = EXTRA_ROWS[spec]
    return label, options, "—"
  words = spec.split()
  flags = set(words[1:])
  if not words or not words[0].isdigit() or int(words[0]) < 1 or not flags <= {"no-pointer", "no-gate"}:
    raise ValueError(f"ablation row {spec!r} must be '<slots> [no-pointer] [no-gate]' or one of "
                     f"{sorted(EXTRA_ROWS)}.")
  n, pointer, gate = int(words[0]), "no-pointer" not in flags, "no-gate" not in flags
  label = f"{n} slots" + (" + pointer" if pointer else ", no pointer") + ("" if gate else ", no write gate")
  return label, dict(n_slots=n, pointer=pointer, write_gate=gate), PAPER_ABLATION.get((n, pointer, gate), "—")


@dataclasses.dataclass(frozen=True)
class RecallSettings:
  models: tuple          # names in jaxmem.experiments.unimatrix.common.MODEL_NAMES
  num_pairs: int         # the model table's pairs (the paper's 4)
  seq_len: int           # 128
  train_steps: int
  batch_size: int
  lr: float
  eval_batches: int      # held-out batches of 64
  seeds: tuple           # one training run per seed, for the model table and the ablation alike
  ablation_pairs: tuple  # () skips the ablation
  ablation_rows: tuple   # specs of ablation_row


def _predict_and_gate(model, x):
  logits, aux = model(x, return_aux=True)
  return logits.argmax(-1), aux.get("slot_write_gate")


def slot_merge_stats(model: nnx.Module, stream, n_batches: int = 1) -> dict:
  """How the trained model's slot memory merged distinct key tokens, on ``stream``'s first batches.

  Replays the model's own slot writes (keys ``E[x_{t−1}]`` from its embedding, its write gate, its
  merge rule and strength update) up to the answer's read (positions ``< T − 1``) with one-hot values
  of the key token, so that a slot's final value has one nonzero entry per distinct key token merged
  into it since it was filled. Returns ``max_key_cos`` (largest cosine between the embeddings of two
  distinct tokens occurring in the inputs), ``ids_per_slot`` (mean distinct key tokens per used slot)
  and ``merged_slots`` (fraction of used slots holding more than one)."""
  cfg = model.cfg
  if not isinstance(model, UniMatrixLM) or not cfg.n_slots:
    raise ValueError("slot_merge_stats needs a UniMatrixLM with a slot memory (n_slots > 0).")
  table = np.asarray(model.embed.embedding[...], np.float32)
  V, seen, ids_per_slot, merged = table.shape[0], set(), [], []
  for i in range(n_batches):
    x = np.asarray(stream.batch_at(i)["inputs"])
    _, gate = apply_model(_predict_and_gate, model, x)
    x = x[:, :-1]   # the writes before the answer's read
    seen.update(np.unique(x).tolist())
    prev = np.pad(x[:, :-1], ((0, 0), (1, 0)), constant_values=V)    # V: "no previous token" (t = 0)
    keys = np.concatenate([table, np.zeros((1, table.shape[1]), np.float32)])[prev]
    values = np.eye(V + 1, dtype=np.float32)[prev]
    g = None if gate is None else np.asarray(gate)[:, :-1]
    _, state = slot_memory(keys, keys, values, np.zeros(x.shape, np.int32), n_slots=cfg.n_slots,
                           top_k=cfg.slot_top_k, threshold=cfg.slot_threshold, write_gate_BT=g,
                           strength_update=cfg.slot_strength, return_state=True,
                           merge_ids_BT=prev.astype(np.int32) if cfg.slot_merge == "key_id" else None)
    counts = (np.asarray(state.values) > 0).sum(-1)[np.asarray(state.used)]
    ids_per_slot.append(counts.mean())
    merged.append((counts > 1).mean())
  rows = table[sorted(seen)]
  unit = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
  cos = unit @ unit.T
  np.fill_diagonal(cos, -1.0)
  return {"max_key_cos": float(cos.max()), "ids_per_slot": float(np.mean(ids_per_slot)),
          "merged_slots": float(np.mean(merged))}


def train_recall(ctx, s, name: str, pairs: int, options: dict, tag: str, seed: int) -> dict:
  """Trains ``name`` (with ``options``) on the recall stream of ``seed`` for ``s.train_steps`` steps (or
  resumes it from ``ctx.outdir``), scores it on the held-out stream; returns the run's record."""
  t0 = time.perf_counter()
  init = model_factory(name, vocab_size=RECALL_VOCAB, max_len=s.seq_len, **options)
  stream = recall_stream(seed, batch_size=s.batch_size, num_pairs=pairs, seq_len=s.seq_len)
  workdir = ctx.outdir / run_tag(f"{tag}_s{seed}", T=s.seq_len, steps=s.train_steps, bs=s.batch_size, lr=s.lr)
  model, history = train_on_stream(init, stream, s.train_steps, s.lr, workdir, ctx.progress, seed=seed)
  held_out = recall_stream(EVAL_SEED, batch_size=EVAL_BATCH, num_pairs=pairs, seq_len=s.seq_len)
  curve = [(r["step"], r["accuracy"]) for r in history if "accuracy" in r]
  out = {"accuracy": masked_accuracy(model, held_out, s.eval_batches)["all"], "params": count_params(model),
         "seconds": time.perf_counter() - t0, "curve": curve,
         "first_step_at_100": next((step for step, a in curve if a >= 1.0), None)}
  if isinstance(model, UniMatrixLM) and model.cfg.n_slots:
    out["slots"] = slot_merge_stats(model, held_out)
  return out


def mean_and_range(values) -> str:
  """``"mean (min–max)"`` in percent, or the one value."""
  v = 100 * np.asarray(values, float)
  return f"{v.mean():.1f}" if len(v) == 1 else f"{v.mean():.1f} ({v.min():.1f}–{v.max():.1f})"


def _merge_cells(runs) -> list:
  stats = [r["slots"] for r in runs]
  mean = lambda name: np.mean([t[name] for t in stats])
  return [f"{mean('ids_per_slot'):.2f}", f"{100 * mean('merged_slots'):.0f}",
          f"{max(t['max_key_cos'] for t in stats):.3f}"]


@register("unimatrix_recall", paper="unimatrix",
          description="The paper's associative recall: Transformer vs the UniMatrix variants, and the slot "
                      "ablation, with seeds.",
          config="unimatrix_recall", settings=RecallSettings)
def run(ctx: RunContext, s: RecallSettings) -> ExperimentResult:
  rows_spec = [ablation_row(r) for r in s.ablation_rows]   # bad specs fail before any training
  results = {name: [train_recall(ctx, s, name, s.num_pairs, {}, f"{name}_p{s.num_pairs}", seed)
                    for seed in s.seeds] for name in s.models}
  acc = lambda runs: [r["accuracy"] for r in runs]
  seeds_txt = ", ".join(map(str, s.seeds))
  tables = []
  if s.models:
    tables.append(Table(
        f"Recall accuracy (%), {s.num_pairs} pairs, T = {s.seq_len}, {s.train_steps} steps × batch "
        f"{s.batch_size}; mean (min–max) over seeds {seeds_txt}",
        ["model", "parameters", "jaxmem", "per seed", "paper"],
        [[LABELS[n], f"{results[n][0]['params']:,}", mean_and_range(acc(results[n])),
          " / ".join(f"{100 * a:.1f}" for a in acc(results[n])), PAPER_TABLE.get(n, "—")] for n in s.models]))
  ablation = {}
  for spec, (label, options, _) in zip(s.ablation_rows, rows_spec, strict=True):
    for pairs in s.ablation_pairs:
      tag = "ablation_" + spec.replace(" ", "_").replace("-", "") + f"_p{pairs}"
      ablation[(label, pairs)] = [train_recall(ctx, s, "sparse_pointer", pairs, options, tag, seed)
                                  for seed in s.seeds]
  if rows_spec and s.ablation_pairs:
    tables.append(Table(
        f"SparsePointer slot ablation: held-out accuracy (%) by pairs, mean (min–max) over seeds {seeds_txt}",
        ["slots / fusion"] + [f"{p} pairs" for p in s.ablation_pairs] + ["paper (4 / 6 / 8)"],
        [[label] + [mean_and_range(acc(ablation[(label, p)])) for p in s.ablation_pairs] + [paper]
         for label, _, paper in rows_spec]))
  merge_rows = [[LABELS[n], str(s.num_pairs)] + _merge_cells(results[n]) for n in s.models
                if "slots" in results[n][0]]
  merge_rows += [[label, str(p)] + _merge_cells(runs) for (label, p), runs in ablation.items()]
  if merge_rows:
    tables.append(Table(
        "Slot-key merging on the held-out stream (mean over seeds; max cosine: the largest over seeds)",
        ["model / row", "pairs", "key tokens per used slot", "slots holding > 1 key token (%)",
         "max cosine, distinct token embeddings"], merge_rows))
  record = lambda r: {k: v for k, v in r.items() if k != "curve"}
  metrics = {f"{n}/s{seed}": record(r) for n, runs in results.items()
             for seed, r in zip(s.seeds, runs, strict=True)}
  metrics.update({f"ablation/{label}/p{p}/s{seed}": record(r) for (label, p), runs in ablation.items()
                  for seed, r in zip(s.seeds, runs, strict=True)})
  (ctx.outdir / "results.json").write_text(json.dumps(metrics, indent=2))
  figures = []
  if s.models:
    figures.append(plot_accuracy_curves(ctx, {n: runs[0] for n, runs in results.items()},
                                        {"chance": 1 / 8, "a present value": 1 / s.num_pairs}))
  if ablation:
    figures.append(_plot_pairs(ctx, ablation, s, rows_spec))
  best = max(s.models, key=lambda n: np.mean(acc(results[n]))) if s.models else None
  return ExperimentResult(
      summary=(f"{s.num_pairs} pairs: best {LABELS[best]} {mean_and_range(acc(results[best]))}%" if best
               else f"slot ablation only ({len(ablation)} rows × pairs)"),
      tables=tables, figures=figures,
      notes=[f"Each model trained {s.train_steps} AdamW steps (lr {s.lr}, warmup + cosine, batch "
             f"{s.batch_size}) once per seed ({seeds_txt}: initial weights, dropout masks and the training "
             f"stream); accuracy at the last position on {s.eval_batches}×{EVAL_BATCH} held-out sequences. "
             f"Chance {100 / 8:.1f}%, always a present value {100 / s.num_pairs:.1f}%. Learning curves: the "
             f"first seed.",
             "All jaxmem models are causal (state reset per depth step, tested); the paper's LM numbers were "
             "not. Dropout only where the model name says so (SparsePointer, dropout 0.1: the paper's 75.6% "
             "row); accuracy is measured in eval mode.",
             "Slot reads use a learned query from the final hidden state and the paper's score "
             "cos/√d + log(strength); keys are E[x_{t−1}], values E[x_t], ids x_t (read before write); a "
             "merge sets the slot's strength to the write's gate (slot_strength='gate', the default)."],
      metrics=metrics)


def _plot_pairs(ctx, ablation, s, rows_spec):
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for label, _, _ in rows_spec:
    means = [np.mean([r["accuracy"] for r in ablation[(label, p)]]) for p in s.ablation_pairs]
    ax.plot(s.ablation_pairs, means, "o-", label=label)
  ax.set_xlabel("pairs")
  ax.set_ylabel("held-out accuracy (mean over seeds)")
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=7)
  return ctx.save_figure(fig, "recall_vs_pairs.png")
