"""Losses, one place: each is ``loss_fn(model, batch) -> (scalar, metrics)`` for
:func:`jaxmem.train.loop.train`, or an array function they are built from. float32 throughout.

================================ ============================================================
loss                             used by
================================ ============================================================
:func:`lm_loss`                  byte LMs (``jaxmem train``, ``lm_baseline``)
:func:`recall_loss`              recall tasks: MQAR, multi-hop (``mqar``, ``assoc_depth_width``)
:func:`sequence_loss`            masked bit-vector tasks (``dnc_tasks``: copy, repeat copy, ...)
:func:`squared_error_loss`       one-hot read-outs (``assoc_capacity_onehot``'s trained keys)
:func:`with_ponder_cost`         any of these plus ACT's ponder cost (``UniMatrixConfig(act=True)``)
================================ ============================================================
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.tasks.algorithmic import bit_error_rate, masked_sigmoid_cross_entropy

LN2 = math.log(2.0)


def token_nll(logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
  """Per-token negative log-likelihood in nats, float32: ``−log softmax(logits)[target]``."""
  logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(logp, targets_BT[..., None], axis=-1)[..., 0]


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """``Σ m x / max(Σ m, 1)`` (0 for an all-zero mask)."""
  m = mask.astype(jnp.float32)
  return (x * m).sum() / jnp.maximum(m.sum(), 1.0)


def lm_loss(model: nnx.Module, batch: dict) -> tuple:
  """Mean next-byte NLL (nats) over the batch (over ``batch["mask"]`` if present); metrics add
  bits per byte."""
  nll = token_nll(model(batch["inputs"]), batch["targets"])
  loss = masked_mean(nll, batch["mask"]) if "mask" in batch else nll.mean()
  return loss, {"bpb": loss / LN2}


def recall_loss(model: nnx.Module, batch: dict) -> tuple:
  """Token NLL at the query positions (``batch["mask"]``) and the argmax accuracy there."""
  logits = model(batch["inputs"])
  nll = token_nll(logits, batch["targets"])
  correct = (jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32)
  return masked_mean(nll, batch["mask"]), {"accuracy": masked_mean(correct, batch["mask"])}


def sequence_loss(model: nnx.Module, batch: dict) -> tuple:
  """Bernoulli cross-entropy of bit-vector targets at masked steps
  (:func:`~jaxmem.tasks.algorithmic.masked_sigmoid_cross_entropy`: summed over channels,
  averaged over masked steps) and the bit error rate."""
  logits = model(batch["observations"])
  loss = masked_sigmoid_cross_entropy(logits, batch["targets"], batch["mask"])
  return loss, {"bit_error": bit_error_rate(logits, batch["targets"], batch["mask"])}


def squared_error_loss(y_hat_BPV: jax.Array, y_BPV: jax.Array, weight_BP: jax.Array) -> tuple:
  """Weighted mean of ``0.5 ‖y − ŷ‖²`` over read-outs and the argmax accuracy (Schlag et al.
  2021's loss for one-hot values)."""
  w = weight_BP.astype(y_hat_BPV.dtype)
  cnt = jnp.maximum(jnp.sum(w), 1.0)
  loss = jnp.sum(w * 0.5 * jnp.sum((y_BPV - y_hat_BPV) ** 2, axis=-1)) / cnt
  acc = jnp.sum(w * (jnp.argmax(y_hat_BPV, -1) == jnp.argmax(y_BPV, -1))) / cnt
  return loss, acc


class _LogitsOnly:
  """A model stand-in for a loss: ``__call__(x)`` returns the logits of ``model(x, return_aux=True)`` and
  keeps the aux dict (the loss calls the model once; its ponder is read afterwards); every other
  attribute is the model's."""

  def __init__(self, model):
    if "return_aux" not in inspect.signature(type(model).__call__).parameters:
      raise ValueError(f"with_ponder_cost: {type(model).__name__}.__call__ has no return_aux argument "
                       "(ACT's ponder comes from UniMatrixLM).")
    self.model, self.aux = model, None

  def __call__(self, x):
    logits, self.aux = self.model(x, return_aux=True)
    return logits

  def __getattr__(self, name):
    return getattr(self.model, name)


def with_ponder_cost(loss_fn, tau: float):
  """``loss_fn`` plus ACT's ponder cost: ``loss + τ · mean_{b,t}(N + R)`` (Graves 2016, eq. 14, averaged
  over all positions, the loss's mask notwithstanding), for models called as
  ``model(x, return_aux=True) -> (logits, {"ponder": [B, T]})`` (:class:`~jaxmem.models.UniMatrixLM`;
  without ACT the ponder is the constant ``n_steps``). The metrics add ``ponder``. ``tau`` ≥ 0 (Graves:
  1e-3 to 1e-1); ``loss_fn`` must call the model once."""
  if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not 0 <= tau < math.inf:
    raise ValueError(f"`tau` must be a finite number >= 0, got {tau!r}.")
  return _PonderCost(loss_fn, float(tau))


@dataclasses.dataclass(frozen=True)
class _PonderCost:
  """:func:`with_ponder_cost`'s loss; equal (and hashing equal) for the same ``loss_fn`` and ``tau``, so runs
  that build it anew share one compiled train step (:func:`jaxmem.train.loop.compiled_train_step`)."""

  loss_fn: Callable
  tau: float

  def __call__(self, model, batch):
    proxy = _LogitsOnly(model)
    value, metrics = self.loss_fn(proxy, batch)
    if proxy.aux is None or "ponder" not in proxy.aux:
      raise ValueError("with_ponder_cost: the model returned no 'ponder' (or `loss_fn` never called it).")
    ponder = jnp.mean(proxy.aux["ponder"].astype(jnp.float32))
    return value + self.tau * ponder, {**metrics, "ponder": ponder}


__all__ = ["LN2", "lm_loss", "masked_mean", "recall_loss", "sequence_loss", "squared_error_loss", "token_nll",
           "with_ponder_cost"]
