"""softmax_attention vs an independent numpy loop and jax.nn.dot_product_attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxmem.kernels.attention import softmax_attention


def numpy_attention(q, k, v, causal, scale=None):
  """Plain per-(batch, head, query) loop, float64: the paper's equation, nothing shared."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  B, T, H, D = q.shape
  S, E = k.shape[1], v.shape[-1]
  scale = D ** -0.5 if scale is None else scale
  out = np.zeros((B, T, H, E))
  for b in range(B):
    for h in range(H):
      for t in range(T):
        n = t + 1 if causal else S
        logits = np.array([scale * q[b, t, h] @ k[b, s, h] for s in range(n)])
        w = np.exp(logits - logits.max())
        w /= w.sum()
        out[b, t, h] = sum(w[s] * v[b, s, h] for s in range(n))
  return out


def rand(key, shape, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(key), shape, dtype)


@pytest.mark.parametrize("B,T,H,D,E", [(2, 7, 3, 5, 5), (1, 13, 2, 9, 4), (3, 1, 1, 3, 6)])
def test_causal_matches_numpy_loop(B, T, H, D, E):
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  out = softmax_attention(q, k, v, causal=True)
  assert out.shape == (B, T, H, E) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, numpy_attention(q, k, v, True), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("T,S", [(5, 11), (9, 3), (4, 4)])
def test_cross_attention_matches_numpy_loop(T, S):
  q, k, v = rand(0, (2, T, 3, 7)), rand(1, (2, S, 3, 7)), rand(2, (2, S, 3, 5))
  out = softmax_attention(q, k, v, causal=False)
  np.testing.assert_allclose(out, numpy_attention(q, k, v, False), rtol=2e-5, atol=2e-6)


def test_custom_scale_matches_numpy_loop():
  q, k, v = rand(0, (1, 6, 2, 5)), rand(1, (1, 6, 2, 5)), rand(2, (1, 6, 2, 5))
  out = softmax_attention(q, k, v, causal=True, scale=0.37)
  np.testing.assert_allclose(out, numpy_attention(q, k, v, True, 0.37), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("causal,T,S", [(True, 11, 11), (False, 7, 10)])
def test_values_and_gradients_match_jax_nn(causal, T, S):
  B, H, D = 2, 3, 9
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, S, H, D)), rand(2, (B, S, H, D))
  cot = rand(3, (B, T, H, D))
  ours = lambda q, k, v: jnp.sum(softmax_attention(q, k, v, causal=causal) * cot)
  ref = lambda q, k, v: jnp.sum(jax.nn.dot_product_attention(q, k, v, is_causal=causal) * cot)
  np.testing.assert_allclose(ours(q, k, v), ref(q, k, v), rtol=1e-5)
  g_ours = jax.grad(ours, argnums=(0, 1, 2))(q, k, v)
  g_ref = jax.grad(ref, argnums=(0, 1, 2))(q, k, v)
  for name, a, b in zip("qkv", g_ours, g_ref, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")


def test_gradients_match_finite_differences_float64():
  with jax.enable_x64(True):
    q = rand(0, (1, 5, 2, 3), jnp.float64)
    k = rand(1, (1, 5, 2, 3), jnp.float64)
    v = rand(2, (1, 5, 2, 4), jnp.float64)
    check_grads(
        lambda q, k, v: softmax_attention(q, k, v, causal=True), (q, k, v), order=2,
        modes=("rev",), eps=1e-4,
    )


def test_causal_output_ignores_future_keys_and_values():
  q, k, v = rand(0, (1, 8, 2, 4)), rand(1, (1, 8, 2, 4)), rand(2, (1, 8, 2, 4))
  k2 = k.at[:, 5:].set(100.0)
  v2 = v.at[:, 5:].set(-50.0)
  a = softmax_attention(q, k, v, causal=True)
  b = softmax_attention(q, k2, v2, causal=True)
  np.testing.assert_array_equal(a[:, :5], b[:, :5])
  assert not np.allclose(a[:, 5:], b[:, 5:])


def test_bfloat16_inputs_give_bfloat16_close_to_float32():
  q, k, v = rand(0, (2, 9, 2, 8)), rand(1, (2, 9, 2, 8)), rand(2, (2, 9, 2, 8))
  out16 = softmax_attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)))
  assert out16.dtype == jnp.bfloat16
  np.testing.assert_allclose(out16.astype(jnp.float32), softmax_attention(q, k, v), atol=5e-2)


def test_jit_and_large_logits_stay_finite():
  q = rand(0, (1, 16, 1, 4)) * 1e4
  out = jax.jit(softmax_attention)(q, q, q)
  assert np.isfinite(np.asarray(out)).all()


@pytest.mark.parametrize(
    "shapes,kwargs,match",
    [
        (((2, 5, 4), (2, 5, 4), (2, 5, 4)), {}, r"`q` must have rank 4"),
        (((1, 5, 2, 4), (1, 5, 4), (1, 5, 2, 4)), {}, r"`k` must have rank 4"),
        (((1, 5, 2, 4), (1, 5, 3, 4), (1, 5, 3, 4)), {}, r"numbers of heads: q=2, k=3, v=3"),
        (((1, 5, 2, 4), (1, 5, 2, 6), (1, 5, 2, 4)), {}, r"key widths: q=4, k=6"),
        (((2, 5, 2, 4), (1, 5, 2, 4), (1, 5, 2, 4)), {}, r"batch sizes"),
        (((1, 5, 2, 4), (1, 5, 2, 4), (1, 6, 2, 4)), {}, r"key/value lengths: k=5, v=6"),
        (((1, 5, 2, 4), (1, 7, 2, 4), (1, 7, 2, 4)), {}, r"causal attention needs equal"),
        (((1, 5, 2, 4), (1, 5, 2, 4), (1, 5, 2, 4)), {"scale": float("nan")}, r"`scale`"),
    ],
)
def test_bad_input_raises_value_error_naming_the_problem(shapes, kwargs, match):
  q, k, v = (jnp.zeros(s) for s in shapes)
  with pytest.raises(ValueError, match=match):
    softmax_attention(q, k, v, **kwargs)
