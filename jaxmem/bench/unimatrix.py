"""``jaxmem bench unimatrix``: UniMatrix training throughput vs an equal-parameter Transformer and the paper's.

What is measured: tokens per second of one jitted training step — forward, backward and the
AdamW update of :func:`jaxmem.train.loop.make_optimizer` built by
:func:`jaxmem.train.loop.make_train_step` on :func:`jaxmem.train.losses.lm_loss` — on random
byte sequences (vocabulary 259, ``d_model`` 64), each time the median of ``repeats`` calls after
one compiling call, timed round-robin across the models of one ``T`` (so that a change in a
shared machine's load falls on every model alike). Models, all with ``max_len = T`` (learned
positions, so each count grows by ``64 · T``):

* UniMatrix-Core at the paper's sizes (3 depth steps, 4 heads, state 16) in each form of its
  matrix-state kernel: ``mode="auto"`` (resolves to ``chunked`` for Core: no spectral norm),
  ``mode="recurrent"`` (a ``lax.scan`` over tokens) and, at the longest ``T``, ``chunked`` with
  chunk sizes other than the default 64;
* UniMatrix-SparsePointer (Core plus 32 slots, pointer-logit fusion, write gate);
* the baseline :class:`~jaxmem.models.transformer.TransformerLM` (softmax attention, 4 heads),
  twice: with the ``n_layers`` and ``d_ff`` of :func:`matched_transformer` for UniMatrix-Core's
  parameter count at the same ``T``, and for SparsePointer's. Each UniMatrix row's ratio is
  against the Transformer of its own parameter count;
* the paper's Transformer (:func:`~jaxmem.models.unimatrix.baselines.paper_transformer_config`:
  3 layers, ``d_ff = 4 · d_model``, about twice Core's parameters), the model the paper's
  throughput claim compares with. Every row also gets a ratio against it.

Every ``T`` gets the same number of tokens per step (``batch_tokens``; ``B = batch_tokens / T``),
so tokens/s compare across lengths. A second table gives forward-only (inference) tokens/s of
the same models and batches. Ratios are against the Transformer timed in the same run; on a
shared CPU the absolute numbers move with the machine's load, the ratios much less.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.bench.timing import time_call
from jaxmem.models import TransformerLM, UniMatrixConfig, UniMatrixLM, count_params
from jaxmem.models.unimatrix import baselines
from jaxmem.results import markdown_table
from jaxmem.train.config import TrainConfig
from jaxmem.train.loop import make_optimizer, make_train_step
from jaxmem.train.losses import lm_loss

VOCAB, D_MODEL, N_HEADS = 259, 64, 4
# the targets for Core's training throughput / the Transformer's: {T: minimum ratio}
TARGETS = {512: 0.5, 2048: 1.0}
TABLE_HEAD = ["T", "model", "params", "tokens/s", "ratio vs Transformer", "ratio vs paper's Transformer"]
# the rows besides the Transformer's; "core_chunks" is chunked Core at the other chunk sizes (longest T only)
MODELS = ("core", "core_recurrent", "core_chunks", "sparse_pointer")


def matched_transformer(target: int, max_len: int, layers: Sequence[int] = (1, 2, 3, 4)) -> tuple:
  """:func:`jaxmem.models.unimatrix.baselines.matched_transformer` at this benchmark's vocabulary and width."""
  return baselines.matched_transformer(target, vocab_size=VOCAB, max_len=max_len, d_model=D_MODEL,
                                       n_heads=N_HEADS, layers=layers)


# the paper's Transformer is always the second entry of a length's list (after the one matched to Core)
PAPER = 1


@dataclasses.dataclass(frozen=True)
class _Entry:
  name: str
  build: object   # () -> nnx.Module
  baseline: int   # index (in the same list) of the Transformer its ratio is taken against


