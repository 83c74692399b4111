"""What the UniMatrix experiments share: the model zoo by name (the Transformer baselines are
:mod:`jaxmem.models.unimatrix.baselines`'), a generic trainer on a batch stream, accuracy at the
masked positions."""

from __future__ import annotations

import os
import statistics
from typing import Callable

import jax
import numpy as np
from flax import nnx

from jaxmem.models import TransformerLM, UniMatrixConfig, UniMatrixLM, count_params
from jaxmem.models.unimatrix import (
  VARIANTS,
  TypedLatentCompressor,
  TypedLatentConfig,
  recurrent_ffn_hybrid,
  triple_latent,
)
from jaxmem.models.unimatrix.baselines import matched_transformer, paper_transformer_config
from jaxmem.results import pyplot
from jaxmem.tasks import unimatrix as tt
from jaxmem.train.loop import TrainTask, apply_model, train
from jaxmem.train.losses import recall_loss
from jaxmem.train.recall import recall_train_config

# the paper's sizes (docs/papers/unimatrix.md): d_model 64, 3 shared steps, 4 heads, state 16
PAPER_SIZES = dict(d_model=64, depth=3, n_heads=4, state_dim=16)
LABELS = {"transformer": "Transformer", "transformer_matched": "Transformer (equal params)",
          "core": "UniMatrix-Core", "core_carry_state": "UniMatrix-Core, state carried across depth (leaks)",
          "rosa": "UniMatrix-ROSA", "discovery": "UniMatrix-Discovery",
          "dense_memory": "UniMatrix-Assoc", "sparse_pointer": "UniMatrix-SparsePointer",
          "sparse_pointer_dropout": "UniMatrix-SparsePointer, dropout 0.1",
          "hybrid": "Recurrent-FFN-Hybrid", "typed_latent": "Typed-Latent",
          "triple_latent": "generic triple-latent"}
MODEL_NAMES = tuple(LABELS)


def three_token_typed_config(latent_dim: int = 16, hidden: int = 64) -> TypedLatentConfig:
  """The :class:`~jaxmem.models.unimatrix.TypedLatentConfig` of
  :func:`jaxmem.tasks.unimatrix.three_token_batch`'s vocabulary."""
  return TypedLatentConfig(
      vocab_size=tt.THREE_TOKEN_VOCAB, tag_ids=tuple(range(tt.TAG0, tt.TAG0 + tt.MAX_TAGS)),
      role_ids=(tt.ROLE_A, tt.ROLE_B, tt.ROLE_C), digit_ids=tuple(range(tt.DIGIT0, tt.DIGIT0 + tt.NUM_DIGITS)),
      task_ids=tuple(range(tt.TASK_TOKEN0, tt.TASK_TOKEN0 + len(tt.THREE_TOKEN_TASKS))), query_id=tt.TT_QUERY,
      class_ids=tuple(range(tt.CLASS0, tt.CLASS0 + tt.NUM_CLASSES)), latent_dim=latent_dim, hidden=hidden)


def model_factory(name: str, *, vocab_size: int, max_len: int, **options) -> Callable[[nnx.Rngs], nnx.Module]:
  """``rngs -> model`` for ``name`` in :data:`MODEL_NAMES` at the paper's sizes; ``options`` go to
  :class:`~jaxmem.models.UniMatrixConfig` (a variant's overrides, e.g. ``n_slots=16, pointer=False``)."""
  if name not in MODEL_NAMES:
    raise ValueError(f"unknown model {name!r}; known: {list(MODEL_NAMES)}.")
  if name == "transformer":
    cfg = paper_transformer_config(vocab_size, max_len)
    return lambda rngs: TransformerLM(cfg, rngs=rngs)
  if name == "transformer_matched":
    core = nnx.eval_shape(lambda: UniMatrixLM(UniMatrixConfig(vocab_size=vocab_size, max_len=max_len,
                                                                **PAPER_SIZES), rngs=nnx.Rngs(0)))
    cfg, _ = matched_transformer(count_params(core), vocab_size=vocab_size, max_len=max_len)
    return lambda rngs: TransformerLM(cfg, rngs=rngs)
  if name == "hybrid":
    hcfg = recurrent_ffn_hybrid(vocab_size=vocab_size, max_len=max_len, d_model=64, n_layers=3, n_heads=4,
                                state_dim=16)
    return lambda rngs: TransformerLM(hcfg, rngs=rngs)
  if name == "typed_latent":
    tcfg = three_token_typed_config()
    return lambda rngs: TypedLatentCompressor(tcfg, rngs=rngs)
  if name == "triple_latent":
    gcfg = triple_latent(vocab_size=vocab_size, max_len=max_len, d_model=64, n_layers=2, n_heads=4,
                         state_dim=16)
    return lambda rngs: TransformerLM(gcfg, rngs=rngs)
  if name == "core_carry_state":   # the released code's future-token leak, to measure what it is worth
    name, options = "core", {**options, "carry_state": True}
  if name == "sparse_pointer_dropout":   # the paper's 75.6% recall row
    name, options = "sparse_pointer", {"dropout": 0.1, **options}
  assert name in VARIANTS
  ucfg = UniMatrixConfig(variant=name, vocab_size=vocab_size, max_len=max_len, **{**PAPER_SIZES, **options})
  return lambda rngs: UniMatrixLM(ucfg, rngs=rngs)


