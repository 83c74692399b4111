"""Training and evaluation windows over a byte stream.

* Training: :class:`RandomWindows`, random windows whose global batch at position ``p`` is a
  pure function of ``(seed, p)``. Its state is ``{seed, position}``, so a checkpoint restores
  the exact iterator; process ``i`` of ``n`` returns rows ``[i·B/n, (i+1)·B/n)`` of the global
  batch, so a run on any number of processes trains on the same batches.
* Evaluation: :func:`eval_windows`, deterministic, non-overlapping windows whose
  targets cover every byte after the first exactly once (the last window is padded and
  masked), so bits-per-byte is over the whole split.
"""

from __future__ import annotations

import numpy as np

from jaxmem.checks import check_positive_int


class PositionedBatches:
  """An iterator whose batch at position ``p`` is a pure function ``batch_at(p)`` of its seed.

  Its whole state is ``{seed, position}``, so a checkpoint restores the exact stream.
  """

  seed: int
  position: int

  def batch_at(self, position: int) -> dict:
    raise NotImplementedError

  def get_state(self) -> dict:
    return {"seed": self.seed, "position": self.position}

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    batch = self.batch_at(self.position)
    self.position += 1
    return batch


def check_process_split(batch_size: int, process_index, process_count: int) -> None:
  """``ValueError`` unless a global batch of ``batch_size`` rows splits over ``process_count`` processes and
  ``process_index`` is one of them."""
  check_positive_int("batch_size", batch_size)
  check_positive_int("process_count", process_count)
  if batch_size % process_count:
    raise ValueError(f"`batch_size`={batch_size} is not divisible by `process_count`={process_count}.")
  if isinstance(process_index, bool) or not isinstance(process_index, (int, np.integer)) \
      or not 0 <= process_index < process_count:
    raise ValueError(f"`process_index`={process_index!r} must be an int in [0, {process_count}).")


class RandomWindows(PositionedBatches):
  """Random ``(inputs, targets)`` windows of ``seq_len`` bytes; ``targets`` is shifted by 1.

  ``batch_size`` is the global batch; with ``process_count = n`` each batch holds this process's
  ``batch_size / n`` rows of it (``process_index`` picks which).
  """

  def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int = 0,
               *, process_index: int = 0, process_count: int = 1):
    check_positive_int("seq_len", seq_len)
    check_process_split(batch_size, process_index, process_count)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
      raise ValueError(f"`tokens` must be 1-D, got shape {tokens.shape}.")
    if tokens.shape[0] < seq_len + 1:
      raise ValueError(
          f"`tokens` has {tokens.shape[0]} entries, fewer than seq_len + 1 = {seq_len + 1}."
      )
    self.tokens = tokens.astype(np.int32)
    self.seq_len, self.batch_size = seq_len, batch_size
    self.seed, self.process_index, self.position = int(seed), int(process_index), 0
    self.process_count = int(process_count)

  def set_state(self, state: dict) -> None:
    if int(state["seed"]) != self.seed:
      raise ValueError(f"iterator state has seed {state['seed']}, this iterator {self.seed}.")
    self.position = int(state["position"])

  def batch_at(self, position: int) -> dict:
    # the global batch's starts (the trailing 0 keeps the single-process stream of earlier versions)
    rng = np.random.default_rng([self.seed, position, 0])
    starts = rng.integers(0, self.tokens.shape[0] - self.seq_len, size=self.batch_size)
    local = self.batch_size // self.process_count
    starts = starts[self.process_index * local:(self.process_index + 1) * local]
    idx = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
    window = self.tokens[idx]
    return {"inputs": window[:, :-1], "targets": window[:, 1:]}


def eval_windows(tokens: np.ndarray, seq_len: int) -> dict:
  """Non-overlapping windows: ``inputs, targets, mask`` each ``[W, seq_len]``.

  Target ``j`` of window ``w`` is ``tokens[w * seq_len + j + 1]``; ``mask`` is 0 on the
  padding of the last window. ``mask.sum() == len(tokens) - 1``.
  """
  check_positive_int("seq_len", seq_len)
  tokens = np.asarray(tokens).astype(np.int32)
  if tokens.ndim != 1 or tokens.shape[0] < 2:
    raise ValueError(f"`tokens` must be 1-D with at least 2 entries, got shape {tokens.shape}.")
  n_targets = tokens.shape[0] - 1
  n_windows = -(-n_targets // seq_len)
  padded = np.zeros(n_windows * seq_len + 1, np.int32)
  padded[: tokens.shape[0]] = tokens
  inputs = padded[:-1].reshape(n_windows, seq_len)
  targets = padded[1:].reshape(n_windows, seq_len)
  mask = (np.arange(n_windows * seq_len) < n_targets).astype(np.float32).reshape(n_windows, seq_len)
  return {"inputs": inputs, "targets": targets, "mask": mask}


def ngram_bpb(train: np.ndarray, evaluate: np.ndarray, order: int, alpha: float = 0.1,
              vocab_size: int = 256) -> float:
  """Bits per byte of an add-``alpha`` smoothed unigram (``order=1``) or bigram (``order=2``).

  The calibration points for any LM on a byte corpus: on Tiny Shakespeare's validation
  split these are 4.81 (unigram) and 3.57 (bigram, alpha 0.1) bits per byte.
  """
  train = np.asarray(train).astype(np.int64)
  evaluate = np.asarray(evaluate).astype(np.int64)
  if order == 1:
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + alpha
    p = counts / counts.sum()
    return float(-np.log2(p[evaluate]).mean())
  if order == 2:
    counts = np.zeros((vocab_size, vocab_size))
    np.add.at(counts, (train[:-1], train[1:]), 1.0)
    counts += alpha
    p = counts / counts.sum(axis=1, keepdims=True)
    return float(-np.log2(p[evaluate[:-1], evaluate[1:]]).mean())
  raise ValueError(f"`order` must be 1 or 2, got {order!r}.")


class KeyedBatches(PositionedBatches):
  """Batches of a pure generator ``fn(key, **kwargs) -> NamedTuple`` at positions 0, 1, ...

  The batch at position ``p`` uses ``fold_in(key(seed), p)``, so the iterator's whole state
  is ``{seed, position}`` and a checkpoint restores the exact stream. Fields come back as
  numpy arrays under their NamedTuple names (e.g. ``observations, targets, mask``).
  """

  def __init__(self, fn, seed: int, **kwargs):
    self.fn, self.kwargs, self.seed, self.position = fn, kwargs, int(seed), 0

  def set_state(self, state: dict) -> None:
    self.seed, self.position = int(state["seed"]), int(state["position"])

  def batch_at(self, position: int) -> dict:
    import jax
    batch = self.fn(jax.random.fold_in(jax.random.key(self.seed), position), **self.kwargs)
    return {k: np.asarray(v) for k, v in batch._asdict().items()}
