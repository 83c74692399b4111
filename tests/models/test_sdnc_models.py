"""sDNC models: the multi-head sDNC with W_O is MHA (our kernel and jax.nn.dot_product_attention); the sDNC
Transformer equals the Transformer in values and gradients; hybrids with neutral gates reduce to the plain
Transformer written out in float64 numpy, and each gate moves the logits; the two-memory encoder-decoder."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.models import (
  EncoderDecoderConfig,
  SDNCConfig,
  SDNCEncoderDecoder,
  SDNCHybridConfig,
  SDNCTransformer,
  SoftmaxConfig,
  TransformerConfig,
  TransformerLM,
  copy_params,
  mixers,
)
from tests.models.jitted import forward, forward2
from tests.models.params import perturb

CFG = TransformerConfig(d_model=24, n_layers=2, n_heads=3, d_ff=40, max_len=16)
TOKENS = jax.random.randint(jax.random.key(0), (2, 11), 0, 256)


@nnx.jit
def logits_and_grads(model, tokens):
  """The logits and the gradient of ``1e-3 · Σ logits²`` w.r.t. every parameter: one compiled program."""
  def loss(m):
    logits = m(tokens)
    return jnp.sum(logits ** 2) * 1e-3, logits
  (_, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
  return logits, grads


_dot_product_attention = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))


def test_multihead_sdnc_read_with_w_o_is_standard_mha():
  x = jax.random.normal(jax.random.key(1), (2, 9, 24))
  dims = dict(d_model=24, n_heads=3, n_layers=2, dtype="float32")
  mha = mixers.build(SoftmaxConfig(), **dims, rngs=nnx.Rngs(0))
  sdnc = mixers.build(SDNCConfig(), **dims, rngs=nnx.Rngs(7))
  copy_params(mha, sdnc)
  y = forward(sdnc, x)
  np.testing.assert_allclose(y, forward(mha, x), rtol=1e-5, atol=1e-6)
  # and independently of our kernel: heads as jax.nn.dot_product_attention, then W_O
  qkv = jnp.asarray(np.asarray(x, np.float64) @ np.asarray(mha.qkv.kernel[...], np.float64),
                    jnp.float32).reshape(2, 9, 3, 3, 8)
  heads = np.asarray(_dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]), np.float64)
  w_o = np.asarray(mha.out.kernel[...], np.float64)
  np.testing.assert_allclose(y, heads.reshape(2, 9, 24) @ w_o, rtol=1e-5, atol=1e-6)


def test_sdnc_transformer_equals_transformer_values_and_gradients():
  plain = TransformerLM(CFG, rngs=nnx.Rngs(0))
  sdnc = SDNCTransformer(CFG, rngs=nnx.Rngs(3))
  copy_params(plain, sdnc)
  (y1, g1), (y2, g2) = logits_and_grads(plain, TOKENS), logits_and_grads(sdnc, TOKENS)
  np.testing.assert_allclose(y2, y1, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def reference_logits(model, tokens) -> np.ndarray:
  """The plain pre-LN softmax Transformer written out in float64 numpy from ``model``'s parameters
  (learned positions, tied embeddings, causal softmax with 1/√d_head, tanh-GELU, LayerNorm ε = 1e-6);
  no jaxmem kernel or module is called."""
  cfg = model.cfg
  f = lambda p: np.asarray(p[...], np.float64)
  H, K, D = cfg.n_heads, cfg.head_dim, cfg.d_model
  tok = np.asarray(tokens)
  B, T = tok.shape
  E = f(model.embed.embedding)
  x = E[tok] + f(model.pos)[:T]

  def ln(x, norm, layer=None):
    scale, bias = f(norm.scale), f(norm.bias)
    if layer is not None:
      scale, bias = scale[layer], bias[layer]
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-6) * scale + bias

  blk, causal = model.blocks, np.tril(np.ones((T, T), bool))
  for layer in range(cfg.n_layers):
    h = ln(x, blk.ln1, layer)
    # q, k, v each [B, H, T, K]
    q, k, v = (h @ f(blk.attn.qkv.kernel)[layer]).reshape(B, T, 3, H, K).transpose(2, 0, 3, 1, 4)
    s = np.where(causal, q @ k.swapaxes(-1, -2) / np.sqrt(K), -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    x = x + (a @ v).transpose(0, 2, 1, 3).reshape(B, T, D) @ f(blk.attn.out.kernel)[layer]
    u = ln(x, blk.ln2, layer) @ f(blk.ffn.up.kernel)[layer] + f(blk.ffn.up.bias)[layer]
    g = 0.5 * u * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (u + 0.044715 * u ** 3)))
    x = x + g @ f(blk.ffn.down.kernel)[layer] + f(blk.ffn.down.bias)[layer]
  return ln(x, model.ln_f) @ E.T


PLAIN_PATHS = {"embed/embedding", "pos", "ln_f/scale", "ln_f/bias"} | {
    f"blocks/{p}" for p in ("ln1/scale", "ln1/bias", "attn/qkv/kernel", "attn/out/kernel", "ln2/scale",
                            "ln2/bias", "ffn/up/kernel", "ffn/up/bias", "ffn/down/kernel", "ffn/down/bias")}
GATES = {"write_gate": "write_gate", "erase": "erase_gate", "link_reads": "read_modes"}


def param_paths(model) -> set:
  return {"/".join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def set_gates(attn, active=(), seed: int = 5) -> None:
  """Gate projections of a hybrid: neutral (write σ → 1, retain σ → 1, read mode = content: biases ±1e4, zero
  kernels), except those named in ``active``: input-dependent (N(0, 1) kernels, zero biases)."""
  for i, name in enumerate(("write_gate", "erase_gate", "read_modes")):
    gate = getattr(attn, name)
    if gate is None:
      continue
    if name in active:
      gate.kernel[...] = jax.random.normal(jax.random.key(seed + i), gate.kernel.shape)
      gate.bias[...] = jnp.zeros_like(gate.bias[...])
    else:
      gate.kernel[...] = jnp.zeros_like(gate.kernel[...])
      bias = [1e4] if name != "read_modes" else [-1e4, 1e4, -1e4]
      gate.bias[...] = jnp.tile(jnp.array(bias), (CFG.n_layers, gate.bias.shape[-1] // len(bias)))


@pytest.mark.slow
def test_hybrid_flags_off_is_the_plain_transformer():
  """Flags off: no gate parameters, and the logits are the plain softmax Transformer's as written out in
  numpy from the same (perturbed, so every term matters) weights — two different computations."""
  off = TransformerLM(dataclasses.replace(CFG, mixer=SDNCHybridConfig(write_gate=False, erase=False,
                                                                      link_reads=False)), rngs=nnx.Rngs(0))
  assert param_paths(off) == PLAIN_PATHS
  attn = off.blocks.attn
  assert attn.write_gate is None and attn.erase_gate is None and attn.read_modes is None
  # the reference itself is right: it reproduces the unperturbed model and reacts to a weight change
  ref0 = reference_logits(off, TOKENS)
  np.testing.assert_allclose(forward(off, TOKENS), ref0, rtol=1e-4, atol=1e-5)
  perturb(off, 1)
  ref = reference_logits(off, TOKENS)
  assert np.abs(ref - ref0).max() > 1.0
  np.testing.assert_allclose(forward(off, TOKENS), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flags", [dict(write_gate=True), dict(erase=True), dict(link_reads=True),
                                   dict(write_gate=True, erase=True, link_reads=True)])
def test_each_hybrid_at_neutral_gates_reduces_exactly_to_the_transformer(flags):
  plain = TransformerLM(CFG, rngs=nnx.Rngs(0))
  hybrid = TransformerLM(dataclasses.replace(CFG, mixer=SDNCHybridConfig(**flags)), rngs=nnx.Rngs(4))
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
  np.testing.assert_allclose(forward(hybrid, TOKENS), forward(plain, TOKENS), rtol=1e-5, atol=1e-5)
  # the shared weights are exactly the plain model's, plus one projection per flag that is on
  assert param_paths(hybrid) == PLAIN_PATHS | {f"blocks/attn/{GATES[f]}/{w}" for f in flags
                                               for w in ("kernel", "bias")}
  # perturbed shared weights: the neutral hybrid is the numpy softmax Transformer, and every gate that is on
  # moves the logits far beyond that tolerance once it is input-dependent (so a gate that is dropped, or
  # mis-wired, is caught)
  perturb(plain, 1)
  copy_params(plain, hybrid)
  set_gates(attn)
  ref = reference_logits(plain, TOKENS)
  np.testing.assert_allclose(forward(hybrid, TOKENS), ref, rtol=1e-4, atol=1e-4)
  for flag in flags:  # one gate input-dependent, the others neutral
    set_gates(attn, active=(GATES[flag],))
    moved = float(np.abs(np.asarray(forward(hybrid, TOKENS)) - ref).max())
    assert moved > 0.1, f"{flag}: an input-dependent gate moved the logits by only {moved:.2e}"


def test_hybrid_gates_receive_gradients_and_stay_finite():
  hybrid = TransformerLM(dataclasses.replace(CFG, mixer=SDNCHybridConfig(write_gate=True, erase=True,
                                                                         link_reads=True)), rngs=nnx.Rngs(0))
  _, grads = logits_and_grads(hybrid, TOKENS)
  for name in ("write_gate", "erase_gate", "read_modes"):
    g = grads["blocks"]["attn"][name]["kernel"]
    assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).sum() > 0, name


def test_hybrid_with_sdnc_memory_is_rejected():
  # a hybrid on the sDNC scan kernel cannot be spelled any more (the hybrids are their own mixer);
  # the sDNC Transformer refuses a hybrid config, and unknown mixers are named
  with pytest.raises(ValueError, match="SDNCTransformer runs plain sDNC reads"):
    SDNCTransformer(dataclasses.replace(CFG, mixer=SDNCHybridConfig(erase=True)), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="mixer must be"):
    TransformerConfig(mixer="dnc")
  with pytest.raises(ValueError, match="unknown mixer 'dnc'"):
    mixers.MixerConfig.from_dict({"name": "dnc"})


def test_encoder_decoder_two_memory_sdnc_equals_cross_attention_model():
  cfg = EncoderDecoderConfig(decoder=CFG, n_enc_layers=2)
  plain = SDNCEncoderDecoder(cfg, rngs=nnx.Rngs(0))
  sdnc = SDNCEncoderDecoder(dataclasses.replace(cfg, decoder=dataclasses.replace(CFG, mixer=SDNCConfig())),
                            rngs=nnx.Rngs(9))
  copy_params(plain, sdnc)
  src = jax.random.randint(jax.random.key(2), (2, 7), 0, 256)
  out = forward2(plain, src, TOKENS)
  assert out.shape == (2, 11, 256)
  np.testing.assert_allclose(forward2(sdnc, src, TOKENS), out, rtol=1e-5, atol=1e-5)
  # the decoder is causal in its own tokens and sees the whole source
  t2 = TOKENS.at[:, 8:].set(0)
  np.testing.assert_allclose(forward2(plain, src, t2)[:, :8], out[:, :8], rtol=1e-5, atol=1e-6)
  assert not np.allclose(forward2(plain, src.at[:, -1].set(1), TOKENS)[:, 0], out[:, 0])


def test_continuous_io_and_position_options():
  # built and applied abstractly: the whole init and forward are traced (shapes checked), nothing compiled
  shape = lambda m, x: nnx.eval_shape(lambda m, x: m(x), m, x).shape
  for positions in ("learned", "sinusoidal", "none"):
    m = nnx.eval_shape(lambda p=positions: TransformerLM(
        dataclasses.replace(CFG, input_dim=5, output_dim=4, positions=p), rngs=nnx.Rngs(0)))
    assert shape(m, jnp.ones((2, 9, 5))) == (2, 9, 4)
  assert shape(m, jnp.ones((1, 40, 5))) == (1, 40, 4)  # no max_len limit without learned positions
  with pytest.raises(ValueError, match="channels"):
    m(jnp.ones((1, 4, 6)))