def _models(T: int, longest: bool, chunk_sizes: Sequence[int], models: Sequence[str]) -> list:
  """The benchmarked models at length ``T``: the Transformer matched to Core first, the paper's Transformer
  second (index :data:`PAPER`), then those of ``models``; with SparsePointer, a second Transformer matched to
  it, just before it."""
  uni = lambda **kw: (lambda: UniMatrixLM(UniMatrixConfig(max_len=T, **kw), rngs=nnx.Rngs(0)))

  def transformer(variant: str) -> _Entry:
    cfg, _ = matched_transformer(count_params(nnx.eval_shape(uni(variant=variant))), T)
    label = {"core": "Core", "sparse_pointer": "SparsePointer"}[variant]
    return _Entry(f"Transformer ≈ {label} (L={cfg.n_layers}, d_ff={cfg.d_ff})",
                  lambda: TransformerLM(cfg, rngs=nnx.Rngs(0)), len(entries))

  paper = baselines.paper_transformer_config(VOCAB, T, d_model=D_MODEL, n_heads=N_HEADS)
  entries = []
  entries.append(transformer("core"))
  entries.append(_Entry(f"Transformer, paper's (L={paper.n_layers}, d_ff={paper.d_ff})",
                        lambda: TransformerLM(paper, rngs=nnx.Rngs(0)), 0))
  core = lambda name, **kw: _Entry(name, uni(variant="core", **kw), 0)
  if "core" in models:
    entries.append(core("Core (auto = chunked, C=64)"))
  if "core_recurrent" in models:
    entries.append(core("Core recurrent", mode="recurrent"))
  if longest and "core_chunks" in models:
    entries += [core(f"Core chunked C={c}", mode="chunked", chunk_size=c) for c in chunk_sizes if c != 64]
  if "sparse_pointer" in models:
    entries.append(transformer("sparse_pointer"))
    entries.append(_Entry("SparsePointer (auto)", uni(variant="sparse_pointer"), len(entries) - 1))
  return entries


def _batch(B: int, T: int) -> dict:
  """Random byte sequences: ``inputs``, ``targets`` (the next byte) ``[B, T]`` int32."""
  seq = jax.random.randint(jax.random.key(T), (B, T + 1), 0, 256, jnp.int32)
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:]}


def _compiled(model: nnx.Module, batch: dict) -> tuple:
  """``(train call, forward call)``, both compiled and run once: thunks returning device arrays."""
  graphdef, params, rngs, rest = nnx.split(model, nnx.Param, nnx.RngCount, ...)
  tx = make_optimizer(TrainConfig(n_steps=1000, warmup_steps=10))
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
  if jax.tree.leaves(rngs):   # a model with dropout: its counters travel in the state (as in the loop)
    state["rngs"] = rngs
  step = jax.jit(make_train_step(graphdef, lm_loss, tx))
  model.eval()                # the forward timing is inference: no dropout draws
  egraph, _, erngs, erest = nnx.split(model, nnx.Param, nnx.RngCount, ...)
  forward = jax.jit(lambda p, x: nnx.merge(egraph, p, erngs, erest)(x))
  train_call, fwd_call = (lambda: step(state, batch, rest)), (lambda: forward(params, batch["inputs"]))
  jax.block_until_ready((train_call(), fwd_call()))
  return train_call, fwd_call


def _interleaved_medians(calls: list, repeats: int) -> list:
  """Median seconds of each thunk, timed in ``repeats`` rounds that visit every thunk once.

  Round-robin rather than one thunk's repeats after another's, so that a change in the shared
  machine's load falls on every model alike and leaves the ratios alone.
  """
  times = [[] for _ in calls]
  for _ in range(repeats):
    for i, call in enumerate(calls):
      times[i].append(time_call(call, repeats=1, warmup=0))
  return [statistics.median(t) for t in times]


