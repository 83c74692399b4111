"""Causal average hard attention (AHAT): the attention of exact constructions (RASP programs,
simulators), and its soft limit ``softmax(β·q·k)`` for training.

Decoding keeps the KV cache of :class:`~jaxmem.models.mixers.softmax.SoftmaxAttention` (``k, v [B, max_len, H,
D/H]``, ``length [B]``) and reads it with ``q_offset=length``: the argmax set (or the soft weights) over the
cache positions up to each query's own, hard or soft alike."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional

import jax.numpy as jnp

from jaxmem.kernels.ahat import ahat_attention, soft_attention
from jaxmem.kernels.attention import kv_cache_append, kv_cache_init
from jaxmem.kernels.precision import PRECISIONS
from jaxmem.models.mixers.qkv import QKVMixer, check_short_conv, qkv_state_floats
from jaxmem.models.mixers.registry import MixerConfig, register


def _is_number(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


@dataclasses.dataclass(frozen=True)
class AHATConfig(MixerConfig):
  """Attributes:
    beta: None for hard AHAT (each query averages the values of its argmax set of keys,
      :func:`jaxmem.kernels.ahat.ahat_attention`); a finite number ``β > 0`` for the soft limit
      ``softmax(β · q·k)`` (:func:`jaxmem.kernels.ahat.soft_attention`). Scores are the raw
      ``q·k`` (no ``1/√d_head``), so ``β = d_head ** -0.5`` is the softmax mixer.
    tol: keys within ``tol`` of a query's best score tie with it (hard mode only; ignored
      when ``beta`` is set). 0 is the exact argmax set.
    precision: matmul precision of the kernel; "highest" by default (exactness is AHAT's
      contract); None is the platform default.
    short_conv: 0 for none; else the width ``K`` of a causal depthwise convolution over time
      applied to q, k and v after their projection (as in :class:`SoftmaxConfig`).
  """

  name: str = dataclasses.field(default="ahat", init=False)
  beta: Optional[float] = None
  tol: float = 0.0
  precision: Optional[str] = "highest"
  short_conv: int = 0

  def state_floats(self, *, d_model: int, n_heads: int, seq_len: int) -> int:
    """The KV cache, ``2·T·d_model`` (plus the short convolution's last ``K − 1`` inputs; the cache's integer
    lengths are not floats)."""
    return 2 * seq_len * d_model + qkv_state_floats(self, d_model)

  @classmethod
  def examples(cls) -> tuple:
    return (cls(), cls(beta=4.0))

  def __post_init__(self):
    check_short_conv(self)
    if self.beta is not None and not (_is_number(self.beta) and self.beta > 0):
      raise ValueError(
          f"AHATConfig.beta must be None (hard attention) or a finite number > 0, got {self.beta!r}.")
    if not (_is_number(self.tol) and self.tol >= 0):
      raise ValueError(f"AHATConfig.tol must be a finite number >= 0, got {self.tol!r}.")
    ok = self.precision is None or (isinstance(self.precision, str) and self.precision.lower() in PRECISIONS)
    if not ok:
      raise ValueError(
          f"AHATConfig.precision must be None or one of {list(PRECISIONS)}, got {self.precision!r}.")


class AHATAttention(QKVMixer):
  """Multi-head causal average hard attention: projections here, arithmetic in
  :func:`jaxmem.kernels.ahat.ahat_attention` (``beta=None``) or
  :func:`jaxmem.kernels.ahat.soft_attention` (``beta`` set).

  Hard attention has zero gradient with respect to q and k (the argmax set is piecewise
  constant in them): only the value path and ``W_O`` learn. Train with ``beta`` set (the soft
  limit), then evaluate hard with ``dataclasses.replace(cfg, beta=None)`` on the same
  parameters.
  """

  def kernel(self, q, k, v, *, segment_ids=None):
    return self._attend(q, k, v, segment_ids=segment_ids)

  def _attend(self, q, k, v, q_offset=None, segment_ids=None):
    c = self.cfg
    if c.beta is None:
      return ahat_attention(q, k, v, causal=True, tol=c.tol, precision=c.precision, q_offset=q_offset,
                            segment_ids=segment_ids)
    return soft_attention(q, k, v, beta=c.beta, causal=True, precision=c.precision, q_offset=q_offset,
                          segment_ids=segment_ids)

  def kernel_init(self, batch_size: int, max_len: int) -> dict:
    """The KV cache ``{"k", "v": [B, max_len, H, D/H], "length": [B] int32}``."""
    return kv_cache_init(batch_size, max_len, self.n_heads, self.head_dim, dtype=self.qkv.dtype or jnp.float32)

  def kernel_scan(self, cache, q, k, v, *, lengths=None):
    new = kv_cache_append(cache, k, v, lengths)
    return new, self._attend(q, new["k"], new["v"], q_offset=cache["length"])


register("ahat", AHATConfig, AHATAttention)