def train_on_stream(init_model, stream, n_steps: int, lr: float, workdir: str | os.PathLike, progress: bool,
                    loss_fn=recall_loss, seed: int = 0):
  """Trains (or resumes from ``workdir``'s checkpoints) ``init_model`` on ``stream`` with ``loss_fn``; returns
  ``(model, history)`` (history: the metrics rows)."""
  task = TrainTask(init_model=init_model, loss_fn=loss_fn, train_iter=stream)
  result = train(task, recall_train_config(n_steps, lr, seed), workdir, progress=progress)
  return result.model, result.history


def masked_accuracy(model: nnx.Module, stream, n_batches: int, group_key: str = "") -> dict:
  """Argmax accuracy at ``mask == 1`` over the first ``n_batches`` batches of ``stream``: ``{"all": a}``, and
  per value of ``batch[group_key]`` (one int per row, e.g. the three-token task) when given."""
  hits, counts = {}, {}
  for i in range(n_batches):
    b = stream.batch_at(i)
    pred = np.asarray(apply_model(_predict, model, b["inputs"]))
    mask = np.asarray(b["mask"]) > 0
    ok = (pred == np.asarray(b["targets"])) & mask
    groups = np.asarray(b[group_key]) if group_key else np.zeros(ok.shape[0], int)
    for g in np.unique(groups):
      rows = groups == g
      hits[int(g)] = hits.get(int(g), 0) + int(ok[rows].sum())
      counts[int(g)] = counts.get(int(g), 0) + int(mask[rows].sum())
  out = {"all": sum(hits.values()) / max(1, sum(counts.values()))}
  if group_key:
    out.update({g: hits[g] / max(1, counts[g]) for g in sorted(hits)})
  return out


def _predict(model: nnx.Module, x: jax.Array) -> jax.Array:
  return model(x).argmax(-1)


def mean_sd(values, fmt: str = ".3f") -> str:
  """``"m ± sd"`` (sample standard deviation over seeds), or ``"m"`` for one value, formatted by ``fmt``."""
  m = statistics.fmean(values)
  return f"{m:{fmt}}" if len(values) == 1 else f"{m:{fmt}} ± {statistics.stdev(values):{fmt}}"


def percent_mean_sd(values) -> str:
  """:func:`mean_sd` in percent, one decimal."""
  return mean_sd([100 * v for v in values], ".1f")


def run_tag(base: str, **fields) -> str:
  """A work-dir name that records what was trained (``core_p4-steps400-bs32-lr0.003``), so a rerun with other
  settings in the same output folder trains afresh instead of resuming a checkpoint of another budget."""
  return base + "".join(f"-{k}{v}" for k, v in fields.items())


def plot_accuracy_curves(ctx, results: dict, lines: dict, filename: str = "learning_curves.png") -> str:
  """Training accuracy (last position) against step for each model of ``results`` (name -> ``{"curve":
  [(step, accuracy)]}``), with horizontal reference ``lines`` (label -> value); returns the figure's path."""
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(6, 3.6))
  for i, (name, r) in enumerate(results.items()):
    if r["curve"]:
      # one logged batch is a noisy estimate (16–64 last positions): the raw points faint, a running mean
      # over ~1/10 of the run drawn over them
      steps, acc = (np.asarray(a, float) for a in zip(*r["curve"], strict=True))
      w = max(1, len(acc) // 10)
      smooth = np.convolve(acc, np.ones(w) / w, mode="valid")
      color = f"C{i % 10}"
      ax.plot(steps, acc, color=color, lw=0.6, alpha=0.3)
      ax.plot(steps[w - 1:], smooth, color=color, lw=1.5, label=LABELS[name])
  for (label, value), style in zip(lines.items(), (":", "--", "-."), strict=False):
    ax.axhline(value, ls=style, c="gray", label=label)
  ax.set_xlabel("step")
  ax.set_ylabel("train accuracy (running mean)")
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=7)
  return ctx.save_figure(fig, filename)
