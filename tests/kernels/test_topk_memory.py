"""The dense append-only top-K memory (UniMatrix-Assoc) against a per-token numpy loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.topk_memory import topk_memory_read


def numpy_loop(q, k, v, top_k, tau):
  """Per read ``t``: cosine to every ``j < t``, keep the ``top_k`` largest, softmax(τ·s) over them."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  B, T, H, _ = q.shape
  out = np.zeros(v.shape)
  unit = lambda x: x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
  for b in range(B):
    for h in range(H):
      for t in range(1, T):
        s = np.array([unit(q[b, t, h]) @ unit(k[b, j, h]) for j in range(t)])
        keep = np.argsort(-s, kind="stable")[:top_k]
        w = np.exp(tau * (s[keep] - s[keep].max()))
        w /= w.sum()
        out[b, t, h] = (w[:, None] * v[b, keep, h]).sum(0)
  return out


@pytest.mark.parametrize("B, T, H, D, Dv, K", [(1, 1, 1, 3, 2, 8), (2, 7, 3, 5, 4, 2), (1, 13, 2, 4, 3, 8)])
def test_matches_numpy_loop(B, T, H, D, Dv, K):
  ks = jax.random.split(jax.random.key(T), 3)
  q, k = (jax.random.normal(kk, (B, T, H, D)) for kk in ks[:2])
  v = jax.random.normal(ks[2], (B, T, H, Dv))
  o = jax.jit(topk_memory_read, static_argnames=("top_k", "temperature"))(q, k, v, top_k=K, temperature=8.0)
  np.testing.assert_allclose(np.asarray(o), numpy_loop(q, k, v, K, 8.0), rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(o[:, 0]) == 0)   # nothing written before the first read


def test_gradients_are_finite_and_causal():
  ks = jax.random.split(jax.random.key(0), 3)
  q, k = (jax.random.normal(kk, (2, 9, 2, 4)) for kk in ks[:2])
  v = jax.random.normal(ks[2], (2, 9, 2, 3))
  t = 4

  def f(q, k, v):
    return jnp.sum(topk_memory_read(q, k, v, top_k=3)[:, t] ** 2)

  gq, gk, gv = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)
  for g in (gq, gk, gv):
    assert bool(jnp.all(jnp.isfinite(g)))
  assert float(jnp.abs(gk[:, t:]).max()) == 0 and float(jnp.abs(gv[:, t:]).max()) == 0  # j < t only
  assert float(jnp.abs(gq[:, t + 1:]).max()) == 0 and float(jnp.abs(gv[:, :t]).max()) > 0
  # empty read (t = 0): exactly zero gradient, no NaN
  g0 = jax.jit(jax.grad(lambda q: jnp.sum(topk_memory_read(q, k, v)[:, 0])))(q)
  assert float(jnp.abs(g0).max()) == 0


def test_bad_arguments():
  x = jnp.zeros((1, 3, 2, 4))
  with pytest.raises(ValueError, match="top_k"):
    topk_memory_read(x, x, x, top_k=0)
  with pytest.raises(ValueError, match="temperature"):
    topk_memory_read(x, x, x, temperature=-1.0)
  with pytest.raises(ValueError, match="key widths"):
    topk_memory_read(x, jnp.zeros((1, 3, 2, 5)), x)
  with pytest.raises(ValueError, match="q"):
    topk_memory_read(jnp.zeros((3, 2, 4)), x, x)
