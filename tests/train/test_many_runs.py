"""The vmapped many-runs trainer (:mod:`jaxmem.train.many_runs`): stacked runs train exactly as they would
alone, the loss falls, and repeated calls with the same static objects compile once."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxmem.train import many_runs

D, B = 3, 16


def regression_loss(params, scale, x_BD, y_B):
  """One run: least squares of a linear model; ``scale`` is a per-run constant (not trained)."""
  err = x_BD @ params["w"] + params["b"] - scale * y_B
  return 0.5 * jnp.mean(err ** 2), jnp.mean(jnp.abs(err))


def regression_batch(key, seeds_R, w_true_RD):
  """Run r's batch depends only on (key, its seed, its true weights): the same whether run alone or stacked."""
  def one(seed, w):
    x = jax.random.normal(jax.random.fold_in(key, seed), (B, D))
    return x, x @ w
  return jax.vmap(one)(seeds_R, w_true_RD)


def init(seed):
  return {"w": jax.random.normal(jax.random.key(seed), (D,)), "b": jnp.zeros(())}


LOSS = regression_loss
SAMPLE = regression_batch
OPT = optax.adam(0.05)


def train(seeds, steps=40, loss_fn=LOSS):
  params = many_runs.stack([init(s) for s in seeds])
  scale = jnp.asarray([1.0 + s for s in seeds])
  w_true = jnp.stack([jnp.arange(D, dtype=jnp.float32) * (s + 1) for s in seeds])
  return many_runs.train(params, OPT.init(params), scale, (jnp.asarray(seeds), w_true), jax.random.key(7),
                         loss_fn=loss_fn, sample_fn=SAMPLE, optimizer=OPT, n_steps=steps)


def test_stacked_runs_train_as_they_would_alone():
  params, _, losses = train([0, 1, 2])
  assert losses.shape == (40, 3)
  for r, seed in enumerate([0, 1, 2]):
    p1, _, l1 = train([seed])
    np.testing.assert_allclose(np.asarray(losses[:, r]), np.asarray(l1[:, 0]), rtol=1e-5, atol=1e-7)
    for name in ("w", "b"):
      np.testing.assert_allclose(np.asarray(params[name][r]), np.asarray(p1[name][0]), rtol=1e-5, atol=1e-6)


def test_loss_falls_and_losses_are_before_each_update():
  params0 = many_runs.stack([init(s) for s in (0, 1)])
  params, _, losses = train([0, 1], steps=200)
  losses = np.asarray(losses)
  assert np.all(losses[-10:].mean(0) < 0.05 * losses[:10].mean(0)), losses[[0, -1]]
  # the first recorded loss is that of the initial parameters on the first step's batch
  scale = jnp.asarray([1.0, 2.0])
  w_true = jnp.stack([jnp.arange(D, dtype=jnp.float32) * (s + 1) for s in (0, 1)])
  batch = SAMPLE(jax.random.split(jax.random.key(7), 200)[0], jnp.asarray([0, 1]), w_true)
  first, _ = many_runs.run_losses(LOSS, params0, scale, batch)
  np.testing.assert_allclose(losses[0], np.asarray(first), rtol=1e-6)


def test_same_static_objects_compile_once():
  before = many_runs.train._cache_size()
  train([3, 4], steps=5)
  after_one = many_runs.train._cache_size()
  train([3, 4], steps=5)
  assert many_runs.train._cache_size() == after_one == before + 1
  # a new partial object is a new static argument: the same call compiles again (documented in the module)
  train([3, 4], steps=5, loss_fn=functools.partial(regression_loss))
  assert many_runs.train._cache_size() == after_one + 1
