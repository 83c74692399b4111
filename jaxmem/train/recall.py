"""Training and scoring Transformers on recall tasks (MQAR, multi-hop recall).

Shared by the ``mqar`` and ``assoc_depth_width`` experiments (``docs/papers/pavlovian.md``):

* :func:`recall_mixer` — the token mixer of a recall model: softmax attention or a
  conditioning circuit of one learning rule;
* :func:`recall_train_config` — the optimiser / checkpoint schedule used for recall runs;
* :func:`train_recall` — trains (or, with a finished checkpoint in ``workdir``, restores) a
  :class:`~jaxmem.models.TransformerLM` on a recall stream with
  :func:`~jaxmem.train.losses.recall_loss`;
* :func:`recall_accuracy` — argmax accuracy at the query positions over a stream's first batches;
* :func:`state_floats` — the size of a model's recurrent state at the end of a sequence.

Streams are :func:`~jaxmem.tasks.mqar.mqar_stream` / :func:`~jaxmem.tasks.mqar.multihop_stream`
(batches with ``inputs / targets / mask``).
"""

from __future__ import annotations

import os

import jax
import numpy as np
from flax import nnx

from jaxmem.kernels.assoc import ERASE_RULES
from jaxmem.models import AssocConfig, MixerConfig, SoftmaxConfig, TransformerConfig, TransformerLM
from jaxmem.train.config import TrainConfig
from jaxmem.train.loop import TrainTask, apply_model, train
from jaxmem.train.losses import recall_loss


def recall_mixer(name: str, short_conv: int = 0) -> MixerConfig:
  """Softmax attention (``name="softmax"``) or a conditioning circuit of rule ``name``
  (chunked form, chunk 16; L2-normalised keys for the erasing rules delta / oja /
  gated_delta), with a causal short convolution of width ``short_conv`` on q/k/v (0: none)."""
  if name == "softmax":
    return SoftmaxConfig(short_conv=short_conv)
  return AssocConfig(rule=name, mode="chunked", chunk_size=16, key_norm=name in ERASE_RULES,
                     short_conv=short_conv)


def recall_train_config(n_steps: int, lr: float, seed: int = 0) -> TrainConfig:
  """AdamW with warmup (``min(100, n_steps // 10)`` steps) + cosine, no weight decay, clipping
  at 1, four checkpoints (the last kept), 40 metrics rows."""
  return TrainConfig(n_steps=n_steps, lr=lr, warmup_steps=min(100, n_steps // 10), weight_decay=0.0,
                     grad_clip=1.0, ckpt_every=max(1, n_steps // 4), keep_checkpoints=1,
                     log_every=max(1, n_steps // 40), seed=seed)


def train_recall(mcfg: TransformerConfig, stream, cfg: TrainConfig, workdir: str | os.PathLike,
                 progress: bool = True) -> TransformerLM:
  """Trains (or resumes) a :class:`~jaxmem.models.TransformerLM` of config ``mcfg`` on the recall
  ``stream`` with :func:`~jaxmem.train.losses.recall_loss`; returns the trained model."""
  task = TrainTask(init_model=lambda rngs: TransformerLM(mcfg, rngs=rngs), loss_fn=recall_loss,
                   train_iter=stream)
  return train(task, cfg, workdir, progress=progress).model


def recall_accuracy(model: nnx.Module, stream, n_batches: int) -> float:
  """Mean over the first ``n_batches`` batches of ``stream`` of the query-position accuracy
  (:func:`~jaxmem.train.losses.recall_loss`'s ``accuracy``)."""
  return float(np.mean([float(apply_model(_accuracy, model, stream.batch_at(i))) for i in range(n_batches)]))


def _accuracy(model: nnx.Module, batch: dict) -> jax.Array:
  return recall_loss(model, batch)[1]["accuracy"]


def state_floats(cfg: TransformerConfig, seq_len: int) -> int:
  """Recurrent-state size at the end of a ``seq_len`` sequence: the KV cache ``2·L·T·d`` for
  softmax attention, one ``d_head × d_head`` matrix S per head and layer (``L·H·d_head²``)
  for a conditioning circuit; summed over layers, so a per-layer mixer tuple counts each layer's own."""
  per_layer = [2 * seq_len * cfg.d_model if isinstance(cfg.layer_mixer(i), SoftmaxConfig)
               else cfg.n_heads * cfg.head_dim * cfg.head_dim for i in range(cfg.n_layers)]
  return sum(per_layer)


__all__ = ["recall_accuracy", "recall_mixer", "recall_train_config", "state_floats",
           "train_recall"]
