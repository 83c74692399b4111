"""DNC module: the scanned model equals a step-by-step loop over the kernel (LSTM written out, one kernel step
per example); remat changes neither values nor gradients; the feed-forward controller on long input stays
finite; errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.kernels import dnc as K
from jaxmem.models import DNC, DNCConfig

CFG = DNCConfig(input_dim=6, output_dim=5, memory_size=9, word_size=7, num_reads=2, hidden_size=11)
X = jax.random.normal(jax.random.key(1), (3, 7, 6))   # the one input shape of the LSTM model's tests

# the reference's pieces, each compiled once and called per time step (and per example for the kernel)
_kernel_step = jax.jit(K.step)
_parse = jax.jit(K.parse_interface, static_argnums=(1, 2))


@jax.jit
def _lstm_and_interface(Wc, bc, Wi, bi, x_t, reads, h, c, clip):
  z = jnp.concatenate([x_t, reads, h], -1) @ Wc + bc[None]
  i, f, g, o = jnp.split(z, 4, -1)
  c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
  h = jax.nn.sigmoid(o) * jnp.tanh(c)
  out = jnp.clip(h, -clip, clip)
  return h, c, out, jnp.clip(out @ Wi + bi[None], -clip, clip)


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
  Wy, by = np.asarray(m.readout.kernel[...], np.float64), np.asarray(m.readout.bias[...], np.float64)
  for t in range(T):
    h, c, out, xi = _lstm_and_interface(Wc, bc, Wi, bi, x[:, t], reads, h, c, cfg.clip_value)
    rs = []
    for b in range(B):
      mems[b], r = _kernel_step(mems[b], _parse(xi[b], cfg.word_size, cfg.num_reads))
      rs.append(r.reshape(-1))
    reads = jnp.stack(rs)
    ys.append(np.concatenate([np.asarray(out, np.float64), np.asarray(reads, np.float64)], -1) @ Wy + by[None])
  return np.stack(ys, 1)


@nnx.jit
def _outputs_and_grads(m, x):
  """``y = m(x)`` and the gradient of ``Σ y²`` w.r.t. every parameter: one compiled program."""
  def loss(m):
    y = m(x)
    return jnp.sum(y ** 2), y
  (_, y), g = nnx.value_and_grad(loss, has_aux=True)(m)
  return y, g


@pytest.fixture(scope="module")
def dnc():
  return DNC(CFG, rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_scanned_model_equals_manual_loop(dnc):
  y, _ = _outputs_and_grads(dnc, X)
  np.testing.assert_allclose(y, manual_forward(dnc, X), rtol=1e-4, atol=1e-5)


def test_remat_does_not_change_values_or_gradients(dnc):
  assert dnc.cfg.remat
  plain = DNC(dataclasses.replace(CFG, remat=False), rngs=nnx.Rngs(0))
  (ya, ga), (yb, gb) = _outputs_and_grads(dnc, X), _outputs_and_grads(plain, X)
  np.testing.assert_allclose(ya, yb, rtol=1e-4, atol=1e-6)
  for u, v in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
    np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-6)


@nnx.jit
def _feedforward_run(m, x):
  y, state = m(x, return_state=True)
  return y, state, nnx.grad(lambda m: jnp.mean(m(x) ** 2))(m)


def test_feedforward_controller_and_finite_gradients_on_long_input():
  m = DNC(dataclasses.replace(CFG, controller="feedforward"), rngs=nnx.Rngs(0))
  x = 5.0 * jax.random.normal(jax.random.key(3), (2, 200, 6))
  y, state, g = _feedforward_run(m, x)
  assert y.shape == (2, 200, 5) and state.link.shape == (2, 9, 9)
  assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(g))


def test_packed_rows_equal_each_document_alone(dnc):
  # DNC(x, segment_ids): controller, memory and reads start afresh at every document, padding changes nothing
  # and outputs 0; outputs and input gradients equal each document run alone (tests/kernels/packed.py)
  from tests.kernels.packed import check_packed_equals_alone
  x = np.asarray(jax.random.normal(jax.random.key(4), (2, 9, CFG.input_dim)))
  f = lambda x, segment_ids=None: nnx.merge(*nnx.split(dnc))(x, segment_ids=segment_ids)
  check_packed_equals_alone(f, (x,), rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match=r"`segment_ids` must have shape \[B, T\] = \(2, 9\)"):
    dnc(x, segment_ids=np.ones((2, 3), np.int32))


def test_bad_config_and_input_raise(dnc):
  with pytest.raises(ValueError, match="controller"):
    DNCConfig(controller="gru")
  with pytest.raises(ValueError, match="memory_size"):
    DNCConfig(memory_size=0)
  with pytest.raises(ValueError, match="input_dim=6"):
    dnc(jnp.zeros((1, 3, 4)))
  with pytest.raises(ValueError, match="rank 3"):
    dnc(jnp.zeros((3, 6)))