def run_unimatrix_bench(lengths: Sequence[int], batch_tokens: int, repeats: int,
                        chunk_sizes: Sequence[int] = (32, 64, 128), models: Sequence[str] = MODELS) -> list:
  """Rows ``dict(T, model, params, train_tps, fwd_tps, train_ratio, fwd_ratio, train_ratio_paper,
  fwd_ratio_paper)``, in table order: ``*_ratio`` against the row's equal-parameter Transformer,
  ``*_ratio_paper`` against the paper's Transformer, both timed in the same rounds."""
  unknown = [m for m in models if m not in MODELS]
  if unknown:
    raise ValueError(f"`models` must be drawn from {list(MODELS)}, got {unknown}.")
  rows = []
  for T in lengths:
    if batch_tokens % T:
      raise ValueError(f"`batch_tokens`={batch_tokens} must be a multiple of every length, got T={T}.")
    batch = _batch(batch_tokens // T, T)
    entries = _models(T, T == max(lengths), chunk_sizes, models)
    calls, params = [], []
    for entry in entries:
      model = entry.build()
      params.append(count_params(model))
      calls.append(_compiled(model, batch))
    t_train = _interleaved_medians([c[0] for c in calls], repeats)
    t_fwd = _interleaved_medians([c[1] for c in calls], repeats)
    for entry, n, tt, tf in zip(entries, params, t_train, t_fwd, strict=True):
      rows.append(dict(T=T, model=entry.name, params=n, train_tps=batch_tokens / tt, fwd_tps=batch_tokens / tf,
                       train_ratio=t_train[entry.baseline] / tt, fwd_ratio=t_fwd[entry.baseline] / tf,
                       train_ratio_paper=t_train[PAPER] / tt, fwd_ratio_paper=t_fwd[PAPER] / tf))
    del calls
  return rows


def _targets(rows: list) -> str:
  """One line per target of :data:`TARGETS` whose ``T`` was run: met or not, with the ratio."""
  lines = []
  for T, need in TARGETS.items():
    core = [r for r in rows if r["T"] == T and r["model"].startswith("Core (auto")]
    if not core:
      lines.append(f"* T={T}: not run (target ≥ {need:g}×).")
      continue
    ratio = core[0]["train_ratio"]
    cores = [r for r in rows if r["T"] == T and r["model"].startswith("Core")]
    best = max(cores, key=lambda r: r["train_ratio"])
    verdict = "**met**" if ratio >= need else "**not met**"
    lines.append(f"* T={T}: Core (auto) trains at {ratio:.2f}× the Transformer's tokens/s, target ≥ {need:g}×: "
                 f"{verdict} (fastest Core form here: {best['model']}, {best['train_ratio']:.2f}×).")
  return "\n".join(lines)


def bench_unimatrix(quick: bool = False, repeats: int = 5, *, lengths: Optional[Sequence[int]] = None,
                    batch_tokens: Optional[int] = None, chunk_sizes: Sequence[int] = (32, 64, 128),
                    models: Sequence[str] = MODELS) -> str:
  """UniMatrix-Core / SparsePointer vs the equal-parameter and the paper's Transformer: training and forward
  tokens/s.

  ``lengths`` (default 128, 512, 2048), ``batch_tokens`` (tokens per step, default 8192, quick
  4096), ``chunk_sizes`` (chunked Core at the longest length) and ``models`` (a subset of
  :data:`MODELS`; the Transformer matched to Core and the paper's always run) shrink the run, e.g. for tests.
  """
  lengths = tuple(lengths or (128, 512, 2048))
  batch_tokens = batch_tokens or (4096 if quick else 8192)
  repeats = min(repeats, 3) if quick else repeats
  rows = run_unimatrix_bench(lengths, batch_tokens, repeats, chunk_sizes, models)
  fmt = lambda r, key: [r["T"], r["model"], f"{r['params']:,}", f"{r[key + '_tps']:,.0f}",
                        f"{r[key + '_ratio']:.2f}×", f"{r[key + '_ratio_paper']:.2f}×"]
  platform = jax.devices()[0].platform
  return (
      f"### unimatrix: training throughput at equal parameters and against the paper's Transformer, vocab "
      f"{VOCAB}, d_model {D_MODEL}, {batch_tokens} tokens per step, float32, {platform}\n\n"
      "Tokens/s of a jitted training step (forward + backward + AdamW, `make_train_step` on `lm_loss`), "
      f"median of {repeats} rounds after compilation (each round times every model of a `T` once, so load "
      "changes on a shared machine fall on all alike); every model has `max_len = T`. The Transformer's depth "
      "and FFN width are the pair closest to the UniMatrix model's parameter count (`matched_transformer`); "
      "each ratio is against the Transformer of its own parameter count (the row marked ≈ that model). The "
      "last column is against the paper's Transformer (3 layers, d_ff = 4·d_model), timed in the same "
      "rounds.\n\n"
      + markdown_table(TABLE_HEAD, [fmt(r, "train") for r in rows])
      + "\n\nTargets (Core training tokens/s over the Transformer's):\n\n" + _targets(rows)
      + "\n\nForward only (inference), same models and batches:\n\n"
      + markdown_table(TABLE_HEAD, [fmt(r, "fwd") for r in rows]) + "\n"
  )


__all__ = ["MODELS", "TABLE_HEAD", "TARGETS", "bench_unimatrix", "matched_transformer", "run_unimatrix_bench"]
