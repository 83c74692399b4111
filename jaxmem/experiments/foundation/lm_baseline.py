"""Baseline byte-level Transformer LM on Tiny Shakespeare: the reference every paper beats.

Settings: ``configs/lm_baseline.py`` (an :class:`~jaxmem.train.config.LMConfig`, the same file
``jaxmem train`` takes).
"""

from __future__ import annotations

import time

from jaxmem import config_files
from jaxmem.data import CorpusNotFoundError, load_corpus, ngram_bpb
from jaxmem.experiments import ExperimentResult, RunContext, SkipExperiment, Table, register
from jaxmem.models import count_params
from jaxmem.results import pyplot
from jaxmem.train import LMConfig, evaluate_bpb, read_metrics, train_lm

CONFIG = "lm_baseline"


@register("lm_baseline", paper="foundation",
          description="Byte-level pre-LN Transformer LM on Tiny Shakespeare vs n-gram baselines.",
          config=CONFIG, settings=LMConfig)
def run(ctx: RunContext, cfg: LMConfig) -> ExperimentResult:
  try:
    corpus = load_corpus(cfg.data.corpus, cfg.data.path)
  except CorpusNotFoundError as e:
    raise SkipExperiment(
        "Tiny Shakespeare corpus not found.",
        "export JAXMEM_DATA_DIR=<folder holding tinyshakespeare/input.txt> "
        "(see the README, 'Data'); details: " + str(e).splitlines()[0],
    ) from None

  t0 = time.perf_counter()
  result = train_lm(cfg, ctx.outdir / "work", corpus=corpus, progress=ctx.progress)
  train_s = time.perf_counter() - t0
  model = result.model
  val = evaluate_bpb(model, corpus["validation"], cfg.data.seq_len, cfg.data.eval_batch_size)
  test = evaluate_bpb(model, corpus["test"], cfg.data.seq_len, cfg.data.eval_batch_size)
  uni_v, uni_t = (ngram_bpb(corpus["train"], corpus[s], 1) for s in ("validation", "test"))
  bi_v, bi_t = (ngram_bpb(corpus["train"], corpus[s], 2) for s in ("validation", "test"))

  rows = [
      ["unigram (add-0.1)", "256", f"{uni_v:.3f}", f"{uni_t:.3f}"],
      ["bigram (add-0.1)", f"{256 * 256:,}", f"{bi_v:.3f}", f"{bi_t:.3f}"],
      [f"Transformer ({cfg.model.n_layers}L d{cfg.model.d_model}, {result.step} steps)",
       f"{count_params(model):,}", f"{val['bpb']:.3f}", f"{test['bpb']:.3f}"],
  ]
  figure = _plot_curves(ctx, read_metrics(ctx.outdir / "work" / "metrics.jsonl"), uni_v, bi_v)
  resumed = "" if result.resumed_from is None else f" (resumed from step {result.resumed_from})"
  notes = [
      f"Config: {config_source(cfg, ctx.quick)}; seq_len "
      f"{cfg.data.seq_len}, batch {cfg.data.batch_size}, AdamW lr {cfg.train.lr}.",
      f"Training wall time this invocation: {train_s:.0f} s{resumed}; "
      f"evaluation over the whole split ({val['n_bytes']:,} validation bytes).",
  ]
  return ExperimentResult(
      summary=f"validation {val['bpb']:.3f} bpb (bigram {bi_v:.3f}, unigram {uni_v:.3f})",
      tables=[Table("Bits per byte on Tiny Shakespeare", ["model", "parameters", "validation bpb",
                                                          "test bpb"], rows)],
      figures=[figure], notes=notes,
      metrics={"val_bpb": val["bpb"], "test_bpb": test["bpb"], "train_s": train_s,
               "unigram_val_bpb": uni_v, "bigram_val_bpb": bi_v, "steps": result.step},
  )


def config_source(cfg: LMConfig, quick: bool) -> str:
  """Where ``cfg`` came from: ``configs/lm_baseline.py:<size>``, plus the fields that differ from
  that file (``--config.lm_baseline.*`` overrides, or a config passed in)."""
  size = "quick" if quick else "full"
  base = config_files.to_dataclass(LMConfig, config_files.load_config(f"{CONFIG}:{size}"))
  changed = _diff(config_files.to_dict(base), config_files.to_dict(cfg))
  where = f"`configs/{CONFIG}.py:{size}`"
  return where if not changed else f"{where} with " + ", ".join(f"`{k}={v!r}`" for k, v in changed)


def _diff(old, new, prefix: str = "") -> list:
  if isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
    return [d for k in old for d in _diff(old[k], new[k], f"{prefix}{k}.")]
  return [] if old == new else [(prefix.rstrip("."), new)]


def _plot_curves(ctx: RunContext, rows: list, unigram: float, bigram: float) -> str:
  plt = pyplot()
  train = [(r["step"], r["bpb"]) for r in rows if "bpb" in r]
  val = [(r["step"], r["val_bpb"]) for r in rows if "val_bpb" in r]
  fig, ax = plt.subplots(figsize=(6, 3.6))
  if train:
    ax.plot(*zip(*train, strict=True), label="train (batch)", lw=1)
  if val:
    ax.plot(*zip(*val, strict=True), "o-", label="validation")
  ax.axhline(unigram, ls=":", c="gray", label=f"unigram {unigram:.2f}")
  ax.axhline(bigram, ls="--", c="gray", label=f"bigram {bigram:.2f}")
  ax.set_xlabel("step")
  ax.set_ylabel("bits per byte")
  ax.set_title("Baseline Transformer LM, Tiny Shakespeare")
  ax.legend(fontsize=8)
  return ctx.save_figure(fig, "learning_curve.png", dpi=120)
