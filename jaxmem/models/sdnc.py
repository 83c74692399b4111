"""Transformers read as stateless DNCs (Tang & Xie 2026), in Flax NNX.

* :class:`SDNCTransformer` — the decoder-only Transformer whose every attention layer is
  run as a read of a write-once memory (the ``"sdnc"`` mixer, ``SDNCConfig``). Heads are
  read heads, ``W_O`` mixes the read vectors. It computes the same function as
  :class:`~jaxmem.models.transformer.TransformerLM` with the same weights (tested); it
  exists to make the equivalence executable, not for speed.
* The paper's hybrids are the ``"sdnc_hybrid"`` mixer (flags ``write_gate``, ``erase``,
  ``link_reads`` of :class:`~jaxmem.models.mixers.SDNCHybridConfig`), each reducing
  exactly to the plain model when off.
* :class:`SDNCEncoderDecoder` — cross-attention as an sDNC with two memories: the
  decoder's own write-as-you-go memory and a fixed memory written once by the encoder,
  read by different heads.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_config_ints
from jaxmem.kernels.attention import softmax_attention
from jaxmem.kernels.sdnc import sdnc_cross_attention
from jaxmem.models.layers import FeedForward, embed, layer_norm, linear, positions, token_ids
from jaxmem.models.mixers import SDNCConfig, SoftmaxConfig
from jaxmem.models.transformer import Block, TransformerConfig, TransformerLM


class SDNCTransformer(TransformerLM):
  """``TransformerLM`` whose softmax mixers run as sDNC reads (``SDNCConfig``), same weights."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    def as_sdnc(m):
      if not isinstance(m, (SoftmaxConfig, SDNCConfig)):
        raise ValueError(f"SDNCTransformer runs plain sDNC reads of softmax mixers, got mixer {m.name!r}; "
                         "build hybrids as TransformerLM(mixer=SDNCHybridConfig(...)).")
      return SDNCConfig(short_conv=m.short_conv)
    mixer = tuple(map(as_sdnc, cfg.mixer)) if isinstance(cfg.mixer, tuple) else as_sdnc(cfg.mixer)
    super().__init__(dataclasses.replace(cfg, mixer=mixer), rngs=rngs)


class CrossMemoryRead(nnx.Module):
  """Multi-head reads of a fixed (encoder-written) memory: queries from ``x``, slots from ``mem``."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.q = linear(cfg.d_model, cfg.d_model, ("embed", "heads"), use_bias=False, rngs=rngs)
    # [2, H, K] columns: a split of them is not head-aligned
    self.kv = linear(cfg.d_model, 2 * cfg.d_model, ("embed", None), use_bias=False, rngs=rngs)
    self.out = linear(cfg.d_model, cfg.d_model, ("heads", "embed"), use_bias=False, rngs=rngs)

  def __call__(self, x_BTD, mem_BSD):
    B, T, _ = x_BTD.shape
    S = mem_BSD.shape[1]
    H, K = self.cfg.n_heads, self.cfg.head_dim
    q = self.q(x_BTD).reshape(B, T, H, K)
    kv = self.kv(mem_BSD).reshape(B, S, 2, H, K)
    read = sdnc_cross_attention if isinstance(self.cfg.layer_mixer(0), SDNCConfig) else (
        lambda q, k, v: softmax_attention(q, k, v, causal=False))
    return self.out(read(q, kv[:, :, 0], kv[:, :, 1]).reshape(B, T, self.cfg.d_model))


class EncoderBlock(nnx.Module):
  """Bidirectional block: the encoder memory is written in full before it is read."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.ln1 = layer_norm(cfg.d_model, rngs=rngs)
    self.attn = CrossMemoryRead(cfg, rngs=rngs)
    self.ln2 = layer_norm(cfg.d_model, rngs=rngs)
    self.ffn = FeedForward(cfg.d_model, cfg.d_ff, n_layers=cfg.n_layers, dtype=jnp.dtype(cfg.dtype), rngs=rngs)

  def __call__(self, x):
    h = self.ln1(x)
    x = x + self.attn(h, h)
    return x + self.ffn(self.ln2(x))


class DecoderBlock(nnx.Module):
  """Causal self memory (written as you go), then a read of the encoder's fixed memory."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.self_block = Block(cfg, rngs=rngs)  # pre-LN self-attention + FFN
    self.ln_x = layer_norm(cfg.d_model, rngs=rngs)
    self.cross = CrossMemoryRead(cfg, rngs=rngs)

  def __call__(self, x, mem):
    x = self.self_block(x)
    return x + self.cross(self.ln_x(x), mem)


@dataclasses.dataclass(frozen=True)
class EncoderDecoderConfig:
  decoder: TransformerConfig = TransformerConfig()
  n_enc_layers: int = 2
  src_vocab_size: int = 256

  def __post_init__(self):
    check_config_ints(self, ("n_enc_layers", "src_vocab_size"))


class SDNCEncoderDecoder(nnx.Module):
  """``(src [B, S], tgt [B, T]) -> logits [B, T, vocab]`` with two memories per decoder layer."""

  def __init__(self, cfg: EncoderDecoderConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d = cfg.decoder
    self.src_embed = embed(cfg.src_vocab_size, d.d_model, rngs=rngs)
    self.tgt_embed = embed(d.vocab_size, d.d_model, rngs=rngs)
    self.src_pos = positions(d.max_len, d.d_model, std=0.02, rngs=rngs)
    self.tgt_pos = positions(d.max_len, d.d_model, std=0.02, rngs=rngs)

    @nnx.split_rngs(splits=cfg.n_enc_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_enc(rngs):
      return EncoderBlock(d, rngs=rngs)

    @nnx.split_rngs(splits=d.n_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_dec(rngs):
      return DecoderBlock(d, rngs=rngs)

    self.encoder, self.decoder = make_enc(rngs), make_dec(rngs)
    self.ln_enc = layer_norm(d.d_model, rngs=rngs)
    self.ln_f = layer_norm(d.d_model, rngs=rngs)

  def encode(self, src_BS):
    S = src_BS.shape[1]
    x = self.src_embed(token_ids(src_BS, self.cfg.src_vocab_size)) + self.src_pos[...][None, :S]

    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    def run(block, h):
      return block(h)
    return self.ln_enc(run(self.encoder, x))

  def __call__(self, src_BS, tgt_BT):
    mem = self.encode(src_BS)
    T = tgt_BT.shape[1]
    x = self.tgt_embed(token_ids(tgt_BT, self.cfg.decoder.vocab_size)) + self.tgt_pos[...][None, :T]

    @nnx.scan(in_axes=(0, nnx.Carry, None), out_axes=nnx.Carry)
    def run(block, h, m):
      return block(h, m)
    h = self.ln_f(run(self.decoder, x, mem))
    return self.tgt_embed.attend(h).astype(jnp.float32)


def copy_params(src: nnx.Module, dst: nnx.Module) -> None:
  """Copies every parameter ``dst`` shares (same path) with ``src``; the rest are kept."""
  src_flat = dict(nnx.to_flat_state(nnx.state(src, nnx.Param)))
  dst_state = nnx.state(dst, nnx.Param)
  flat = []
  for path, var in nnx.to_flat_state(dst_state):
    flat.append((path, src_flat[path] if path in src_flat else var))
  nnx.update(dst, nnx.from_flat_state(flat))


__all__ = ["EncoderDecoderConfig", "SDNCEncoderDecoder", "SDNCTransformer", "copy_params"]
