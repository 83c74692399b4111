"""The baseline: a decoder-only byte-level Transformer language model (Flax NNX).

Pre-LN blocks (Xiong et al. 2020), GELU feed-forward, learned absolute positions and
optionally tied input/output embeddings (Press & Wolf 2017). Attention arithmetic is a
call into :func:`jaxmem.kernels.attention.softmax_attention`; the layers are stacked
with ``nnx.vmap`` and applied with ``nnx.scan``, so depth is one compiled loop body, not
a Python loop, and ``remat=True`` wraps each block in ``jax.checkpoint``.

Every paper model in jaxmem is compared with this one.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem._checks import check_rank
from jaxmem.kernels.attention import softmax_attention


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Architecture of :class:`TransformerLM`.

  Attributes:
    vocab_size: number of token ids (256 for bytes).
    d_model: residual width.
    n_layers: number of blocks.
    n_heads: attention heads; must divide ``d_model``.
    d_ff: hidden width of the feed-forward layer.
    max_len: longest sequence the learned positions cover.
    tie_embeddings: read logits with the transposed input embedding.
    remat: recompute each block in the backward pass (``jax.checkpoint``).
    dtype: compute dtype of activations ("float32" or "bfloat16"); parameters stay
      float32 and the loss is computed in float32.
  """

  vocab_size: int = 256
  d_model: int = 128
  n_layers: int = 4
  n_heads: int = 4
  d_ff: int = 512
  max_len: int = 256
  tie_embeddings: bool = True
  remat: bool = False
  dtype: str = "float32"

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {value!r}.")
    if self.d_model % self.n_heads:
      raise ValueError(
          f"TransformerConfig.n_heads={self.n_heads} must divide d_model={self.d_model}."
      )
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"TransformerConfig.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}.")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads


class MultiHeadAttention(nnx.Module):
  """Causal multi-head self-attention: projections here, arithmetic in the kernel."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    dt = jnp.dtype(cfg.dtype)
    self.qkv = nnx.Linear(cfg.d_model, 3 * cfg.d_model, use_bias=False, dtype=dt, rngs=rngs)
    self.out = nnx.Linear(
        cfg.d_model, cfg.d_model, use_bias=False, dtype=dt, rngs=rngs,
        kernel_init=nnx.initializers.normal(0.02 / (2 * cfg.n_layers) ** 0.5),
    )

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    B, T, _ = x_BTD.shape
    qkv = self.qkv(x_BTD).reshape(B, T, 3, self.cfg.n_heads, self.cfg.head_dim)
    o_BTHK = softmax_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    return self.out(o_BTHK.reshape(B, T, self.cfg.d_model))


class FeedForward(nnx.Module):
  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    dt = jnp.dtype(cfg.dtype)
    self.up = nnx.Linear(cfg.d_model, cfg.d_ff, dtype=dt, rngs=rngs)
    self.down = nnx.Linear(
        cfg.d_ff, cfg.d_model, dtype=dt, rngs=rngs,
        kernel_init=nnx.initializers.normal(0.02 / (2 * cfg.n_layers) ** 0.5),
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
  """Pre-LN block: ``x + Attn(LN(x))`` then ``x + FFN(LN(x))``."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    dt = jnp.dtype(cfg.dtype)
    self.ln1 = nnx.LayerNorm(cfg.d_model, dtype=dt, rngs=rngs)
    self.attn = MultiHeadAttention(cfg, rngs=rngs)
    self.ln2 = nnx.LayerNorm(cfg.d_model, dtype=dt, rngs=rngs)
    self.ffn = FeedForward(cfg, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x + self.attn(self.ln1(x))
    return x + self.ffn(self.ln2(x))


class TransformerLM(nnx.Module):
  """Decoder-only LM: ``tokens [B, T] -> logits [B, T, vocab]`` (float32)."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    dt = jnp.dtype(cfg.dtype)
    self.embed = nnx.Embed(
        cfg.vocab_size, cfg.d_model, dtype=dt, rngs=rngs,
        embedding_init=nnx.initializers.normal(0.02),
    )
    self.pos = nnx.Param(nnx.initializers.normal(0.01)(rngs.params(), (cfg.max_len, cfg.d_model)))

    @nnx.split_rngs(splits=cfg.n_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_blocks(rngs: nnx.Rngs) -> Block:
      return Block(cfg, rngs=rngs)

    self.blocks = make_blocks(rngs)
    self.ln_f = nnx.LayerNorm(cfg.d_model, dtype=dt, rngs=rngs)
    self.head: Optional[nnx.Linear] = nnx.data(
        None if cfg.tie_embeddings
        else nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False, dtype=dt, rngs=rngs)
    )

  def embed_tokens(self, tokens_BT: jax.Array) -> jax.Array:
    """Token plus position embeddings, ``[B, T] -> [B, T, d_model]``."""
    check_rank("tokens", tokens_BT, 2, "B, T")
    T = tokens_BT.shape[1]
    if T > self.cfg.max_len:
      raise ValueError(f"`tokens` has length {T} > max_len={self.cfg.max_len}.")
    x = self.embed(tokens_BT) + self.pos[...][None, :T].astype(self.embed.dtype)
    return x

  def logits_from_embeddings(self, x_BTD: jax.Array) -> jax.Array:
    """Blocks, final norm and read-out; separate so tests can differentiate w.r.t. inputs."""
    body = lambda blk, h: blk(h)
    if self.cfg.remat:
      body = nnx.remat(body)

    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    def run_blocks(block: Block, h: jax.Array) -> jax.Array:
      return body(block, h)

    h = run_blocks(self.blocks, x_BTD)
    h = self.ln_f(h)
    logits = self.embed.attend(h) if self.head is None else self.head(h)
    return logits.astype(jnp.float32)

  def __call__(self, tokens_BT: jax.Array) -> jax.Array:
    return self.logits_from_embeddings(self.embed_tokens(tokens_BT))


def count_params(model: nnx.Module) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
