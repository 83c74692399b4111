"""UniMatrix-Assoc's dense memory as a token mixer: every token appends ``(k, v)``; each reads
the top-K earlier entries by cosine, ``softmax(τ·cos)`` (:func:`jaxmem.kernels.topk_memory.topk_memory_read`),
and the read enters through a sigmoid gate ``σ(W_g x)`` (Liu Xiao 2026, ``docs/papers/unimatrix.md``).

Decoding keeps the memory as a KV cache (``k, v [B, max_len, H, D/H]``, the entries written per row
``length [B]``); each token reads the top-K of the entries before its own position
(``topk_memory_read(..., q_offset=length)``), keeping fewer while fewer exist, as the sequence form does.
Past ``max_len`` nothing wraps: the caller (a model's ``generate``) checks lengths on the host."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_config_ints, check_finite_number
from jaxmem.kernels.attention import kv_cache_append, kv_cache_init
from jaxmem.kernels.topk_memory import topk_memory_read
from jaxmem.models.layers import linear
from jaxmem.models.mixers.qkv import QKVMixer, check_short_conv, qkv_state_floats
from jaxmem.models.mixers.registry import MixerConfig, register


@dataclasses.dataclass(frozen=True)
class TopKMemoryConfig(MixerConfig):
  """Attributes:
    top_k: entries each read keeps (the paper's 8).
    temperature: ``τ`` of ``softmax(τ · cos)`` (the paper's 8).
    gated: multiply the read by ``σ(W_g x)`` (the paper's gated add).
    short_conv: as in :class:`~jaxmem.models.mixers.softmax.SoftmaxConfig`.
  """

  name: str = dataclasses.field(default="topk_memory", init=False)
  top_k: int = 8
  temperature: float = 8.0
  gated: bool = True
  short_conv: int = 0

  def state_floats(self, *, d_model: int, n_heads: int, seq_len: int) -> int:
    """The append-only memory of keys and values, ``2·T·d_model`` (plus the short convolution's last ``K − 1``
    inputs; the memory's integer lengths are not floats)."""
    return 2 * seq_len * d_model + qkv_state_floats(self, d_model)

  @classmethod
  def examples(cls) -> tuple:
    return (cls(), cls(gated=False, top_k=3))

  def __post_init__(self):
    check_short_conv(self)
    check_config_ints(self, ("top_k",))
    try:
      check_finite_number("temperature", self.temperature, positive=True)
    except ValueError:
      raise ValueError(f"TopKMemoryConfig.temperature must be a finite positive number, got "
                       f"{self.temperature!r}.") from None


class TopKMemory(QKVMixer):
  """Projections and the gate; the top-K read is the kernel's."""

  def __init__(self, cfg: TopKMemoryConfig, *, d_model, n_heads, n_layers, dtype, rngs):
    super().__init__(cfg, d_model=d_model, n_heads=n_heads, n_layers=n_layers, dtype=dtype, rngs=rngs)
    self.read_gate = nnx.data(linear(d_model, d_model, ("embed", "heads"), dtype=self.qkv.dtype, rngs=rngs)
                              if cfg.gated else None)

  def kernel(self, q, k, v, *, segment_ids=None):
    return topk_memory_read(q, k, v, top_k=self.cfg.top_k, temperature=self.cfg.temperature,
                            segment_ids=segment_ids)

  def kernel_init(self, batch_size: int, max_len: int) -> dict:
    """The memory ``{"k", "v": [B, max_len, H, D/H], "length": [B] int32}`` (a KV cache)."""
    return kv_cache_init(batch_size, max_len, self.n_heads, self.head_dim, dtype=self.qkv.dtype or jnp.float32)

  def kernel_scan(self, memory, q, k, v, *, lengths=None):
    new = kv_cache_append(memory, k, v, lengths)
    return new, topk_memory_read(q, new["k"], new["v"], top_k=self.cfg.top_k, temperature=self.cfg.temperature,
                                 q_offset=memory["length"])

  def _gate(self, y: jax.Array, x_BTD: jax.Array) -> jax.Array:
    return y if self.read_gate is None else y * jax.nn.sigmoid(self.read_gate(x_BTD))

  def __call__(self, x_BTD: jax.Array, segment_ids=None) -> jax.Array:
    return self._gate(super().__call__(x_BTD, segment_ids), x_BTD)

  def scan(self, state: dict, x_BTD: jax.Array, lengths=None) -> tuple:
    state, y = super().scan(state, x_BTD, lengths)   # (step is scan on one token)
    return state, self._gate(y, x_BTD)


register("topk_memory", TopKMemoryConfig, TopKMemory)
