"""The baseline LM: shapes, causality by gradient, remat/tied variants, config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.models import AssocConfig, SoftmaxConfig, TransformerConfig, TransformerLM, count_params

TINY = dict(d_model=24, n_layers=2, n_heads=3, d_ff=40, max_len=16)


def make(**kw):
  return TransformerLM(TransformerConfig(**{**TINY, **kw}), rngs=nnx.Rngs(0))


def test_logits_shape_and_dtype():
  logits = make()(jnp.zeros((2, 11), jnp.int32))
  assert logits.shape == (2, 11, 256) and logits.dtype == jnp.float32


@pytest.mark.parametrize("t", [0, 4, 10])
def test_causality_by_gradient(t):
  """d logits[:, t] / d inputs[:, s] is exactly zero for s > t and nonzero for s <= t."""
  model = make()
  tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, 256)
  x = model.embed_tokens(tokens)

  graphdef, state = nnx.split(model)

  def out_at_t(x):
    return nnx.merge(graphdef, state, copy=True).logits_from_embeddings(x)[:, t].sum()

  g = jax.grad(out_at_t)(x)  # [B, T, D]
  per_pos = np.abs(np.asarray(g)).sum(axis=(0, 2))
  assert np.all(per_pos[t + 1:] == 0.0), per_pos
  assert np.all(per_pos[: t + 1] > 0.0), per_pos


def test_loss_at_t_has_zero_gradient_wrt_later_inputs():
  from jaxmem.train.losses import token_nll
  model = make()
  tokens = jax.random.randint(jax.random.key(2), (1, 9), 0, 256)
  targets = jnp.roll(tokens, -1, axis=1)
  x = model.embed_tokens(tokens)
  graphdef, state = nnx.split(model)
  logits = lambda x: nnx.merge(graphdef, state, copy=True).logits_from_embeddings(x)
  for t in (2, 7):
    g = jax.grad(lambda x: token_nll(logits(x), targets)[0, t])(x)
    assert np.all(np.asarray(g)[0, t + 1:] == 0.0)
    assert np.abs(np.asarray(g)[0, t]).sum() > 0


def test_remat_gives_identical_values_and_gradients():
  tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, 256)
  plain, remat = make(), make(remat=True)
  def loss(m):
    return m(tokens).mean()
  np.testing.assert_allclose(loss(plain), loss(remat), rtol=1e-6)
  g1 = nnx.grad(loss)(plain)
  g2 = nnx.grad(loss)(remat)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_untied_embeddings_add_a_head():
  tied, untied = make(), make(tie_embeddings=False)
  assert count_params(untied) - count_params(tied) == 24 * 256


def test_bfloat16_compute_is_finite_and_float32_logits():
  logits = make(dtype="bfloat16")(jnp.ones((1, 8), jnp.int32))
  assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()


def test_too_long_input_and_bad_rank_raise():
  model = make()
  with pytest.raises(ValueError, match="max_len=16"):
    model(jnp.zeros((1, 17), jnp.int32))
  with pytest.raises(ValueError, match="`tokens` must have rank 2"):
    model(jnp.zeros((17,), jnp.int32))


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


def test_short_conv_matches_a_numpy_loop_values_and_gradients():
  from jaxmem.models.mixers import ShortConv
  conv = ShortConv(3, 5, rngs=nnx.Rngs(0))
  w = np.asarray(jax.random.normal(jax.random.key(0), (3, 5)), np.float64)
  conv.kernel[...] = jnp.asarray(w, jnp.float32)
  x = np.asarray(jax.random.normal(jax.random.key(1), (2, 7, 5)), np.float64)
  ref = np.zeros_like(x)
  for t in range(7):
    for j in range(3):
      if t - j >= 0:
        ref[:, t] += w[j] * x[:, t - j]
  np.testing.assert_allclose(conv(jnp.asarray(x, jnp.float32)), ref, rtol=1e-5, atol=1e-5)
  # d sum(y * c) / dw_j = Σ_t c_t ⊙ x_{t−j}
  c = np.asarray(jax.random.normal(jax.random.key(2), (2, 7, 5)), np.float64)
  graphdef, state = nnx.split(conv)
  g = jax.grad(lambda st: (nnx.merge(graphdef, st)(jnp.asarray(x, jnp.float32)) * c).sum())(state)
  ref_g = np.stack([(c[:, j:] * x[:, :7 - j]).sum(axis=(0, 1)) for j in range(3)])
  np.testing.assert_allclose(g["kernel"][...], ref_g, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("memory", ["softmax", "assoc"])
def test_short_conv_starts_as_the_identity(memory):
  """A fresh short conv (w_0 = 1) leaves the model equal to the same weights without it."""
  plain, conv = make(mixer=MIXERS[memory]()), make(mixer=MIXERS[memory](short_conv=4))
  tokens = jax.random.randint(jax.random.key(4), (2, 11), 0, 256)
  np.testing.assert_allclose(plain(tokens), conv(tokens), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("memory", ["softmax", "assoc"])
def test_short_conv_model_is_causal_by_gradient(memory):
  model = make(mixer=MIXERS[memory](short_conv=3))
  # random taps so every tap carries gradient
  for blk_kernel in [model.blocks.attn.conv.kernel]:
    blk_kernel[...] = jax.random.normal(jax.random.key(5), blk_kernel[...].shape)
  x = model.embed_tokens(jax.random.randint(jax.random.key(1), (2, 11), 0, 256))
  graphdef, state = nnx.split(model)
  for t in (0, 6):
    g = jax.grad(lambda x: nnx.merge(graphdef, state, copy=True).logits_from_embeddings(x)[:, t].sum())(x)
    per_pos = np.abs(np.asarray(g)).sum(axis=(0, 2))
    assert np.all(per_pos[t + 1:] == 0.0) and np.all(per_pos[: t + 1] > 0.0), per_pos


def test_short_conv_must_be_non_negative():
  for mixer in (SoftmaxConfig, AssocConfig):
    with pytest.raises(ValueError, match="short_conv"):
      mixer(short_conv=-1)


@pytest.mark.parametrize("width,channels,match", [(0, 4, "width"), (3, 0, "channels")])
def test_short_conv_module_rejects_bad_sizes(width, channels, match):
  from jaxmem.models.mixers import ShortConv
  with pytest.raises(ValueError, match=match):
    ShortConv(width, channels, rngs=nnx.Rngs(0))
