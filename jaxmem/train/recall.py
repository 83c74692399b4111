"""Training and scoring Transformers on recall tasks (MQAR, multi-hop recall).

Shared by the ``mqar`` and ``assoc_depth_width`` experiments (``docs/papers/pavlovian.md``):

* :func:`recall_mixer` — the token mixer of a recall model: softmax attention or a
  conditioning circuit of one learning rule;
* :func:`recall_train_config` — the optimiser / checkpoint schedule used for recall runs;
* :func:`train_recall` — trains (or, with a finished checkpoint in ``workdir``, restores) a
  :class:`~jaxmem.models.TransformerLM` on a recall stream with
  :func:`~jaxmem.train.losses.recall_loss`;
* :func:`recall_accuracy` — argmax accuracy at the query positions over a stream's first batches.

A model's state size is its config's :meth:`~jaxmem.models.TransformerConfig.state_floats`.

Streams are :func:`~jaxmem.tasks.mqar.mqar_stream` / :func:`~jaxmem.tasks.mqar.multihop_stream`
(batches with ``inputs / targets / mask``).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from flax import nnx

from jaxmem.kernels.assoc import ERASE_RULES, RULES
from jaxmem.models import AssocConfig, MixerConfig, TransformerConfig, TransformerLM, mixers
from jaxmem.train.config import TrainConfig
from jaxmem.train.loop import TrainTask, apply_model, train
from jaxmem.train.losses import recall_loss


def recall_mixer(name: str, short_conv: int = 0) -> MixerConfig:
  """The token mixer of a recall model: a conditioning circuit of learning rule ``name`` (an associative memory:
  chunked form, chunk 16; L2-normalised keys for the erasing rules delta / oja / gated_delta), or any registered
  mixer by its name (``"softmax"``, ``"ssd"``, ...: its default config); with a causal short convolution of
  width ``short_conv`` on q/k/v (0: none) where the mixer's config has a ``short_conv`` field. A mixer without
  one ignores it (Mamba-2's ``ssd`` has its own convolution, ``SSDConfig.d_conv``; ``matrix_state`` has none),
  so compare such rows knowing that."""
  if name in RULES:
    return AssocConfig(rule=name, mode="chunked", chunk_size=16, key_norm=name in ERASE_RULES,
                       short_conv=short_conv)
  if name not in mixers.names():
    raise ValueError(f"unknown recall mixer {name!r}: a rule of {list(RULES)} or a mixer of {mixers.names()}.")
  config_cls = mixers.lookup(name)[0]
  has_conv = "short_conv" in {f.name for f in dataclasses.fields(config_cls)}
  return config_cls(short_conv=short_conv) if has_conv else config_cls()


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


__all__ = ["recall_accuracy", "recall_mixer", "recall_train_config", "train_recall"]
