"""A RULER subset at byte level, trained per task and scored as RULER scores: the paper's small models score 0.

Tasks (``jaxmem.tasks.ruler``, after NVIDIA/RULER; ``docs/papers/unimatrix.md``, *RULER subset*):
needle in a haystack with one key (``niah_single_1``) or among distractor keys (``niah_multikey_2``,
and ``niah_multikey_3`` with UUIDs), variable tracking (``vt``), common and frequent words extraction
(``cwe``, ``fwe``). ``length`` is the prompt's size in bytes; a task whose smallest haystack does not
fit (:func:`jaxmem.tasks.ruler.min_length`, 444–1,017 bytes) is not run at that length.

For each model, task, length and seed of ``seeds`` a fresh model (seeded initialisation) is trained
for ``train_steps`` steps on its own stream of examples (``prompt + completion``, teacher forced,
the loss on the completion bytes only: :func:`jaxmem.tasks.ruler.encode`), then
``eval_examples`` held-out examples (seeds ``0, 1, …``; training rows never use them) are
answered by **greedy decoding**: ``len(completion)`` bytes, each the argmax given the prompt and
the bytes decoded so far. The score is RULER's ``string_match_all``
(:func:`jaxmem.tasks.ruler.score`: the fraction of the expected strings contained in the
decoded text, ×100), averaged over examples; the tables give its mean ± sample standard deviation
over seeds. The teacher-forced accuracy on the completion bytes (argmax at each byte given the true
ones before it) is reported beside it: a finer signal while the string match is 0.

Every task at one length is padded to the same array length, ``length +`` the longest completion
``− 1``, so a model compiles one training step per length. Vocabulary 259 (bytes + 3 unused
specials, the paper's size). Sizes: ``configs/unimatrix_ruler.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxmem.data.batches import PositionedBatches
from jaxmem.experiments import ExperimentResult, RunContext, Table, register
from jaxmem.experiments.unimatrix.common import LABELS, MODEL_NAMES, model_factory, percent_mean_sd, run_tag
from jaxmem.models import count_params
from jaxmem.tasks import ruler
from jaxmem.train.loop import TrainTask, apply_model, train
from jaxmem.train.losses import recall_loss
from jaxmem.train.recall import recall_train_config

VOCAB = 259
TRAIN_SEED0 = 1 << 40   # seed s trains on example seeds (s + 1)·2⁴⁰ + …; held-out examples use 0, 1, …
PAPER = "0"             # the paper: its small models score 0 on every task


@dataclasses.dataclass(frozen=True)
class RulerSettings:
  models: tuple          # names in jaxmem.experiments.unimatrix.common.MODEL_NAMES
  tasks: tuple           # names in jaxmem.tasks.ruler.RULER_TASKS
  lengths: tuple         # prompt lengths in bytes
  seeds: tuple           # each (model, task, length) trains once per seed
  train_steps: int
  batch_size: int
  lr: float
  eval_examples: int     # held-out examples per (task, length), greedy-decoded and scored

  def __post_init__(self):
    for field, names, known in (("models", self.models, MODEL_NAMES), ("tasks", self.tasks, ruler.RULER_TASKS)):
      unknown = [n for n in names if n not in known]
      if unknown or not names:
        raise ValueError(f"RulerSettings.{field} must be a non-empty tuple of names from {list(known)}, "
                         f"got {names!r}.")
    if not self.seeds or not self.lengths:
      raise ValueError(f"RulerSettings.seeds and .lengths must not be empty, got {self.seeds!r} and "
                       f"{self.lengths!r}.")
    if self.eval_examples < 1:
      raise ValueError(f"RulerSettings.eval_examples must be >= 1, got {self.eval_examples!r}.")


@functools.lru_cache(maxsize=None)
def completion_bytes(task: str) -> int:
  """Bytes of ``task``'s completion (``" " + ", ".join(answers) + "."``): the same for every seed and length,
  since every drawn string has a fixed width."""
  return len(ruler.generate(task, seed=0, length=ruler.min_length(task)).completion.encode())


class RulerStream(PositionedBatches):
  """Training batches of ``task`` at ``length``: the batch at position ``p`` holds the examples of seeds
  ``(seed + 1)·2⁴⁰ + p·B + i`` for rows ``i < B`` (:func:`jaxmem.tasks.ruler.ruler_batch`), so it is a pure
  function of ``(seed, p)`` and never holds a held-out example; the state is ``{seed, position}``."""

  def __init__(self, task: str, seed: int, *, batch_size: int, length: int, answer_bytes: int):
    self.task, self.batch_size, self.length, self.answer_bytes = task, batch_size, length, answer_bytes
    self.seed, self.position = int(seed), 0

  def set_state(self, state: dict) -> None:
    if int(state["seed"]) != self.seed:
      raise ValueError(f"iterator state has seed {state['seed']}, this iterator {self.seed}.")
    self.position = int(state["position"])

  def batch_at(self, position: int) -> dict:
    first = (self.seed + 1) * TRAIN_SEED0 + position * self.batch_size
    batch = ruler.ruler_batch(self.task, seed=first, batch_size=self.batch_size, length=self.length,
                              answer_bytes=self.answer_bytes)
    return batch._asdict()


def greedy_decode(model: nnx.Module, tokens_BT: jax.Array, start: jax.Array, n: jax.Array,
                  out_BA: jax.Array) -> jax.Array:
  """``n`` greedily decoded bytes after the prompt ``tokens_BT[:, :start]``: byte ``i`` is the argmax of the
  logits at position ``start − 1 + i`` with byte ``i − 1`` written at ``start − 1 + i``. The model sees the
  whole ``[B, T]`` buffer each time (it is causal, so the positions after ``start − 1 + i`` do not matter).
  Returns ``out_BA`` (``A >= n``) with the bytes in columns ``[0, n)``."""
  T = tokens_BT.shape[1]
  # the module is rebuilt in the loop's body from its state carried through the loop (NNX's own transforms in
  # the model refuse variables traced outside the loop)
  graphdef, state = nnx.split(model)

  def body(i, carry):
    tokens, out, state = carry
    logits = nnx.merge(graphdef, state)(tokens)
    logits = jax.lax.dynamic_index_in_dim(logits, start - 1 + i, axis=1, keepdims=False)   # [B, V]
    byte = jnp.argmax(logits, axis=-1).astype(tokens.dtype)
    out = jax.lax.dynamic_update_index_in_dim(out, byte, i, axis=1)
    # the last byte has no later position to feed (start + n − 1 may be T): writing it is not needed
    tokens = jax.lax.dynamic_update_index_in_dim(tokens, byte, jnp.minimum(start + i, T - 1), axis=1)
    return tokens, out, state

  return jax.lax.fori_loop(0, n, body, (tokens_BT, out_BA, state))[1]


def _argmax(model: nnx.Module, tokens_BT: jax.Array) -> jax.Array:
  return model(tokens_BT).argmax(-1)


def _text(row) -> str:
  """Decoded bytes as text, one character per byte (ids above 255, the unused specials, as U+FFFD)."""
  return "".join(chr(b) if b < 256 else "\ufffd" for b in np.asarray(row).tolist())


def evaluate(model: nnx.Module, task: str, length: int, answer_bytes: int, n_examples: int,
             chunk: int) -> dict:
  """RULER's score and the teacher-forced completion-byte accuracy of ``model`` on the held-out examples
  ``0 … n_examples − 1`` of ``task`` at ``length``, ``chunk`` examples at a time: ``{"score", "byte_accuracy",
  "predictions"}`` (score in [0, 1]; predictions: the first examples' decoded texts)."""
  scores, hits, total, predictions = [], 0, 0, []
  for lo in range(0, n_examples, chunk):
    batch, examples = ruler.ruler_batch(task, seed=lo, batch_size=min(chunk, n_examples - lo), length=length,
                                        answer_bytes=answer_bytes, return_examples=True)
    start = len(examples[0].prompt)
    n = len(examples[0].completion)
    assert all(len(e.prompt) == start and len(e.completion) == n for e in examples), task
    tokens = np.array(batch.inputs)
    tokens[:, start:] = 0                     # nothing of the completion reaches the decoder
    out = np.asarray(apply_model(greedy_decode, model, jnp.asarray(tokens), start, n,
                                 jnp.zeros((tokens.shape[0], answer_bytes), jnp.int32)))
    for row, e in zip(out, examples, strict=True):
      text = _text(row[:n])
      scores.append(ruler.score(task, text, e.answers))
      if len(predictions) < 3:
        predictions.append(text)
    pred = np.asarray(apply_model(_argmax, model, jnp.asarray(batch.inputs)))
    mask = batch.mask > 0
    hits += int(((pred == batch.targets) & mask).sum())
    total += int(mask.sum())
  return {"score": float(np.mean(scores)), "byte_accuracy": hits / total, "predictions": predictions}


def _run_one(ctx, s: RulerSettings, name: str, task: str, length: int, seed: int, answer_bytes: int) -> dict:
  t0 = time.perf_counter()
  T = length + answer_bytes - 1
  stream = RulerStream(task, seed, batch_size=s.batch_size, length=length, answer_bytes=answer_bytes)
  train_task = TrainTask(init_model=model_factory(name, vocab_size=VOCAB, max_len=T), loss_fn=recall_loss,
                         train_iter=stream)
  workdir = ctx.outdir / run_tag(f"L{length}_{task}_{name}_s{seed}", T=T, steps=s.train_steps, bs=s.batch_size,
                                 lr=s.lr)
  result = train(train_task, recall_train_config(s.train_steps, s.lr, seed), workdir, progress=ctx.progress)
  scores = evaluate(result.model, task, length, answer_bytes, s.eval_examples, s.batch_size)
  return {**scores, "params": count_params(result.model), "seconds": time.perf_counter() - t0}


@register("unimatrix_ruler", paper="unimatrix",
          description="A byte-level RULER subset (NIAH, variable tracking, common / frequent words), trained "
                      "per task, greedy-decoded and string-match scored: the paper's small models score 0.",
          config="unimatrix_ruler", settings=RulerSettings)
def run(ctx: RunContext, s: RulerSettings) -> ExperimentResult:
  runs, skipped = {}, []
  for length in s.lengths:
    tasks = [t for t in s.tasks if ruler.min_length(t) <= length]
    skipped += [f"{t} at {length}" for t in s.tasks if t not in tasks]
    if not tasks:
      continue
    answer_bytes = max(completion_bytes(t) for t in tasks)
    for name in s.models:
      for task in tasks:
        runs[(name, task, length)] = [_run_one(ctx, s, name, task, length, seed, answer_bytes)
                                      for seed in s.seeds]
  if not runs:
    raise ValueError(f"no task of {s.tasks} fits at any of the lengths {s.lengths}: the smallest haystacks are "
                     f"{ {t: ruler.min_length(t) for t in s.tasks} } bytes.")

  def cells(key: str, name: str, length: int) -> list:
    out = [percent_mean_sd([r[key] for r in runs[(name, t, length)]]) if (name, t, length) in runs else "—"
           for t in s.tasks]
    means = [statistics.fmean(r[key] for r in runs[(name, t, length)]) for t in s.tasks
             if (name, t, length) in runs]
    return out + [f"{100 * statistics.fmean(means):.1f}"]

  lengths = [n for n in s.lengths if any(k[2] == n for k in runs)]
  head = ["length", "model", *s.tasks, "mean over tasks"]
  score_rows = [["any", "paper (its small models)"] + [PAPER] * (len(s.tasks) + 1)]
  score_rows += [[n, LABELS[name]] + cells("score", name, n) for n in lengths for name in s.models]
  byte_rows = [[n, LABELS[name]] + cells("byte_accuracy", name, n) for n in lengths for name in s.models]
  metrics = {f"{name}/{task}/L{length}": {"score": [r["score"] for r in rs],
                                          "byte_accuracy": [r["byte_accuracy"] for r in rs],
                                          "params": rs[0]["params"], "seconds": [r["seconds"] for r in rs],
                                          "predictions": rs[0]["predictions"]}
             for (name, task, length), rs in runs.items()}
  (ctx.outdir / "results.json").write_text(json.dumps(metrics, indent=2))
  best = max(runs, key=lambda k: statistics.fmean(r["score"] for r in runs[k]))
  best_score = 100 * statistics.fmean(r["score"] for r in runs[best])
  longest = {name: max((k for k in runs if k[0] == name), key=lambda k: k[2]) for name in s.models}
  params = {name: runs[key][0]["params"] for name, key in longest.items()}
  notes = [f"{s.train_steps} AdamW steps (lr {s.lr}, warmup + cosine, batch {s.batch_size}) per model, task, "
           f"length and seed (seeds {tuple(s.seeds)}), the loss on the completion bytes only; "
           f"{s.eval_examples} held-out examples per task and length, greedy-decoded for len(completion) "
           "bytes.",
           "Score: RULER's string_match_all (the fraction of the expected strings contained in the decoded "
           "text, ×100), mean ± sample standard deviation over seeds; 'mean over tasks' averages the tasks run "
           "at that length.",
           "Parameters (at the longest length; learned positions grow with it): "
           + ", ".join(f"{LABELS[n]} {p:,}" for n, p in params.items()) + ".",
           "Lengths are prompt bytes (RULER counts tokens, ≈ 4 bytes each). RULER's one-shot demonstrations "
           "(vt, cwe) are left out and its word lists replaced by pseudo-words: jaxmem.tasks.ruler."]
  if skipped:
    notes.append("Not run (the task's smallest haystack does not fit; min_length: "
                 + ", ".join(f"{t} {ruler.min_length(t)}" for t in s.tasks) + " bytes): " + ", ".join(skipped)
                 + ".")
  return ExperimentResult(
      summary=f"best {best_score:.1f}% string match ({LABELS[best[0]]}, {best[1]}, {best[2]} bytes) after "
              f"{s.train_steps} steps; the paper's small models score 0",
      tables=[Table("RULER string-match score (%), greedy decoding, mean ± sd over seeds", head, score_rows),
              Table("Completion-byte accuracy (%), teacher forced, mean ± sd over seeds", head, byte_rows)],
      notes=notes, metrics=metrics)
