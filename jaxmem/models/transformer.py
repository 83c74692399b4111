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

from jaxmem._checks import check_config_ints, check_positive_int, check_rank
from jaxmem.kernels.assoc import associative_memory, l2_normalize
from jaxmem.kernels.attention import softmax_attention
from jaxmem.kernels.sdnc import sdnc_attention, sdnc_hybrid_attention


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
    memory: the kernel that runs each attention read: "softmax" (fast, parallel),
      "sdnc" (the same read as a write-once DNC memory under ``lax.scan``; identical
      outputs, slow — the theorem made executable) or "assoc" (a conditioning circuit:
      an associative matrix written by ``assoc_rule`` and read by the query,
      :func:`jaxmem.kernels.assoc.associative_memory`; "hebb" is linear attention).
    assoc_rule: "hebb", "delta", "oja", "decay" or "gated_delta" (memory="assoc").
      Write strengths β_t = σ(W_β x_t) for delta/oja/gated_delta (1 for hebb/decay),
      decays γ_t = σ(W_γ x_t) for decay/gated_delta, passed to the kernel in log space
      (``log_sigmoid``), so decays that underflow to 0 stay finite in values and gradients.
    feature_map: key/query feature map for memory="assoc": "identity" or "elu1"
      (ELU + 1, Katharopoulos et al. 2020).
    key_norm: L2-normalise the vector the update erases along (keys; values for oja), so
      that β‖k‖² < 1 and the delta/Oja recurrences cannot diverge whatever the weights.
      None (default) means on for the erasing rules "delta", "oja", "gated_delta" and off
      for "hebb"/"decay"; False is the raw rule (opt-out: with large weights the state can
      then grow geometrically, which under ``jit`` no check can catch — the training loop
      stops on the first non-finite loss).
    assoc_mode: execution form for memory="assoc" ("auto", "recurrent", "chunked",
      "parallel"); chunk_size: its chunk length.
    assoc_precision: matmul precision of the memory kernel (memory="assoc"):
      "highest" (float32 operands on every platform, the default) or a faster one such as
      "default" (bf16 passes on TPU, TF32 on GPU); see :mod:`jaxmem.kernels.precision`.
    write_gate: hybrid (a), selective write: a learned per-head gate on each written slot.
    erase: hybrid (b), differentiable erase: a learned per-head retention applied to all
      written slots at each step.
    link_reads: hybrid (c), temporal-link reads: learned per-head read modes mixing
      content reads with reads of the successor / predecessor of the attended slot.
    input_dim: 0 for token inputs (``vocab_size`` embedding); > 0 for continuous inputs
      ``[B, T, input_dim]`` through a linear map (algorithmic tasks).
    output_dim: 0 for ``vocab_size`` logits; > 0 for a linear read-out of that width.
    positions: "learned" (absolute, up to ``max_len``), "sinusoidal" (fixed) or "none"
      (causal attention infers order; the choice for length generalisation).
    short_conv: 0 for none; else the width ``K`` of a causal depthwise convolution over
      time applied to q, k and v after their projection,
      ``x'_t = Σ_{j<K} w_j ⊙ x_{t−j}`` (H3's shift / Zoology's and DeltaNet's short
      convolution; initialised to the identity ``w_0 = 1``, other taps 0). It lets one
      layer bind a key to its neighbouring token, which recall tasks need.
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
  memory: str = "softmax"
  write_gate: bool = False
  erase: bool = False
  link_reads: bool = False
  input_dim: int = 0
  output_dim: int = 0
  positions: str = "learned"
  assoc_rule: str = "hebb"
  feature_map: str = "identity"
  key_norm: Optional[bool] = None
  assoc_mode: str = "auto"
  chunk_size: int = 64
  short_conv: int = 0
  assoc_precision: str = "highest"

  def __post_init__(self):
    check_config_ints(self, ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len", "chunk_size"))
    check_config_ints(self, ("input_dim", "output_dim", "short_conv"), allow_zero=True)
    if self.d_model % self.n_heads:
      raise ValueError(
          f"TransformerConfig.n_heads={self.n_heads} must divide d_model={self.d_model}."
      )
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"TransformerConfig.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}.")
    if self.memory not in ("softmax", "sdnc", "assoc"):
      raise ValueError(
          f"TransformerConfig.memory must be 'softmax', 'sdnc' or 'assoc', got {self.memory!r}.")
    from jaxmem.kernels.assoc import MODES, RULES
    if self.assoc_rule not in RULES:
      raise ValueError(f"TransformerConfig.assoc_rule must be one of {list(RULES)}, got {self.assoc_rule!r}.")
    if self.assoc_mode not in MODES:
      raise ValueError(f"TransformerConfig.assoc_mode must be one of {list(MODES)}, got {self.assoc_mode!r}.")
    from jaxmem.kernels.precision import PRECISIONS
    if not isinstance(self.assoc_precision, str) or self.assoc_precision.lower() not in PRECISIONS:
      raise ValueError(f"TransformerConfig.assoc_precision must be one of {list(PRECISIONS)}, "
                       f"got {self.assoc_precision!r}.")
    if self.memory == "assoc" and self.assoc_rule == "oja" and self.assoc_mode == "parallel":
      raise ValueError("TransformerConfig: assoc_rule='oja' has no parallel form; use assoc_mode='chunked', "
                       "'recurrent' or 'auto'.")
    if self.key_norm is not None and not isinstance(self.key_norm, bool):
      raise ValueError(f"TransformerConfig.key_norm must be None, True or False, got {self.key_norm!r}.")
    if self.feature_map not in ("identity", "elu1"):
      raise ValueError(f"TransformerConfig.feature_map must be 'identity' or 'elu1', got {self.feature_map!r}.")
    if self.positions not in ("learned", "sinusoidal", "none"):
      raise ValueError(
          f"TransformerConfig.positions must be 'learned', 'sinusoidal' or 'none', got {self.positions!r}.")
    if self.hybrid and self.memory != "softmax":
      raise ValueError("TransformerConfig: the hybrids run on the parallel kernel; use memory='softmax'.")

  @property
  def hybrid(self) -> bool:
    return self.write_gate or self.erase or self.link_reads

  @property
  def normalizes_erase(self) -> bool:
    """Whether the conditioning circuit L2-normalises its erase vector (``key_norm`` resolved)."""
    if self.key_norm is not None:
      return self.key_norm
    from jaxmem.kernels.assoc import ERASE_RULES
    return self.assoc_rule in ERASE_RULES

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads


