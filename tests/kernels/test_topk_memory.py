"""The dense append-only top-K memory (UniMatrix-Assoc) against a per-token float64 numpy loop.

Proven: values against the loop (T = 1, fewer entries than K, more entries than K), the first read
is zero; gradients finite, causal (a read depends on earlier keys and values only) and exactly zero
for the empty first read; bad arguments raise. Module-level jits: each shape compiles once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.topk_memory import topk_memory_read

read = jax.jit(topk_memory_read, static_argnames=("top_k", "temperature"))


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
  r = np.random.default_rng(T)
  q, k = (r.normal(size=(B, T, H, D)).astype(np.float32) for _ in range(2))
  v = r.normal(size=(B, T, H, Dv)).astype(np.float32)
  o = read(q, k, v, top_k=K, temperature=8.0)
  np.testing.assert_allclose(np.asarray(o), numpy_loop(q, k, v, K, 8.0), rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(o[:, 0]) == 0)   # nothing written before the first read


@jax.jit
def causal_grads(q, k, v):
  """Gradients of Σ o[:, 4]² (top_k = 3) w.r.t. q, k, v, and of Σ o[:, 0] (the empty read) w.r.t. q."""
  f = lambda q, k, v: jnp.sum(topk_memory_read(q, k, v, top_k=3)[:, 4] ** 2)
  g0 = jax.grad(lambda q: jnp.sum(topk_memory_read(q, k, v)[:, 0]))(q)
  return jax.grad(f, argnums=(0, 1, 2))(q, k, v), g0


def test_gradients_are_finite_and_causal():
  r = np.random.default_rng(0)
  q, k = (r.normal(size=(2, 9, 2, 4)).astype(np.float32) for _ in range(2))
  v = r.normal(size=(2, 9, 2, 3)).astype(np.float32)
  t = 4
  (gq, gk, gv), g0 = (jax.tree.map(np.asarray, g) for g in causal_grads(q, k, v))
  for g in (gq, gk, gv):
    assert np.all(np.isfinite(g))
  assert np.abs(gk[:, t:]).max() == 0 and np.abs(gv[:, t:]).max() == 0  # j < t only
  assert np.abs(gq[:, t + 1:]).max() == 0 and np.abs(gv[:, :t]).max() > 0
  # empty read (t = 0): exactly zero gradient, no NaN
  assert np.abs(g0).max() == 0


def test_bad_arguments():
  x = np.zeros((1, 3, 2, 4), np.float32)
  with pytest.raises(ValueError, match="top_k"):
    topk_memory_read(x, x, x, top_k=0)
  with pytest.raises(ValueError, match="temperature"):
    topk_memory_read(x, x, x, temperature=-1.0)
  with pytest.raises(ValueError, match="key widths"):
    topk_memory_read(x, np.zeros((1, 3, 2, 5), np.float32), x)
  with pytest.raises(ValueError, match="q"):
    topk_memory_read(np.zeros((3, 2, 4), np.float32), x, x)
