"""DNC module: the scanned model equals a step-by-step loop over the kernel; stable; errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.kernels import dnc as K
from jaxmem.models import DNC, DNCConfig

CFG = DNCConfig(input_dim=6, output_dim=5, memory_size=9, word_size=7, num_reads=2, hidden_size=11)


def manual_forward(m: DNC, x):
  """Python loop over time, LSTM written out, kernel step per example."""
  cfg = m.cfg
  B, T, _ = x.shape
  h = c = jnp.zeros((B, cfg.hidden_size))
  reads = jnp.zeros((B, cfg.num_reads * cfg.word_size))
  mems = [K.init(cfg.memory_size, cfg.word_size, cfg.num_reads) for _ in range(B)]
  ys = []
  Wc, bc = m.cell.kernel[...], m.cell.bias[...]
  Wi, bi = m.interface.kernel[...], m.interface.bias[...]
  Wy, by = m.readout.kernel[...], m.readout.bias[...]
  for t in range(T):
    z = jnp.concatenate([x[:, t], reads, h], -1) @ Wc + bc[None]
    i, f, g, o = jnp.split(z, 4, -1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    out = jnp.clip(h, -cfg.clip_value, cfg.clip_value)
    xi = jnp.clip(out @ Wi + bi[None], -cfg.clip_value, cfg.clip_value)
    rs = []
    for b in range(B):
      mems[b], r = K.step(mems[b], K.parse_interface(xi[b], cfg.word_size, cfg.num_reads))
      rs.append(r.reshape(-1))
    reads = jnp.stack(rs)
    ys.append(jnp.concatenate([out, reads], -1) @ Wy + by[None])
  return jnp.stack(ys, 1)


def test_scanned_model_equals_manual_loop():
  m = DNC(CFG, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (3, 7, 6))
  np.testing.assert_allclose(m(x), manual_forward(m, x), rtol=1e-4, atol=1e-5)


def test_remat_does_not_change_values_or_gradients():
  import dataclasses
  x = jax.random.normal(jax.random.key(2), (2, 9, 6))
  a = DNC(CFG, rngs=nnx.Rngs(0))
  b = DNC(dataclasses.replace(CFG, remat=False), rngs=nnx.Rngs(0))
  ga = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(a)
  gb = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(b)
  for u, v in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
    np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-6)


def test_feedforward_controller_and_finite_gradients_on_long_input():
  import dataclasses
  m = DNC(dataclasses.replace(CFG, controller="feedforward"), rngs=nnx.Rngs(0))
  x = 5.0 * jax.random.normal(jax.random.key(3), (2, 200, 6))
  y, state = m(x, return_state=True)
  assert y.shape == (2, 200, 5) and state.link.shape == (2, 9, 9)
  g = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(m)
  assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(g))


def test_bad_config_and_input_raise():
  with pytest.raises(ValueError, match="controller"):
    DNCConfig(controller="gru")
  with pytest.raises(ValueError, match="memory_size"):
    DNCConfig(memory_size=0)
  m = DNC(CFG, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="input_dim=6"):
    m(jnp.zeros((1, 3, 4)))
  with pytest.raises(ValueError, match="rank 3"):
    m(jnp.zeros((3, 6)))
