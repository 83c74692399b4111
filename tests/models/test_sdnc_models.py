"""sDNC models: the multi-head sDNC with W_O is MHA; hybrids reduce to the Transformer."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.models import (
  EncoderDecoderConfig,
  SDNCEncoderDecoder,
  SDNCTransformer,
  TransformerConfig,
  TransformerLM,
  copy_params,
)
from jaxmem.models.transformer import MultiHeadAttention

CFG = TransformerConfig(d_model=24, n_layers=2, n_heads=3, d_ff=40, max_len=16)
TOKENS = jax.random.randint(jax.random.key(0), (2, 11), 0, 256)


def pure_loss(model, tokens):
  graphdef, state = nnx.split(model)
  def f(state):
    return jnp.sum(nnx.merge(graphdef, state, copy=True)(tokens) ** 2) * 1e-3
  return f, state


def test_multihead_sdnc_read_with_w_o_is_standard_mha():
  x = jax.random.normal(jax.random.key(1), (2, 9, 24))
  mha = MultiHeadAttention(CFG, rngs=nnx.Rngs(0))
  sdnc = MultiHeadAttention(dataclasses.replace(CFG, memory="sdnc"), rngs=nnx.Rngs(7))
  copy_params(mha, sdnc)
  np.testing.assert_allclose(sdnc(x), mha(x), rtol=1e-5, atol=1e-6)
  # and independently of our kernel: heads as jax.nn.dot_product_attention, then W_O
  qkv = mha.qkv(x).reshape(2, 9, 3, 3, 8)
  heads = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True)
  np.testing.assert_allclose(sdnc(x), heads.reshape(2, 9, 24) @ mha.out.kernel[...], rtol=1e-5, atol=1e-6)


def test_sdnc_transformer_equals_transformer_values_and_gradients():
  plain = TransformerLM(CFG, rngs=nnx.Rngs(0))
  sdnc = SDNCTransformer(CFG, rngs=nnx.Rngs(3))
  copy_params(plain, sdnc)
  np.testing.assert_allclose(sdnc(TOKENS), plain(TOKENS), rtol=1e-5, atol=1e-5)
  f1, s1 = pure_loss(plain, TOKENS)
  f2, s2 = pure_loss(sdnc, TOKENS)
  for a, b in zip(jax.tree.leaves(jax.grad(f1)(s1)), jax.tree.leaves(jax.grad(f2)(s2)), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_hybrid_flags_off_is_the_plain_transformer():
  a = TransformerLM(CFG, rngs=nnx.Rngs(0))
  b = TransformerLM(dataclasses.replace(CFG, write_gate=False, erase=False, link_reads=False),
                    rngs=nnx.Rngs(0))
  sa, sb = nnx.state(a, nnx.Param), nnx.state(b, nnx.Param)
  assert jax.tree.structure(sa) == jax.tree.structure(sb)
  np.testing.assert_array_equal(a(TOKENS), b(TOKENS))


@pytest.mark.parametrize("flags", [dict(write_gate=True), dict(erase=True), dict(link_reads=True),
                                   dict(write_gate=True, erase=True, link_reads=True)])
def test_each_hybrid_at_neutral_gates_reduces_exactly_to_the_transformer(flags):
  plain = TransformerLM(CFG, rngs=nnx.Rngs(0))
  hybrid = TransformerLM(dataclasses.replace(CFG, **flags), rngs=nnx.Rngs(4))
  copy_params(plain, hybrid)
  attn = hybrid.blocks.attn
  neutral = {"write_gate": 1e4, "erase_gate": 1e4}
  for name, bias in neutral.items():
    gate = getattr(attn, name)
    if gate is not None:
      gate.kernel[...] = jnp.zeros_like(gate.kernel[...])
      gate.bias[...] = jnp.full_like(gate.bias[...], bias)
  if attn.read_modes is not None:
    attn.read_modes.kernel[...] = jnp.zeros_like(attn.read_modes.kernel[...])
    attn.read_modes.bias[...] = jnp.tile(jnp.array([-1e4, 1e4, -1e4]), (CFG.n_layers, CFG.n_heads))
  np.testing.assert_allclose(hybrid(TOKENS), plain(TOKENS), rtol=1e-5, atol=1e-5)


def test_hybrid_gates_receive_gradients_and_stay_finite():
  hybrid = TransformerLM(dataclasses.replace(CFG, write_gate=True, erase=True, link_reads=True),
                         rngs=nnx.Rngs(0))
  f, state = pure_loss(hybrid, TOKENS)
  grads = jax.grad(f)(state)
  for name in ("write_gate", "erase_gate", "read_modes"):
    g = grads["blocks"]["attn"][name]["kernel"]
    assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).sum() > 0, name


def test_hybrid_with_sdnc_memory_is_rejected():
  with pytest.raises(ValueError, match="hybrids run on the parallel kernel"):
    TransformerConfig(memory="sdnc", erase=True)
  with pytest.raises(ValueError, match="memory must be"):
    TransformerConfig(memory="dnc")


def test_encoder_decoder_two_memory_sdnc_equals_cross_attention_model():
  cfg = EncoderDecoderConfig(decoder=CFG, n_enc_layers=2)
  plain = SDNCEncoderDecoder(cfg, rngs=nnx.Rngs(0))
  sdnc = SDNCEncoderDecoder(dataclasses.replace(cfg, decoder=dataclasses.replace(CFG, memory="sdnc")),
                            rngs=nnx.Rngs(9))
  copy_params(plain, sdnc)
  src = jax.random.randint(jax.random.key(2), (2, 7), 0, 256)
  out = plain(src, TOKENS)
  assert out.shape == (2, 11, 256)
  np.testing.assert_allclose(sdnc(src, TOKENS), out, rtol=1e-5, atol=1e-5)
  # the decoder is causal in its own tokens and sees the whole source
  t2 = TOKENS.at[:, 8:].set(0)
  np.testing.assert_allclose(plain(src, t2)[:, :8], out[:, :8], rtol=1e-5, atol=1e-6)
  assert not np.allclose(plain(src.at[:, -1].set(1), TOKENS)[:, 0], out[:, 0])


def test_continuous_io_and_position_options():
  for positions in ("learned", "sinusoidal", "none"):
    m = TransformerLM(dataclasses.replace(CFG, input_dim=5, output_dim=4, positions=positions),
                      rngs=nnx.Rngs(0))
    assert m(jnp.ones((2, 9, 5))).shape == (2, 9, 4)
  m = TransformerLM(dataclasses.replace(CFG, input_dim=5, output_dim=4, positions="none"), rngs=nnx.Rngs(0))
  assert m(jnp.ones((1, 40, 5))).shape == (1, 40, 4)  # no max_len limit without learned positions
  with pytest.raises(ValueError, match="channels"):
    m(jnp.ones((1, 4, 6)))
