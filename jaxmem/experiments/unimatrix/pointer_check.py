"""The short regression of the paper's SparsePointer recall row: default options, three seeds, with and
without dropout, each required to reach ``min_accuracy`` held out.

The paper (``docs/papers/unimatrix.md``): SparsePointer 99.2% without dropout and 75.6% with 0.1 on the
associative recall (vocabulary 64, T 128, 4 pairs). The check trains
``UniMatrixConfig(variant="sparse_pointer")`` as it comes (a learned query, the paper's score); with
``options={"slot_strength": "accumulate"}`` (a merged slot's strength ``s + g``, under which no query
reaches a slot written once: ``jaxmem.kernels.slots``) it is expected to fail.
Sizes: ``configs/unimatrix_pointer_check.py``.
"""

from __future__ import annotations

import dataclasses
import json

from jaxmem.experiments import ExperimentResult, RunContext, Table, register
from jaxmem.experiments.unimatrix.recall import EVAL_BATCH, train_recall


@dataclasses.dataclass(frozen=True)
class PointerCheckSettings:
  seeds: tuple
  dropouts: tuple       # dropout rates, each trained with every seed
  num_pairs: int
  seq_len: int
  train_steps: int
  batch_size: int
  lr: float
  eval_batches: int
  min_accuracy: float   # what every run must reach held out
  options: dict = dataclasses.field(default_factory=dict)   # UniMatrixConfig overrides (none: the defaults)

  def __post_init__(self):
    if not self.seeds or not self.dropouts:
      raise ValueError(f"PointerCheckSettings.seeds and .dropouts must not be empty, got {self.seeds!r} and "
                       f"{self.dropouts!r}.")


def _options_tag(options) -> str:
  """The overrides in the work dir's name, so that runs with other options never resume each other."""
  return "".join(f"_{k}{v}" for k, v in sorted(dict(options).items()))


@register("unimatrix_pointer_check", paper="unimatrix",
          description="SparsePointer with default options on the paper's recall: every seed, with and without "
                      "dropout, must reach the held-out threshold.",
          config="unimatrix_pointer_check", settings=PointerCheckSettings)
def run(ctx: RunContext, s: PointerCheckSettings) -> ExperimentResult:
  runs = {(p, seed): train_recall(ctx, s, "sparse_pointer", s.num_pairs, {**dict(s.options), "dropout": p},
                                  f"sparse_pointer_dropout{p}{_options_tag(s.options)}_p{s.num_pairs}", seed)
          for p in s.dropouts for seed in s.seeds}
  rows = []
  for (p, seed), r in runs.items():
    m = r["slots"]
    first = r["first_step_at_100"]
    rows.append([f"{p:g}", str(seed), f"{100 * r['accuracy']:.1f}", str(first or "not reached"),
                 f"{m['ids_per_slot']:.2f}", f"{m['max_key_cos']:.3f}",
                 "yes" if r["accuracy"] >= s.min_accuracy else "**no**"])
  held = sum(r["accuracy"] >= s.min_accuracy for r in runs.values())
  worst = min(r["accuracy"] for r in runs.values())
  metrics = {f"dropout{p:g}/s{seed}": {k: v for k, v in r.items() if k != "curve"}
             for (p, seed), r in runs.items()}
  metrics["expectations_held"] = held
  (ctx.outdir / "results.json").write_text(json.dumps(metrics, indent=2))
  return ExperimentResult(
      summary=(f"{held}/{len(runs)} runs reach ≥ {100 * s.min_accuracy:.0f}% held out "
               f"(lowest {100 * worst:.1f}%; paper 99.2% / 75.6% with dropout 0.1)"),
      tables=[Table(f"SparsePointer recall, {s.num_pairs} pairs, T = {s.seq_len}, {s.train_steps} steps × "
                    f"batch {s.batch_size}, lr {s.lr}"
                    + (f", options {dict(s.options)}" if s.options else ", default options"),
                    ["dropout", "seed", "held-out accuracy (%)", "first logged step at 100% (train batch)",
                     "key tokens per used slot", "max cosine, distinct token embeddings",
                     f"≥ {100 * s.min_accuracy:.0f}%"], rows)],
      notes=[f"Held out: {s.eval_batches}×{EVAL_BATCH} sequences of another stream, in eval mode. Each seed "
             "draws the initial weights, the dropout masks and the training stream."],
      metrics=metrics)
