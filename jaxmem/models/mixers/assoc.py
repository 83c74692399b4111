"""An associative-memory token mixer (a "conditioning circuit", ``docs/papers/pavlovian.md``).

Each head keeps a matrix ``S [D_v, D_k]`` written by a learning rule and reads
``o_t = S_t φ(q_t)`` (:func:`jaxmem.kernels.assoc.associative_memory`; "hebb" with the
identity map is linear attention). Per-token write strengths ``β_t = σ(W_β x_t)`` for the
erasing rules (delta, oja, gated_delta; 1 for hebb/decay) and decays ``γ_t = σ(W_γ x_t)``
for decay/gated_delta, passed to the kernel in log space (``log_sigmoid``), so decays that
underflow to 0 stay finite in values and gradients.

Decoding (:meth:`~jaxmem.models.mixers.qkv.QKVMixer.init_state`, ``step``, ``scan`` of the base class): the
state is the short convolution's tail (if any) and the memory ``S [B, H, D_v, D_k]`` in float32, zeros at the
start (:meth:`AssociativeMemory.kernel_init`); a prompt's prefill or a chunk of a stream continues from it
with the kernel's ``initial_state`` (:meth:`AssociativeMemory.kernel_scan`). The state does not grow with the
sequence (:meth:`AssocConfig.state_floats`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from jaxmem.checks import check_config_ints
from jaxmem.kernels.assoc import (
  DECAY_RULES,
  ERASE_RULES,
  MODES,
  OJA_RULES,
  RULES,
  associative_memory,
  l2_normalize,
)
from jaxmem.kernels.assoc import init as memory_init
from jaxmem.kernels.feature_maps import FEATURE_MAPS, feature_map, feature_width
from jaxmem.kernels.precision import PRECISIONS
from jaxmem.kernels.segments import lengths_to_segment_ids
from jaxmem.models.mixers.qkv import QKVMixer, check_short_conv, qkv_state_floats
from jaxmem.models.mixers.registry import MixerConfig, register
from jaxmem.sharding import STATE_BHKV


@dataclasses.dataclass(frozen=True)
class AssocConfig(MixerConfig):
  """Attributes:
    rule: "hebb", "delta", "oja", "decay", "gated_delta" or "gated_oja" (:data:`jaxmem.kernels.assoc.RULES`).
    feature_map: key/query map ``φ`` (:data:`jaxmem.kernels.feature_maps.FEATURE_MAPS`:
      "identity", "elu1", "dpfp1", "dpfp2"; the DPFP maps widen the keys to 2× / 4× the head width).
    key_norm: L2-normalise the vector the update erases along (keys; values for oja), so
      that β‖k‖² < 1 and the delta/Oja recurrences cannot diverge whatever the weights.
      None (default) means on for the erasing rules "delta", "oja", "gated_delta", "gated_oja" and off
      for "hebb"/"decay"; False is the raw rule (opt-out: with large weights the state can
      then grow geometrically, which under ``jit`` no check can catch — the training loop
      stops on the first non-finite loss).
    mode: execution form ("auto", "recurrent", "chunked", "parallel"); chunk_size: its chunk length.
    precision: matmul precision of the memory kernel: "highest" (float32 operands on every
      platform, the default) or a faster one such as "default" (bf16 passes on TPU, TF32 on
      GPU); see :mod:`jaxmem.kernels.precision`.
    short_conv: as in :class:`~jaxmem.models.mixers.softmax.SoftmaxConfig`.
    n_qk_heads: query/key heads (grouped value heads, fla's GVA: each serves ``n_heads / n_qk_heads`` value
      heads, each of which keeps its own memory); 0 means ``n_heads``.
  """

  name: str = dataclasses.field(default="assoc", init=False)
  rule: str = "hebb"
  feature_map: str = "identity"
  key_norm: Optional[bool] = None
  mode: str = "auto"
  chunk_size: int = 64
  precision: str = "highest"
  short_conv: int = 0
  n_qk_heads: int = 0

  def state_floats(self, *, d_model: int, n_heads: int, seq_len: int) -> int:
    """One ``D_v × D_k`` matrix per head, ``H·(d_model/H)²`` (feature maps that widen keys widen ``D_k``),
    plus the short convolution's last ``K − 1`` inputs."""
    d = d_model // n_heads
    return n_heads * d * feature_width(self.feature_map, d) + qkv_state_floats(self, d_model, n_heads)

  @classmethod
  def examples(cls) -> tuple:
    return (cls(), cls(rule="gated_delta", short_conv=3, chunk_size=4, n_qk_heads=1),
            cls(rule="oja", feature_map="dpfp1"))

  def __post_init__(self):
    check_short_conv(self)
    check_config_ints(self, ("chunk_size",))
    check_config_ints(self, ("n_qk_heads",), allow_zero=True)
    if self.rule not in RULES:
      raise ValueError(f"AssocConfig.rule must be one of {list(RULES)}, got {self.rule!r}.")
    if self.mode not in MODES:
      raise ValueError(f"AssocConfig.mode must be one of {list(MODES)}, got {self.mode!r}.")
    if not isinstance(self.precision, str) or self.precision.lower() not in PRECISIONS:
      raise ValueError(
          f"AssocConfig.precision must be one of {list(PRECISIONS)}, got {self.precision!r}.")
    if self.rule in OJA_RULES and self.mode == "parallel":
      raise ValueError(
          f"AssocConfig: rule={self.rule!r} has no parallel form; use mode='chunked', 'recurrent' or 'auto'.")
    if self.key_norm is not None and not isinstance(self.key_norm, bool):
      raise ValueError(f"AssocConfig.key_norm must be None, True or False, got {self.key_norm!r}.")
    if self.feature_map not in FEATURE_MAPS:
      raise ValueError(
          f"AssocConfig.feature_map must be one of {list(FEATURE_MAPS)}, got {self.feature_map!r}.")

  @property
  def normalizes_erase(self) -> bool:
    """Whether the erase vector is L2-normalised (``key_norm`` resolved by the rule)."""
    return self.key_norm if self.key_norm is not None else self.rule in ERASE_RULES