class MultiHeadAttention(nnx.Module):
  """Causal multi-head self-attention: projections here, arithmetic in the kernels.

  Read as memory (Tang & Xie 2026): each head is a read head of a write-once memory,
  ``out`` (W_O) mixes the read vectors. With a hybrid flag set, small per-head gate
  projections feed :func:`jaxmem.kernels.sdnc.sdnc_hybrid_attention`; they start near
  the neutral values (write ≈ 1, retain ≈ 1, content reads), so a hybrid starts close to
  plain attention.
  """

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    dt = jnp.dtype(cfg.dtype)
    self.qkv = nnx.Linear(cfg.d_model, 3 * cfg.d_model, use_bias=False, dtype=dt, rngs=rngs)
    self.out = nnx.Linear(
        cfg.d_model, cfg.d_model, use_bias=False, dtype=dt, rngs=rngs,
        kernel_init=nnx.initializers.normal(0.02 / (2 * cfg.n_layers) ** 0.5),
    )
    H = cfg.n_heads
    def gate(width, bias):
      return nnx.Linear(cfg.d_model, width, dtype=dt, rngs=rngs, kernel_init=nnx.initializers.zeros,
                        bias_init=lambda *_: jnp.asarray(bias, jnp.float32))
    self.write_gate = nnx.data(gate(H, jnp.full((H,), 3.0)) if cfg.write_gate else None)
    self.erase_gate = nnx.data(gate(H, jnp.full((H,), 5.0)) if cfg.erase else None)
    self.read_modes = nnx.data(
        gate(3 * H, jnp.tile(jnp.array([-3.0, 3.0, -3.0]), H)) if cfg.link_reads else None)
    assoc = cfg.memory == "assoc"
    # conditioning circuit: write strength β = σ(.) starts at σ(0) = 0.5, decay γ = σ(.) at σ(3) ≈ 0.95
    self.beta = nnx.data(gate(H, jnp.zeros((H,)))
                         if assoc and cfg.assoc_rule in ("delta", "oja", "gated_delta") else None)
    self.decay = nnx.data(gate(H, jnp.full((H,), 3.0))
                          if assoc and cfg.assoc_rule in ("decay", "gated_delta") else None)
    self.conv = nnx.data(ShortConv(cfg.short_conv, 3 * cfg.d_model, rngs=rngs) if cfg.short_conv else None)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    B, T, _ = x_BTD.shape
    H = self.cfg.n_heads
    qkv = self.qkv(x_BTD)
    if self.conv is not None:
      qkv = self.conv(qkv)
    qkv = qkv.reshape(B, T, 3, H, self.cfg.head_dim)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if self.cfg.hybrid:
      o_BTHK = sdnc_hybrid_attention(
          q, k, v,
          write_gate=None if self.write_gate is None else self.write_gate(x_BTD),
          erase_gate=None if self.erase_gate is None else self.erase_gate(x_BTD),
          read_modes=None if self.read_modes is None else self.read_modes(x_BTD).reshape(B, T, H, 3),
      )
    elif self.cfg.memory == "sdnc":
      o_BTHK = sdnc_attention(q, k, v)
    elif self.cfg.memory == "assoc":
      o_BTHK = self._conditioning_read(x_BTD, q, k, v)
    else:
      o_BTHK = softmax_attention(q, k, v, causal=True)
    return self.out(o_BTHK.reshape(B, T, self.cfg.d_model))


  def _conditioning_read(self, x_BTD, q, k, v):
    """Associative-matrix read ``o_t = S_t φ(q_t)`` with ``S`` written by the configured rule."""
    cfg = self.cfg
    if cfg.feature_map == "elu1":
      q, k = jax.nn.elu(q) + 1.0, jax.nn.elu(k) + 1.0
    if cfg.normalizes_erase:
      if cfg.assoc_rule == "oja":
        v = l2_normalize(v)
      else:
        k = l2_normalize(k)
    beta = None if self.beta is None else jax.nn.sigmoid(self.beta(x_BTD).astype(jnp.float32))
    # log γ = log σ(z): finite for every finite z (σ(z) itself underflows to 0 below z ≈ −88)
    log_decay = None if self.decay is None else jax.nn.log_sigmoid(self.decay(x_BTD).astype(jnp.float32))
    return associative_memory(q, k, v, beta, rule=cfg.assoc_rule, mode=cfg.assoc_mode,
                              chunk_size=cfg.chunk_size, log_decay=log_decay,
                              precision=cfg.assoc_precision)


