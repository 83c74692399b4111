"""Losses, one place: each is ``loss_fn(model, batch) -> (scalar, metrics)`` for
:func:`jaxmem.train.loop.train`, or an array function they are built from. float32 throughout.

================================ ============================================================
loss                             used by
================================ ============================================================
:func:`lm_loss`                  byte LMs (``jaxmem train``, ``lm_baseline``)
:func:`recall_loss`              recall tasks: MQAR, multi-hop (``mqar``, ``assoc_depth_width``)
:func:`sequence_loss`            masked bit-vector tasks (``dnc_tasks``: copy, repeat copy, ...), from
                                 :func:`masked_sigmoid_cross_entropy` and :func:`bit_error_rate`
:func:`squared_error_loss`       one-hot read-outs (``assoc_capacity_onehot``'s trained keys)
:func:`with_ponder_cost`         any of these plus ACT's ponder cost (``UniMatrixConfig(act=True)``)
================================ ============================================================
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_choice, check_equal, check_rank

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
  bits per byte. A batch with ``segment_ids`` (packed documents) passes them to the model."""
  logits = model(batch["inputs"]) if "segment_ids" not in batch else \
      model(batch["inputs"], segment_ids=batch["segment_ids"])  # packed documents (jaxmem.data.packing)
  nll = token_nll(logits, batch["targets"])
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
  (:func:`masked_sigmoid_cross_entropy`: summed over channels,
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
  without ACT the ponder is the constant ``depth``). The metrics add ``ponder``. ``tau`` ≥ 0 (Graves:
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


__all__ = ["LN2", "REDUCTIONS", "bit_error_rate", "lm_loss", "masked_mean", "masked_sigmoid_cross_entropy",
           "recall_loss", "sequence_loss", "squared_error_loss", "token_nll", "with_ponder_cost"]


# ---------------------------------------------- bit-vector losses (algorithmic tasks: copy, repeat copy, ...)

REDUCTIONS = ("mean", "deepmind", "deepmind_time_average")  # of masked_sigmoid_cross_entropy


def _check_logits_targets_mask(logits, targets, mask) -> None:
  B, T, C = check_rank("logits", logits, 3, "B, T, C")
  Bt, Tt, Ct = check_rank("targets", targets, 3, "B, T, C")
  Bm, Tm = check_rank("mask", mask, 2, "B, T")
  check_equal("batch sizes", logits=B, targets=Bt, mask=Bm)
  check_equal("lengths", logits=T, targets=Tt, mask=Tm)
  check_equal("channels", logits=C, targets=Ct)


def masked_sigmoid_cross_entropy(logits: jax.Array, targets: jax.Array, mask: jax.Array, *,
                                 reduction: str = "mean") -> jax.Array:
  """Bernoulli cross-entropy of ``targets`` under ``sigmoid(logits)``, in nats.

  ``logits, targets [B, T, C]``, ``mask [B, T]``. The per-step loss **sums over channels**
  (DeepMind's ``dnc/repeat_copy.py`` convention: the NLL of the whole target vector), times
  the mask. Then, by ``reduction``:

  * ``"mean"`` (default): divided by the number of masked steps in the batch,
    ``Σ_{b,t} m[b,t] Σ_c xent[b,t,c] / Σ_{b,t} m[b,t]`` (0 if the mask is all zero).
  * ``"deepmind"``: DeepMind's default, summed over time and averaged over the batch.
  * ``"deepmind_time_average"``: DeepMind's ``time_average=True``: each example divided by
    its own mask count (+ float32 eps), then averaged over the batch.

  Returns a float32 scalar.
  """
  _check_logits_targets_mask(logits, targets, mask)
  check_choice("reduction", reduction, REDUCTIONS)
  return _xent(logits, targets, mask, reduction=reduction)


@functools.partial(jax.jit, static_argnames=("reduction",))
def _xent(logits, targets, mask, *, reduction):
  x_BTC = jnp.asarray(logits, jnp.float32)
  z_BTC = jnp.asarray(targets, jnp.float32)
  m_BT = jnp.asarray(mask, jnp.float32)
  # Stable form of -z log σ(x) - (1 - z) log(1 - σ(x)).
  xent_BTC = jnp.maximum(x_BTC, 0.0) - x_BTC * z_BTC + jnp.log1p(jnp.exp(-jnp.abs(x_BTC)))
  step_BT = jnp.sum(xent_BTC, axis=-1) * m_BT
  if reduction == "mean":
    count = jnp.sum(m_BT)
    return jnp.where(count > 0, jnp.sum(step_BT) / jnp.where(count > 0, count, 1.0), 0.0)
  per_example_B = jnp.sum(step_BT, axis=1)
  if reduction == "deepmind_time_average":
    per_example_B = per_example_B / (jnp.sum(m_BT, axis=1) + jnp.finfo(jnp.float32).eps)
  return jnp.mean(per_example_B)


def bit_error_rate(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
  """Fraction of wrong bits at masked steps; a bit is predicted 1 iff its logit is > 0.

  ``logits, targets [B, T, C]``, ``mask [B, T]`` (targets are read as 1 iff > 0.5). Returns
  ``Σ m[b,t] [pred ≠ target] / (C Σ m[b,t])`` as a float32 scalar (0 if the mask is all zero).
  """
  _check_logits_targets_mask(logits, targets, mask)
  return _bit_error_rate(logits, targets, mask)


@jax.jit
def _bit_error_rate(logits, targets, mask):
  wrong_BTC = ((jnp.asarray(logits) > 0) != (jnp.asarray(targets) > 0.5)).astype(jnp.float32)
  m_BT = jnp.asarray(mask, jnp.float32)
  count = jnp.sum(m_BT) * wrong_BTC.shape[-1]
  wrong = jnp.sum(wrong_BTC * m_BT[:, :, None])
  return jnp.where(count > 0, wrong / jnp.where(count > 0, count, 1.0), 0.0)