class AssociativeMemory(QKVMixer):
  """Projections and gates for the memory; the update and read are the kernel's. Decodes: the memory is the
  kernel's state (:meth:`kernel_init`, :meth:`kernel_scan`)."""

  def __init__(self, cfg: AssocConfig, *, d_model, n_heads, n_layers, dtype, rngs):
    super().__init__(cfg, d_model=d_model, n_heads=n_heads, n_layers=n_layers, dtype=dtype, rngs=rngs)
    H = n_heads
    # write strength β = σ(.) starts at σ(0) = 0.5, decay γ = σ(.) at σ(3) ≈ 0.95
    self.beta = self.gate(H, jnp.zeros((H,)), rngs) if cfg.rule in ERASE_RULES else None
    self.decay = self.gate(H, jnp.full((H,), 3.0), rngs) if cfg.rule in DECAY_RULES else None

  def gates(self, x_BTD):
    """β ``[B, T, H]`` and log γ ``[B, T, H]`` (None where the rule has none)."""
    beta = None if self.beta is None else jax.nn.sigmoid(self.beta(x_BTD).astype(jnp.float32))
    # log γ = log σ(z): finite for every finite z (σ(z) itself underflows to 0 below z ≈ −88)
    log_decay = None if self.decay is None else jax.nn.log_sigmoid(self.decay(x_BTD).astype(jnp.float32))
    return {"beta": beta, "log_decay": log_decay}

  def _features(self, q, k, v):
    """The kernel's ``(q, k, v)`` from the heads': ``φ(q)``, ``φ(k)`` (``[B, T, H, D_k]``, ``D_k`` the feature
    width) and, with :attr:`AssocConfig.normalizes_erase`, the erase vector L2-normalised (``k``; ``v`` for
    oja). Per-head arithmetic: each head's vectors alone."""
    cfg = self.cfg
    phi = feature_map(cfg.feature_map)
    q, k = phi(q), phi(k)
    if cfg.normalizes_erase:
      if cfg.rule in OJA_RULES:
        v = l2_normalize(v)
      else:
        k = l2_normalize(k)
    return q, k, v

  def kernel(self, q, k, v, *, beta, log_decay, segment_ids=None):
    """The read ``o_t = S_t φ(q_t)`` ``[B, T, H, D_v]`` of the memory written by the rule from ``S_0 = 0``
    (:func:`jaxmem.kernels.assoc.associative_memory` in the configured ``mode``), emptied at each segment."""
    cfg = self.cfg
    return associative_memory(*self._features(q, k, v), beta, rule=cfg.rule, mode=cfg.mode,
                              chunk_size=cfg.chunk_size, log_decay=log_decay, precision=cfg.precision,
                              segment_ids=segment_ids)

  def kernel_init(self, batch_size: int, max_len: int) -> jax.Array:
    """The empty memory ``S_0 = 0`` ``[batch_size, H, D_v, D_k]`` in float32 (``D_k`` the feature width:
    :meth:`AssocConfig.state_floats` counts it); ``max_len`` is not needed (the memory has a fixed size)."""
    del max_len
    d = self.head_dim
    return memory_init(batch_size, self.n_heads, feature_width(self.cfg.feature_map, d), d, jnp.float32)

  def kernel_state_axes(self, S) -> tuple:
    """The memory ``[B, H, D_v, D_k]``: rows and heads split over a mesh."""
    return STATE_BHKV

  def kernel_scan(self, S, q, k, v, *, beta, log_decay, lengths=None):
    """:meth:`kernel` from the memory ``S [B, H, D_v, D_k]``: ``(S after the last token, o [B, T, H, D_v])``.

    Every ``mode`` starts from a given state (:func:`~jaxmem.kernels.assoc.associative_memory`'s
    ``initial_state``), so a sequence runs in the configured one; a single token (``step``) runs the
    recurrent form, the rule's update itself, whatever the mode (the chunked form would pad it to a chunk).
    ``S`` keeps its dtype (the update is accumulated in float32 or wider). ``lengths [B]``: right-padded rows,
    given to the kernel as segment ids (1 for a row's tokens, 0 for its padding, which writes nothing), so
    ``S`` is each row's memory after its own tokens."""
    cfg = self.cfg
    mode = "recurrent" if q.shape[1] == 1 else cfg.mode
    segment_ids = None if lengths is None else lengths_to_segment_ids(lengths, q.shape[1])
    o, S = associative_memory(*self._features(q, k, v), beta, rule=cfg.rule, mode=mode,
                              chunk_size=cfg.chunk_size, log_decay=log_decay, precision=cfg.precision,
                              initial_state=S, return_state=True, segment_ids=segment_ids)
    return S, o


register("assoc", AssocConfig, AssociativeMemory)
