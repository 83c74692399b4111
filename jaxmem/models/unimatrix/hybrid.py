"""Recurrent-FFN-Hybrid: the baseline Transformer with each block's FFN replaced by a recurrent
matrix-state memory block (Liu Xiao 2026, arXiv:2604.25930, ``docs/papers/unimatrix.md``).

Pre-LN blocks ``x + Attention(LN x)`` then ``x + MatrixState(LN x)``: attention keeps exact
lookup; the position-wise FFN slot becomes a compact causal recurrence
(:class:`~jaxmem.models.mixers.matrix_state.MatrixStateMixer`, Core's gated outer-product
state). Same embedding, positions, final norm and tied read-out as
:class:`~jaxmem.models.TransformerLM`; layers stacked with ``nnx.vmap`` and applied with
``nnx.scan``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_config_ints, check_rank
from jaxmem.kernels import matrix_state as ms
from jaxmem.models.layers import embed, layer_norm, positions
from jaxmem.models.mixers.matrix_state import UPDATES, MatrixStateConfig, MatrixStateMixer
from jaxmem.models.mixers.softmax import SoftmaxAttention, SoftmaxConfig


@dataclasses.dataclass(frozen=True)
class RecurrentFFNHybridConfig:
  """Attributes: as :class:`~jaxmem.models.TransformerConfig` (``vocab_size``, ``d_model``,
  ``n_layers``, ``n_heads``, ``max_len``) plus the recurrent block's ``state_dim`` (0:
  ``d_model // n_heads``), ``updates`` ("outer" / "hybrid"), ``mode`` and ``chunk_size``."""

  vocab_size: int = 259
  d_model: int = 64
  n_layers: int = 3
  n_heads: int = 4
  state_dim: int = 16
  max_len: int = 128
  updates: str = "outer"
  mode: str = "auto"
  chunk_size: int = 64

  def __post_init__(self):
    check_config_ints(self, ("vocab_size", "d_model", "n_layers", "n_heads", "max_len", "chunk_size"))
    check_config_ints(self, ("state_dim",), allow_zero=True)
    if self.d_model % self.n_heads:
      raise ValueError(f"RecurrentFFNHybridConfig.n_heads={self.n_heads} must divide d_model={self.d_model}.")
    if self.updates not in UPDATES:
      raise ValueError(f"RecurrentFFNHybridConfig.updates must be one of {list(UPDATES)}, "
                       f"got {self.updates!r}.")
    if self.mode not in ms.MODES:
      raise ValueError(f"RecurrentFFNHybridConfig.mode must be one of {list(ms.MODES)}, got {self.mode!r}.")


class HybridBlock(nnx.Module):
  def __init__(self, cfg: RecurrentFFNHybridConfig, *, rngs: nnx.Rngs):
    d, H, L = cfg.d_model, cfg.n_heads, cfg.n_layers
    self.ln1 = layer_norm(d, rngs=rngs)
    self.attn = SoftmaxAttention(SoftmaxConfig(precision="highest"), d_model=d, n_heads=H, n_layers=L,
                                 dtype="float32", rngs=rngs)
    self.ln2 = layer_norm(d, rngs=rngs)
    self.memory = MatrixStateMixer(
        MatrixStateConfig(state_dim=cfg.state_dim, updates=cfg.updates, mode=cfg.mode,
                          chunk_size=cfg.chunk_size),
        d_model=d, n_heads=H, n_layers=L, dtype="float32", rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.ln1(x))
    return x + self.memory(self.ln2(x))


class RecurrentFFNHybrid(nnx.Module):
  """``tokens [B, T] -> logits [B, T, vocab_size]`` (float32)."""

  def __init__(self, cfg: RecurrentFFNHybridConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = embed(cfg.vocab_size, cfg.d_model, embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
    self.pos = positions(cfg.max_len, cfg.d_model, std=0.01, rngs=rngs)

    @nnx.split_rngs(splits=cfg.n_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_blocks(rngs: nnx.Rngs) -> HybridBlock:
      return HybridBlock(cfg, rngs=rngs)

    self.blocks = make_blocks(rngs)
    self.ln_f = layer_norm(cfg.d_model, rngs=rngs)

  def __call__(self, tokens_BT: jax.Array) -> jax.Array:
    _, T = check_rank("tokens", tokens_BT, 2, "B, T")
    if T > self.cfg.max_len:
      raise ValueError(f"`tokens` has length {T} > max_len={self.cfg.max_len}.")
    x = self.embed(tokens_BT) + self.pos[...][None, :T]

    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    def run(block, h):
      return block(h)

    h = run(self.blocks, x)
    return self.embed.attend(self.ln_f(h)).astype(jnp.float32)