class ShortConv(nnx.Module):
  """Causal depthwise convolution over time: ``y_t = Σ_{j<K} w_j ⊙ x_{t−j}`` on ``[B, T, C]``.

  The short convolution of H3 (Fu et al. 2023, its "shift" SSM), Zoology's BaseConv and
  DeltaNet (Yang et al. 2024). ``K`` shifted copies summed (``K`` is a small static width,
  so this is ``K`` vector ops, not a loop over time). Starts as the identity (``w_0 = 1``).
  """

  def __init__(self, width: int, channels: int, *, rngs: nnx.Rngs):
    del rngs
    check_positive_int("width", width)
    check_positive_int("channels", channels)
    self.width = width
    self.kernel = nnx.Param(jnp.zeros((width, channels), jnp.float32).at[0].set(1.0))

  def __call__(self, x_BTC: jax.Array) -> jax.Array:
    T = x_BTC.shape[1]
    w = self.kernel[...].astype(x_BTC.dtype)
    padded = jnp.pad(x_BTC, ((0, 0), (self.width - 1, 0), (0, 0)))
    y = w[0][None, None] * x_BTC
    for j in range(1, self.width):  # taps, not time steps
      y = y + w[j][None, None] * padded[:, self.width - 1 - j: self.width - 1 - j + T]
    return y


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
    if cfg.input_dim:
      self.embed = nnx.Linear(cfg.input_dim, cfg.d_model, dtype=dt, rngs=rngs)
    else:
      self.embed = nnx.Embed(
          cfg.vocab_size, cfg.d_model, dtype=dt, rngs=rngs,
          embedding_init=nnx.initializers.normal(0.02),
      )
    self.pos = nnx.data(
        nnx.Param(nnx.initializers.normal(0.01)(rngs.params(), (cfg.max_len, cfg.d_model)))
        if cfg.positions == "learned" else None)

    @nnx.split_rngs(splits=cfg.n_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_blocks(rngs: nnx.Rngs) -> Block:
      return Block(cfg, rngs=rngs)

    self.blocks = make_blocks(rngs)
    self.ln_f = nnx.LayerNorm(cfg.d_model, dtype=dt, rngs=rngs)
    out_dim = cfg.output_dim or cfg.vocab_size
    tied = cfg.tie_embeddings and not cfg.input_dim and not cfg.output_dim
    self.head: Optional[nnx.Linear] = nnx.data(
        None if tied else nnx.Linear(cfg.d_model, out_dim, use_bias=False, dtype=dt, rngs=rngs)
    )

  def embed_tokens(self, tokens_BT: jax.Array) -> jax.Array:
    """Input plus position embeddings: tokens ``[B, T]`` (or ``[B, T, input_dim]``) ->
    ``[B, T, d_model]``."""
    if self.cfg.input_dim:
      check_rank("inputs", tokens_BT, 3, "B, T, input_dim")
      if tokens_BT.shape[-1] != self.cfg.input_dim:
        raise ValueError(f"`inputs` has {tokens_BT.shape[-1]} channels, input_dim={self.cfg.input_dim}.")
    else:
      check_rank("tokens", tokens_BT, 2, "B, T")
    T = tokens_BT.shape[1]
    if self.cfg.positions == "learned" and T > self.cfg.max_len:
      raise ValueError(f"`tokens` has length {T} > max_len={self.cfg.max_len}.")
    x = self.embed(tokens_BT)
    if self.cfg.positions == "learned":
      x = x + self.pos[...][None, :T].astype(x.dtype)
    elif self.cfg.positions == "sinusoidal":
      x = x + sinusoidal_positions(T, self.cfg.d_model)[None].astype(x.dtype)
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


def sinusoidal_positions(length: int, dim: int) -> jax.Array:
  """Fixed sinusoidal positions (Vaswani et al. 2017, §3.5): ``[length, dim]``."""
  pos = jnp.arange(length, dtype=jnp.float32)[:, None]
  i = jnp.arange((dim + 1) // 2, dtype=jnp.float32)[None, :]
  angles = pos / jnp.power(10000.0, 2.0 * i / dim)
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)[:, :dim]


def count_params(model: nnx.Module) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
