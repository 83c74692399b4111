"""The "ahat" mixer: registered, causal, soft-to-hard on the same parameters, trainable soft."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.models import SoftmaxConfig, TransformerConfig, TransformerLM, mixers
from jaxmem.models.mixers import AHATAttention, AHATConfig
from jaxmem.train.losses import lm_loss
from tests.models.adam import adam_steps
from tests.models.jitted import forward

TINY = dict(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16)
TOKENS = jax.random.randint(jax.random.key(0), (2, 9), 0, 256)


@functools.cache   # one instance per mixer, shared by the tests that only read it
def _lm(mixer):
  return TransformerLM(TransformerConfig(**TINY, mixer=mixer), rngs=nnx.Rngs(0))


def _same_params(model, mixer):
  """A model with ``mixer`` and ``model``'s parameters (the new graph is built abstractly)."""
  cfg = dataclasses.replace(model.cfg, mixer=mixer)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: TransformerLM(cfg, rngs=nnx.Rngs(0))))
  return nnx.merge(graphdef, nnx.state(model))


def test_registry_finds_ahat_and_round_trips_its_config():
  assert "ahat" in mixers.names()
  assert mixers.lookup("ahat") == (AHATConfig, AHATAttention)
  for cfg in (AHATConfig(), AHATConfig(beta=5.0, tol=1e-6, precision=None, short_conv=2)):
    assert mixers.MixerConfig.from_dict(cfg.to_dict()) == cfg
    layer = nnx.eval_shape(lambda cfg=cfg: mixers.build(cfg, d_model=16, n_heads=2, n_layers=2, dtype="float32",
                                                        rngs=nnx.Rngs(0)))
    assert isinstance(layer, AHATAttention)
    assert nnx.eval_shape(lambda m, x: m(x), layer, jnp.ones((2, 5, 16))).shape == (2, 5, 16)
  assert mixers.default_dict("ahat") == {"name": "ahat", "beta": None, "tol": 0.0, "precision": "highest",
                                         "short_conv": 0}
  assert mixers.MixerConfig.from_dict({"name": "ahat", "beta": 2.0}) == AHATConfig(beta=2.0)


@pytest.mark.parametrize("mixer", [AHATConfig(), AHATConfig(beta=5.0), AHATConfig(short_conv=2)])
def test_forward_pass_gives_finite_logits(mixer):
  model = _lm(mixer)
  assert isinstance(model.blocks.attn, AHATAttention)
  logits = forward(model, TOKENS)
  assert logits.shape == (2, 9, 256) and np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize("mixer", [AHATConfig(), AHATConfig(beta=5.0)])
def test_is_causal_exactly(mixer):
  model = _lm(mixer)
  base = np.asarray(forward(model, TOKENS))
  for t in (0, 4, 7):   # one compiled program on other inputs: earlier logits must be bit-identical
    changed = np.array(TOKENS)
    changed[:, t + 1:] = (changed[:, t + 1:] + 17) % 256
    out = np.asarray(forward(model, changed))
    np.testing.assert_array_equal(out[:, : t + 1], base[:, : t + 1])
    assert np.abs(out[:, t + 1:] - base[:, t + 1:]).max() > 0


def test_soft_mixer_approaches_hard_mixer_on_the_same_params():
  x = jax.random.normal(jax.random.key(1), (2, 9, 16))
  dims = dict(d_model=16, n_heads=2, n_layers=1, dtype="float32")
  hard = mixers.build(AHATConfig(), **dims, rngs=nnx.Rngs(2))
  want = np.asarray(forward(hard, x))
  errors = []
  for beta in (1.0, 100.0, 1e4):
    soft = mixers.build(AHATConfig(beta=beta), **dims, rngs=nnx.Rngs(3))
    nnx.update(soft, nnx.state(hard))
    errors.append(float(np.abs(np.asarray(forward(soft, x)) - want).max()))
  assert errors[0] > errors[1] >= errors[2], errors
  assert errors[0] > 1e-3 and errors[2] < 1e-5, errors
  # and the whole LM
  model = _lm(AHATConfig())
  soft_lm = _same_params(model, AHATConfig(beta=1e4))
  np.testing.assert_allclose(forward(soft_lm, TOKENS), forward(model, TOKENS), rtol=0, atol=1e-5)


def test_beta_one_over_root_head_dim_is_the_softmax_mixer():
  soft = _lm(SoftmaxConfig(precision="highest"))
  ahat = _same_params(soft, AHATConfig(beta=(16 // 2) ** -0.5))
  np.testing.assert_allclose(forward(ahat, TOKENS), forward(soft, TOKENS), rtol=1e-5, atol=1e-5)


def test_hard_mixer_has_zero_gradient_wrt_query_and_key_projections():
  model = _lm(AHATConfig())
  batch = {"inputs": TOKENS[:, :-1], "targets": TOKENS[:, 1:]}
  graphdef, params = nnx.split(model)
  grads = jax.jit(jax.grad(lambda p: lm_loss(nnx.merge(graphdef, p), batch)[0]))(params)
  g = np.asarray(grads["blocks"]["attn"]["qkv"]["kernel"][...])  # [layers, d_model, 3 * d_model]
  d = TINY["d_model"]
  assert np.all(g[..., : 2 * d] == 0.0)  # q and k columns: the argmax set does not move
  assert np.abs(g[..., 2 * d:]).sum() > 0  # v columns learn


def test_a_few_adam_steps_with_soft_beta_reduce_the_loss():
  model = _lm(AHATConfig(beta=5.0))   # adam_steps trains a copy of the parameters, not the model
  tokens = jax.random.randint(jax.random.key(3), (4, 12), 0, 32)
  losses, g0, graphdef, params = adam_steps(model, tokens, lr=1e-2, steps=8)
  g = np.asarray(g0["blocks"]["attn"]["qkv"]["kernel"][...])
  assert np.abs(g[..., : 2 * TINY["d_model"]]).sum() > 0  # the soft limit trains q/k too
  assert np.all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses
  # and the trained parameters evaluate hard
  hard = _same_params(nnx.merge(graphdef, params), dataclasses.replace(model.cfg.mixer, beta=None))
  assert np.isfinite(np.asarray(forward(hard, TOKENS))).all()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"beta": 0.0}, r"AHATConfig\.beta"),
        ({"beta": -1.0}, r"AHATConfig\.beta"),
        ({"beta": float("inf")}, r"AHATConfig\.beta"),
        ({"beta": float("nan")}, r"AHATConfig\.beta"),
        ({"beta": "5"}, r"AHATConfig\.beta"),
        ({"beta": True}, r"AHATConfig\.beta"),
        ({"tol": -1e-6}, r"AHATConfig\.tol"),
        ({"tol": float("nan")}, r"AHATConfig\.tol"),
        ({"tol": None}, r"AHATConfig\.tol"),
        ({"precision": "fp8"}, r"AHATConfig\.precision"),
        ({"precision": 3}, r"AHATConfig\.precision"),
        ({"short_conv": -1}, r"AHATConfig\.short_conv"),
        ({"short_conv": 1.5}, r"AHATConfig\.short_conv"),
    ],
)
def test_bad_config_values_raise_value_error_naming_the_field(kwargs, match):
  with pytest.raises(ValueError, match=match):
    AHATConfig(**kwargs)
