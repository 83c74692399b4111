"""Typed, frozen configs for the training stack (built from ConfigDicts by jaxmem.config_files)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from jaxmem.checks import check_config_ints
from jaxmem.models import bodies
from jaxmem.models.bodies import BodyConfig
from jaxmem.models.transformer import TransformerConfig


def _finite(owner: str, name: str, value, lo: float = -math.inf, hi: float = math.inf) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
      or not lo <= value <= hi:
    raise ValueError(f"{owner}.{name} must be a finite number in [{lo}, {hi}], got {value!r}.")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimiser (AdamW, linear warmup then cosine decay, global-norm clipping) and loop.

  Attributes:
    n_steps: total optimizer steps (the schedule's length).
    lr: peak learning rate, reached after ``warmup_steps``.
    min_lr_ratio: the cosine decays to ``lr * min_lr_ratio`` at ``n_steps``.
    weight_decay: decoupled weight decay, applied to matrices and embeddings only (from the parameters'
      logical axes, :func:`jaxmem.sharding.decays`; parameters without axes get none, and train() warns).
    grad_clip: global gradient-norm clip (0 disables).
    ckpt_every: save a checkpoint every this many steps (and at the end).
    keep_checkpoints: how many recent checkpoints to keep.
    eval_every: evaluate on the validation split every this many steps (0: only at the end).
    log_every: write a metrics row every this many steps.
    model_axis: size of the mesh's ``model`` axis (heads and FFN hidden units are split over it;
      :mod:`jaxmem.sharding`); the ``data`` axis takes the remaining devices. 1: data parallel only.
    ponder_cost: ACT's ponder cost ``τ`` added to the loss (:func:`jaxmem.train.losses.with_ponder_cost`), for
      models that report their ponder (``UniMatrixConfig(act=True)``); 0: none.
    tensorboard: also write the metrics rows' scalars (loss, lr, tokens/s, eval metrics) as TensorBoard
      events to ``workdir/tb`` (needs ``tensorboardX``: ``pip install 'jaxmem[tensorboard]'``).
  """

  n_steps: int = 1000
  lr: float = 1e-3
  min_lr_ratio: float = 0.1
  warmup_steps: int = 100
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  grad_clip: float = 1.0
  seed: int = 0
  ckpt_every: int = 200
  keep_checkpoints: int = 3
  eval_every: int = 0
  log_every: int = 10
  model_axis: int = 1
  ponder_cost: float = 0.0
  tensorboard: bool = False

  def __post_init__(self):
    o = "TrainConfig"
    check_config_ints(self, ("n_steps", "ckpt_every", "keep_checkpoints", "log_every", "model_axis"))
    check_config_ints(self, ("warmup_steps", "eval_every", "seed"), allow_zero=True)
    _finite(o, "lr", self.lr, 0.0)
    _finite(o, "min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
    _finite(o, "weight_decay", self.weight_decay, 0.0)
    _finite(o, "b1", self.b1, 0.0, 1.0)
    _finite(o, "b2", self.b2, 0.0, 1.0)
    _finite(o, "grad_clip", self.grad_clip, 0.0)
    _finite(o, "ponder_cost", self.ponder_cost, 0.0)
    if not isinstance(self.tensorboard, bool):
      raise ValueError(f"TrainConfig.tensorboard must be True or False, got {self.tensorboard!r}.")
    if self.warmup_steps > self.n_steps:
      raise ValueError(
          f"TrainConfig.warmup_steps={self.warmup_steps} exceeds n_steps={self.n_steps}."
      )


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Byte corpus and windows.

  Attributes:
    corpus: ``tinyshakespeare`` or ``wikitext2``.
    path: explicit corpus location (else ``$JAXMEM_DATA_DIR``, cache, ...).
    seq_len: window length in bytes.
    batch_size: global batch size (split over devices; must be divisible by their count).
    eval_batch_size: windows per evaluation batch.
    eval_max_windows: cap on validation windows during training (0: the whole split);
      the final evaluation always uses the whole split.
    pack: train on whole documents packed into rows with segment ids (:mod:`jaxmem.data.packing`: Tiny
      Shakespeare split at blank lines, WikiText-2 at article titles), the loss masked where a target starts
      the next document; the model reads no byte across a document boundary (every registered body takes
      ``segment_ids``; one that does not is refused). False: random windows of the byte stream. Evaluation is
      the same either way (windows of the validation split).
  """

  corpus: str = "tinyshakespeare"
  path: Optional[str] = None
  seq_len: int = 128
  batch_size: int = 32
  eval_batch_size: int = 64
  eval_max_windows: int = 0
  pack: bool = False

  def __post_init__(self):
    check_config_ints(self, ("seq_len", "batch_size", "eval_batch_size"))
    check_config_ints(self, ("eval_max_windows",), allow_zero=True)
    if not isinstance(self.pack, bool):
      raise ValueError(f"DataConfig.pack must be True or False, got {self.pack!r}.")


BYTES = 256


@dataclasses.dataclass(frozen=True)
class LMConfig:
  """A byte language-model run: model, data, training.

  ``model`` is any registered body's config (:mod:`jaxmem.models.bodies`), tagged by its ``body`` field in the
  dict form: ``TransformerConfig`` (the default; every mixer, the hybrid, the triple latent),
  ``UniMatrixConfig``, ``DNCLMConfig``. Its vocabulary must hold the 256 byte values."""

  model: BodyConfig = TransformerConfig()
  data: DataConfig = DataConfig()
  train: TrainConfig = TrainConfig()

  def __post_init__(self):
    if not isinstance(self.model, BodyConfig):
      raise ValueError(f"LMConfig.model must be a model config (one of the bodies {bodies.names()}), "
                       f"got {type(self.model).__name__}.")
    where = f"model (body {self.model.body!r})"
    if self.model.vocab_size < BYTES:
      raise ValueError(f"{where}.vocab_size={self.model.vocab_size} cannot hold the {BYTES} byte values.")
    if getattr(self.model, "input_dim", 0) or getattr(self.model, "output_dim", 0):
      raise ValueError(f"{where}: a language model reads token ids and emits vocab_size logits; "
                       f"input_dim and output_dim must be 0.")
    max_len = getattr(self.model, "max_len", None)
    if max_len is not None and self.data.seq_len > max_len:
      raise ValueError(
          f"data.seq_len={self.data.seq_len} exceeds model.max_len={max_len}."
      )
