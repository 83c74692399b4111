"""Causal softmax attention (Vaswani et al. 2017): the baseline every memory is compared with.

Decoding keeps a KV cache (:func:`jaxmem.kernels.attention.kv_cache_init`): ``k, v [B, max_len, H, D/H]`` in
the compute dtype and the tokens written per row, ``length [B]`` (rows may be at different positions). Each
``scan`` / ``step`` writes its tokens at ``length ..`` and reads the whole cache with the positions after each
query masked (``softmax_attention(..., q_offset=length)``): one program per chunk shape, whatever the
lengths. Past ``max_len`` nothing wraps (writes are dropped, the length still grows, reads stay finite): the
caller (a model's ``generate``) checks lengths on the host."""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax.numpy as jnp

from jaxmem.checks import check_config_ints
from jaxmem.kernels.attention import kv_cache_append, kv_cache_init, softmax_attention
from jaxmem.kernels.precision import PRECISIONS
from jaxmem.models.mixers.qkv import QKVMixer, check_short_conv, qkv_state_floats
from jaxmem.models.mixers.registry import MixerConfig, register


@dataclasses.dataclass(frozen=True)
class SoftmaxConfig(MixerConfig):
  """Attributes:
    short_conv: 0 for none; else the width ``K`` of a causal depthwise convolution over time
      applied to q, k and v after their projection, ``x'_t = Σ_{j<K} w_j ⊙ x_{t−j}`` (H3's
      shift / Zoology's and DeltaNet's short convolution; initialised to the identity
      ``w_0 = 1``, other taps 0). It lets one layer bind a key to its neighbouring token.
    precision: matmul precision of the attention kernel; None is the platform default.
    n_kv_heads: key/value heads (grouped-query attention: each serves ``n_heads / n_kv_heads`` query heads;
      1 is multi-query attention); 0 means ``n_heads``. The KV cache shrinks by the same factor.
  """

  name: str = dataclasses.field(default="softmax", init=False)
  short_conv: int = 0
  precision: Optional[str] = None
  n_kv_heads: int = 0

  def state_floats(self, *, d_model: int, n_heads: int, seq_len: int) -> int:
    """The KV cache, ``2·T·d_model·n_kv_heads / n_heads`` (plus the short convolution's last ``K − 1`` inputs;
    the cache's integer lengths are not floats)."""
    kv = self.n_kv_heads or n_heads
    return 2 * seq_len * (d_model // n_heads) * kv + qkv_state_floats(self, d_model, n_heads)

  @classmethod
  def examples(cls) -> tuple:
    return (cls(), cls(short_conv=2, n_kv_heads=1))

  def __post_init__(self):
    check_short_conv(self)
    check_config_ints(self, ("n_kv_heads",), allow_zero=True)
    ok = self.precision is None or (isinstance(self.precision, str) and self.precision.lower() in PRECISIONS)
    if not ok:
      raise ValueError(
          f"SoftmaxConfig.precision must be None or one of {list(PRECISIONS)}, got {self.precision!r}.")


class SoftmaxAttention(QKVMixer):
  """Multi-head causal softmax attention: projections here, arithmetic in
  :func:`jaxmem.kernels.attention.softmax_attention`."""

  def kernel(self, q, k, v, *, segment_ids=None):
    return softmax_attention(q, k, v, causal=True, precision=self.cfg.precision, segment_ids=segment_ids)

  def kernel_init(self, batch_size: int, max_len: int) -> dict:
    """The KV cache ``{"k", "v": [B, max_len, H, D/H], "length": [B] int32}`` (module docstring)."""
    return kv_cache_init(batch_size, max_len, self.n_k_heads, self.head_dim,
                         dtype=self.qkv.dtype or jnp.float32)

  def kernel_scan(self, cache, q, k, v, *, lengths=None):
    new = kv_cache_append(cache, k, v, lengths)
    return new, softmax_attention(q, new["k"], new["v"], causal=True, precision=self.cfg.precision,
                                  q_offset=cache["length"])


register("softmax", SoftmaxConfig, SoftmaxAttention)
