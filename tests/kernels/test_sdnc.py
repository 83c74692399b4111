"""The theorem as a test: causal attention == the read of a write-once (stateless) DNC memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.attention import softmax_attention
from jaxmem.kernels.sdnc import sdnc_attention, sdnc_cross_attention


def rand(key, shape):
  return jax.random.normal(jax.random.key(key), shape)


@pytest.mark.parametrize("B,T,H,D,E", [(2, 7, 3, 5, 5), (1, 13, 4, 6, 9), (1, 1, 2, 3, 3)])
def test_attention_is_sdnc_read_values_and_gradients(B, T, H, D, E):
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  cot = rand(3, (B, T, H, E))
  f_sdnc = lambda q, k, v: jnp.sum(sdnc_attention(q, k, v) * cot)
  f_attn = lambda q, k, v: jnp.sum(softmax_attention(q, k, v, causal=True) * cot)
  np.testing.assert_allclose(sdnc_attention(q, k, v), softmax_attention(q, k, v), rtol=1e-5, atol=1e-6)
  g_s = jax.grad(f_sdnc, argnums=(0, 1, 2))(q, k, v)
  g_a = jax.grad(f_attn, argnums=(0, 1, 2))(q, k, v)
  for name, a, b in zip("qkv", g_s, g_a, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")


def test_read_weights_are_attention_weights_and_ignore_unwritten_slots():
  q, k, v = rand(0, (1, 6, 2, 4)), rand(1, (1, 6, 2, 4)), rand(2, (1, 6, 2, 4))
  _, w = sdnc_attention(q, k, v, scale=0.7, return_weights=True)  # [B, H, T, T]
  logits = jnp.einsum("bthd,bshd->bhts", q, k) * 0.7
  mask = jnp.tril(jnp.ones((6, 6), bool))
  ref = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)
  np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-7)
  assert np.all(np.asarray(w)[..., ~np.asarray(mask)] == 0.0)


@pytest.mark.parametrize("T,S", [(5, 9), (8, 3)])
def test_cross_attention_is_a_fixed_encoder_memory(T, S):
  q, k, v = rand(0, (2, T, 3, 6)), rand(1, (2, S, 3, 6)), rand(2, (2, S, 3, 4))
  cot = rand(3, (2, T, 3, 4))
  np.testing.assert_allclose(sdnc_cross_attention(q, k, v),
                             softmax_attention(q, k, v, causal=False), rtol=1e-5, atol=1e-6)
  g1 = jax.grad(lambda q, k, v: jnp.sum(sdnc_cross_attention(q, k, v) * cot), (0, 1, 2))(q, k, v)
  g2 = jax.grad(lambda q, k, v: jnp.sum(softmax_attention(q, k, v, causal=False) * cot),
                (0, 1, 2))(q, k, v)
  for a, b in zip(g1, g2, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_bad_input_raises():
  x = jnp.zeros((1, 5, 2, 4))
  with pytest.raises(ValueError, match="writes one slot per query"):
    sdnc_attention(x, jnp.zeros((1, 6, 2, 4)), jnp.zeros((1, 6, 2, 4)))
  with pytest.raises(ValueError, match="read heads"):
    sdnc_attention(x, jnp.zeros((1, 5, 3, 4)), jnp.zeros((1, 5, 3, 4)))
  with pytest.raises(ValueError, match="`q` must have rank 4"):
    sdnc_cross_attention(x[0], x, x)
