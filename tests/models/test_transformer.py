"""The baseline LM: shapes, causality by gradient, remat/tied variants, config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.models import TransformerConfig, TransformerLM, count_params

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
  from jaxmem.train.lm import token_nll
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
