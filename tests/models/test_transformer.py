"""The baseline LM: shapes, causality by exact zero Jacobian blocks (logits and per-token loss), remat and
tied variants, the short convolution against a float64 numpy loop (values and gradients), config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.models import AssocConfig, SoftmaxConfig, TransformerConfig, TransformerLM, count_params
from jaxmem.models.layers import CausalConv
from jaxmem.train.losses import token_nll
from tests.models.jitted import assert_causal, forward, logit_jacobian

TINY = dict(d_model=24, n_layers=2, n_heads=3, d_ff=40, max_len=16)
TOKENS = jax.random.randint(jax.random.key(1), (2, 11), 0, 256)   # the one input shape of this module
W_V = jax.random.normal(jax.random.key(7), (256,))


def make(**kw):
  return TransformerLM(TransformerConfig(**{**TINY, **kw}), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tiny():
  return make()


def test_logits_shape_and_dtype(tiny):
  logits = forward(tiny, jnp.zeros((2, 11), jnp.int32))
  assert logits.shape == (2, 11, 256) and logits.dtype == jnp.float32


@nnx.jit
def _logit_and_nll_jacobians(model, tokens_BT, w_V):
  """``J[b, t, c, s] = Σ_d |∂ y[b, t] / ∂ x[c, s, d]|`` w.r.t. the embeddings ``x``, for ``y`` the logits read
  out along ``w`` and for the next-token loss: every position, one compiled program."""
  graphdef, state = nnx.split(model)
  targets = jnp.roll(tokens_BT, -1, axis=1)

  def outputs(x):
    logits = nnx.merge(graphdef, state, copy=True).logits_from_embeddings(x)
    return logits @ w_V, token_nll(logits, targets)

  return jax.tree.map(lambda j: jnp.abs(j).sum(-1), jax.jacrev(outputs)(model.embed_tokens(tokens_BT)))


@pytest.fixture(scope="module")
def tiny_jacobians(tiny):
  return _logit_and_nll_jacobians(tiny, TOKENS, W_V)


def test_causality_by_gradient(tiny_jacobians):
  """d logits[b, t] / d inputs[c, s] is exactly zero for s > t (and c ≠ b) and nonzero for s ≤ t, at every t."""
  assert_causal(tiny_jacobians[0], "logits")


def test_loss_at_t_has_zero_gradient_wrt_later_inputs(tiny_jacobians):
  assert_causal(tiny_jacobians[1], "token loss")


@nnx.jit
def _mean_logit_and_grads(model, tokens):
  return nnx.value_and_grad(lambda m: m(tokens).mean())(model)


def test_remat_gives_identical_values_and_gradients(tiny):
  (v1, g1), (v2, g2) = _mean_logit_and_grads(tiny, TOKENS), _mean_logit_and_grads(make(remat=True), TOKENS)
  np.testing.assert_allclose(v1, v2, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_untied_embeddings_add_a_head():
  tied, untied = (nnx.eval_shape(lambda t=t: make(tie_embeddings=t)) for t in (True, False))
  assert count_params(untied) - count_params(tied) == 24 * 256


def test_bfloat16_compute_is_finite_and_float32_logits():
  logits = forward(make(dtype="bfloat16"), TOKENS)
  assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()


def test_too_long_input_and_bad_rank_raise(tiny):
  with pytest.raises(ValueError, match="max_len=16"):
    tiny(jnp.zeros((1, 17), jnp.int32))
  with pytest.raises(ValueError, match="`tokens` must have rank 2"):
    tiny(jnp.zeros((17,), jnp.int32))


@pytest.mark.parametrize(
    "kw,match",
    [({"n_heads": 5}, "must divide d_model"), ({"d_model": 0}, "d_model must be a positive"),
     ({"dtype": "float16"}, "dtype"), ({"n_layers": 2.0}, "n_layers")],
)
def test_bad_config_raises(kw, match):
  with pytest.raises(ValueError, match=match):
    TransformerConfig(**{**TINY, **kw})


# --- short convolution (short_conv=K, a field of the q/k/v mixers) ---------------------

MIXERS = {"softmax": SoftmaxConfig, "assoc": lambda **kw: AssocConfig(rule="delta", key_norm=True, **kw)}


@pytest.mark.parametrize("bias", [False, True])
def test_causal_conv_matches_a_numpy_loop_values_gradients_and_state(bias):
  """``y_t = b + Σ_j w_j ⊙ x_{t−K+1+j}`` (PyTorch's Conv1d order: the last tap on the current token) written out
  in float64, values and gradients w.r.t. taps and bias; the sequence split in two (``scan`` from the tail the
  first part left) and token by token (``step``) give the same."""
  conv = CausalConv(3, 5, bias=bias, init="uniform", rngs=nnx.Rngs(0))
  w = np.asarray(conv.taps[...], np.float64)
  b = np.asarray(conv.bias[...], np.float64) if bias else np.zeros(5)
  x = np.asarray(jax.random.normal(jax.random.key(1), (2, 7, 5)), np.float64)
  ref = np.zeros_like(x) + b
  for t in range(7):
    for j in range(3):
      if t - 2 + j >= 0:
        ref[:, t] += w[j] * x[:, t - 2 + j]
  c = np.asarray(jax.random.normal(jax.random.key(2), (2, 7, 5)), np.float64)
  y, g, y_split, y_steps = _conv_and_grad(conv, jnp.asarray(x, jnp.float32), jnp.asarray(c, jnp.float32))
  # float32 sums of 3 (+ bias) products of unit-size numbers: a few ulps of the largest term
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
  # d sum(y * c) / dw_j = Σ_t c_t ⊙ x_{t−2+j}; d / db = Σ_t c_t: float32 sums of 14 products
  ref_g = np.stack([(c[:, 2 - j:] * x[:, :7 - (2 - j)]).sum(axis=(0, 1)) for j in range(3)])
  np.testing.assert_allclose(g["taps"][...], ref_g, rtol=1e-4, atol=1e-4)
  if bias:
    np.testing.assert_allclose(g["bias"][...], c.sum(axis=(0, 1)), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(y_split, y, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(y_steps, y, rtol=1e-6, atol=1e-6)


@nnx.jit
def _conv_and_grad(conv, x, c):
  tail, y1 = conv.scan(None, x[:, :4])
  _, y2 = conv.scan(tail, x[:, 4:])
  _, ys = jax.lax.scan(lambda s, xt: conv.step(s, xt), conv.init_tail(x.shape[0]), jnp.moveaxis(x, 1, 0))
  grad = nnx.grad(lambda m: (m(x) * c).sum())(conv)
  return conv(x), grad, jnp.concatenate([y1, y2], 1), jnp.moveaxis(ys, 0, 1)


@pytest.mark.parametrize("memory", ["softmax", "assoc"])
def test_short_conv_starts_as_the_identity(memory):
  """A fresh short conv (w_0 = 1) leaves the model equal to the same weights without it."""
  plain, conv = make(mixer=MIXERS[memory]()), make(mixer=MIXERS[memory](short_conv=3))
  np.testing.assert_allclose(forward(plain, TOKENS), forward(conv, TOKENS), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("memory", ["softmax", "assoc"])
def test_short_conv_model_is_causal_by_gradient(memory):
  model = make(mixer=MIXERS[memory](short_conv=3))
  # random taps so every tap carries gradient
  taps = model.blocks.attn.conv.taps
  taps[...] = jax.random.normal(jax.random.key(5), taps[...].shape)
  assert_causal(logit_jacobian(model, TOKENS, W_V), f"short conv {memory}")


def test_short_conv_must_be_non_negative():
  for mixer in (SoftmaxConfig, AssocConfig):
    with pytest.raises(ValueError, match="short_conv"):
      mixer(short_conv=-1)


@pytest.mark.parametrize("width,channels,match", [(0, 4, "width"), (3, 0, "channels")])
def test_short_conv_module_rejects_bad_sizes(width, channels, match):
  with pytest.raises(ValueError, match=match):
    CausalConv(width, channels, rngs=nnx.Rngs(0))


def test_the_ffn_slot_holds_the_mlp_another_mixer_or_nothing():
  # built abstractly (the structure and counts are what change): nothing is compiled
  from jaxmem.models.mixers import MatrixStateConfig
  base = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=24, max_len=8)
  build = lambda **kw: nnx.eval_shape(lambda: TransformerLM(TransformerConfig(**base, **kw), rngs=nnx.Rngs(0)))
  mlp, none = build(), build(ffn=None)
  mem = build(ffn={"name": "matrix_state", "state_dim": 4})   # a config file's dict form
  assert isinstance(mem.cfg.ffn, MatrixStateConfig) and mem.cfg.ffn.state_dim == 4
  ffn_mlp = 16 * 24 + 24 + 24 * 16 + 16 + 2 * 16          # up, down and the second LayerNorm, per layer
  assert count_params(mlp) - count_params(none) == 2 * ffn_mlp
  assert none.blocks.ffn is None and none.blocks.ln2 is None
  assert count_params(mem) - count_params(none) == count_params(mem.blocks.ffn) + 2 * 2 * 16
  x = jax.ShapeDtypeStruct((2, 8), jnp.int32)
  for m in (mlp, none, mem):
    assert nnx.eval_shape(lambda m, x: m(x), m, x).shape == (2, 8, 32)
  # the memory in the ffn slot counts in the state size: one 4 × 4 matrix per head and layer
  assert mem.cfg.state_floats(8) == mlp.cfg.state_floats(8) + 2 * 2 * 4 * 4
  with pytest.raises(ValueError, match="TransformerConfig.ffn must be 'mlp', None or a mixer config"):
    TransformerConfig(**base, ffn="gelu")


def test_token_ids_outside_the_vocabulary_raise_eagerly_and_are_clipped_under_jit(tiny):
  model = tiny
  V = model.cfg.vocab_size
  bad = jnp.array([[0, V, 3], [-1, 2, 1]])
  msg = rf"`tokens` must lie in \[0, vocab_size={V}\), got ids such as \[{V}, -1\]"
  with pytest.raises(ValueError, match=msg):
    model(bad)
  with pytest.raises(ValueError, match="`tokens` must be integer token ids, got dtype float32"):
    model(bad.astype(jnp.float32))
  # under jit the values cannot be checked: no NaN, the logits of the ids clipped into range
  got = np.asarray(forward(model, bad))
  assert np.isfinite(got).all()
  np.testing.assert_array_equal(got, np.asarray(forward(model, jnp.clip(bad, 0, V - 1))))
