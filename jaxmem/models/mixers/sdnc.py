"""Attention read as a stateless DNC (Tang & Xie 2026, ``docs/papers/sdnc.md``), and its hybrids.

* ``"sdnc"`` (:class:`SDNCRead`): every head is a read head of a write-once memory, run
  under ``lax.scan`` by :func:`jaxmem.kernels.sdnc.sdnc_attention`. Same function as
  ``"softmax"`` with the same weights (tested: ``tests/models/test_sdnc_models.py``); it
  exists to make the equivalence executable, not for speed.
* ``"sdnc_hybrid"`` (:class:`SDNCHybrid`): the paper's three DNC mechanisms put back into
  attention, each a flag — (a) ``write_gate``, a learned per-head gate on each written slot;
  (b) ``erase``, a learned per-head retention applied to all written slots at each step;
  (c) ``link_reads``, learned per-head read modes mixing content reads with reads of the
  successor / predecessor of the attended slot. The gate projections start near the
  neutral values (write ≈ 1, retain ≈ 1, content reads), so a hybrid starts close to plain
  attention, and with every flag off it *is* softmax attention.

Decoding: the sDNC's memory is a KV cache (``k, v [B, max_len, H, D/H]``, the slots written per row
``length [B]``), run by :func:`jaxmem.kernels.sdnc.sdnc_scan` from where it stands. The hybrid's cache adds,
with a write gate or erase, each slot's log presence ``[B, max_len, H]`` (the write strength, then the
retentions since: :func:`jaxmem.kernels.sdnc.sdnc_hybrid_scan`); its link reads need nothing more (the link
matrix of a write-once memory is the shift between neighbouring slots, and the reads use the current
weights). Past ``max_len`` nothing wraps: the caller (a model's ``generate``) checks lengths on the host.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxmem.kernels.attention import kv_cache_append, kv_cache_init, softmax_attention
from jaxmem.kernels.sdnc import (
  sdnc_attention,
  sdnc_hybrid_attention,
  sdnc_hybrid_init,
  sdnc_hybrid_scan,
  sdnc_scan,
)
from jaxmem.models.mixers.qkv import QKVMixer, check_short_conv, qkv_state_floats
from jaxmem.models.mixers.registry import MixerConfig, register


@dataclasses.dataclass(frozen=True)
class SDNCConfig(MixerConfig):
  """Attributes: short_conv: as in :class:`~jaxmem.models.mixers.softmax.SoftmaxConfig`."""

  name: str = dataclasses.field(default="sdnc", init=False)
  short_conv: int = 0

  def state_floats(self, *, d_model: int, n_heads: int, seq_len: int) -> int:
    """The write-once memory, ``2·T·d_model`` (plus the short convolution's last ``K − 1`` inputs; the written
    slots per row are an integer length, not floats)."""
    return 2 * seq_len * d_model + qkv_state_floats(self, d_model)

  def __post_init__(self):
    check_short_conv(self)


class SDNCRead(QKVMixer):
  def kernel(self, q, k, v, *, segment_ids=None):
    return sdnc_attention(q, k, v, segment_ids=segment_ids)

  def kernel_init(self, batch_size: int, max_len: int) -> dict:
    """The memory ``{"k", "v": [B, max_len, H, D/H], "length": [B] int32}`` (a KV cache)."""
    return kv_cache_init(batch_size, max_len, self.n_heads, self.head_dim, dtype=self.qkv.dtype or jnp.float32)

  def kernel_scan(self, memory, q, k, v, *, lengths=None):
    return sdnc_scan(memory, q, k, v, lengths=lengths)


@dataclasses.dataclass(frozen=True)
class SDNCHybridConfig(MixerConfig):
  """Attributes:
    write_gate: hybrid (a), selective write.
    erase: hybrid (b), differentiable erase.
    link_reads: hybrid (c), temporal-link reads.
    short_conv: as in :class:`~jaxmem.models.mixers.softmax.SoftmaxConfig`.
  """

  name: str = dataclasses.field(default="sdnc_hybrid", init=False)
  write_gate: bool = False
  erase: bool = False
  link_reads: bool = False
  short_conv: int = 0

  def state_floats(self, *, d_model: int, n_heads: int, seq_len: int) -> int:
    """The memory ``2·T·d_model`` and each head's slot log presences ``H·T`` (with a write gate or erase), plus
    the short convolution's last ``K − 1`` inputs. Link reads add nothing: they use the current read weights,
    and the link matrix of a write-once memory is the shift between neighbouring slots."""
    gates = n_heads * seq_len * (self.write_gate or self.erase)
    return 2 * seq_len * d_model + gates + qkv_state_floats(self, d_model)

  @classmethod
  def examples(cls) -> tuple:
    return (cls(), cls(write_gate=True, erase=True, link_reads=True))

  def __post_init__(self):
    check_short_conv(self)
    for f in ("write_gate", "erase", "link_reads"):
      if not isinstance(getattr(self, f), bool):
        raise ValueError(f"SDNCHybridConfig.{f} must be a bool, got {getattr(self, f)!r}.")

  @property
  def any(self) -> bool:
    return self.write_gate or self.erase or self.link_reads


class SDNCHybrid(QKVMixer):
  """Projections for :func:`jaxmem.kernels.sdnc.sdnc_hybrid_attention`'s gates (zero weights;
  biases: write σ(3) ≈ 0.95, retain σ(5) ≈ 0.99, read modes favouring the content read)."""

  def __init__(self, cfg: SDNCHybridConfig, *, d_model, n_heads, n_layers, dtype, rngs):
    super().__init__(cfg, d_model=d_model, n_heads=n_heads, n_layers=n_layers, dtype=dtype, rngs=rngs)
    H = n_heads
    self.write_gate = self.gate(H, jnp.full((H,), 3.0), rngs) if cfg.write_gate else None
    self.erase_gate = self.gate(H, jnp.full((H,), 5.0), rngs) if cfg.erase else None
    modes = jnp.tile(jnp.array([-3.0, 3.0, -3.0]), H)  # (backward, content, forward) per head
    self.read_modes = self.gate(3 * H, modes, rngs, axis=None) if cfg.link_reads else None

  def gates(self, x_BTD):
    """Write-gate and retention logits ``[B, T, H]``, read-mode logits ``[B, T, H, 3]`` (None where off)."""
    if not self.cfg.any:
      return {}
    B, T, H = x_BTD.shape[0], x_BTD.shape[1], self.n_heads
    return {
        "write_gate": None if self.write_gate is None else self.write_gate(x_BTD),
        "erase_gate": None if self.erase_gate is None else self.erase_gate(x_BTD),
        "read_modes": None if self.read_modes is None else self.read_modes(x_BTD).reshape(B, T, H, 3),
    }

  def kernel(self, q, k, v, *, segment_ids=None, **gates):
    if not self.cfg.any:
      return softmax_attention(q, k, v, causal=True, segment_ids=segment_ids)
    return sdnc_hybrid_attention(q, k, v, segment_ids=segment_ids, **gates)

  def kernel_init(self, batch_size: int, max_len: int) -> dict:
    """The KV cache ``{"k", "v": [B, max_len, H, D/H], "length": [B] int32}``, with ``"presence" [B, max_len,
    H]`` (float32) when a write gate or erase is on."""
    return sdnc_hybrid_init(batch_size, max_len, self.n_heads, self.head_dim,
                            dtype=self.qkv.dtype or jnp.float32, presence=self.cfg.write_gate or self.cfg.erase)

  def kernel_scan(self, memory, q, k, v, *, lengths=None, **gates):
    if not self.cfg.any:
      new = kv_cache_append(memory, k, v, lengths)
      return new, softmax_attention(q, new["k"], new["v"], causal=True, q_offset=memory["length"])
    return sdnc_hybrid_scan(memory, q, k, v, lengths=lengths, **gates)


register("sdnc", SDNCConfig, SDNCRead)
register("sdnc_hybrid", SDNCHybridConfig, SDNCHybrid)
