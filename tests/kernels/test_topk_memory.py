"""The dense append-only top-K memory (UniMatrix-Assoc) against a per-token float64 numpy loop.

Proven: values against the loop (T = 1, fewer entries than K, more entries than K), the first read
is zero; gradients finite, causal (a read depends on earlier keys and values only) and exactly zero
for the empty first read; bad arguments raise. Module-level jits: each shape compiles once.

KV cache (``q_offset``): on a longer cache with rows at different positions (fewer entries than K, more, and
past the end), reads match the loop over each row's entries before the query; a row's reads and gradients
equal the sequence form's on that row's own sequence (the cache's unwritten tail ignored); an empty read is
zero with zero, finite gradients.

Packed sequences (``segment_ids``): a packed batch equals each segment read alone, values and gradients;
padding reads 0 with zero gradients; bad ids (and ids with ``q_offset``) raise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.topk_memory import topk_memory_read
from tests.kernels.test_sdnc import SEGMENTS, per_segment

read = jax.jit(topk_memory_read, static_argnames=("top_k", "temperature"))


def numpy_loop(q, k, v, top_k, tau, q_offset=None):
  """Per read ``t``: cosine to every ``j < t``, keep the ``top_k`` largest, softmax(τ·s) over them. With
  ``q_offset``, ``k, v`` are a cache and read ``t`` of row ``b`` sees ``j < q_offset[b] + t`` (all past it)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  B, T, H, _ = q.shape
  out = np.zeros(q.shape[:3] + v.shape[3:])
  unit = lambda x: x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
  for b in range(B):
    for h in range(H):
      for t in range(T):
        n = t if q_offset is None else min(int(q_offset[b]) + t, k.shape[1])
        if n <= 0:
          continue
        s = np.array([unit(q[b, t, h]) @ unit(k[b, j, h]) for j in range(n)])
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


# --- KV cache: q_offset ----------------------------------------------------------------------------------

CT, CS, CK = 4, 11, 3
OFFSETS = np.array([0, 2, 5, 9], np.int32)   # empty and fewer than K entries, more than K, past the end


@jax.jit
def cached_and_sequence(q, k, v, cot):
  """The cached read (q_offset=OFFSETS) with its (q, k, v)-cotangents of ⟨o, cot⟩, and per row the sequence
  form on the row's own ``offset + T`` tokens (``q`` padded in front), its last ``T`` reads and cotangents."""
  def cached(q, k, v):
    return topk_memory_read(q, k, v, top_k=CK, q_offset=OFFSETS)
  o, pullback = jax.vjp(cached, q, k, v)
  rows = []
  for b, n in enumerate(OFFSETS.tolist()):
    def seq(q_b, k_b, v_b, n=n):
      qs = jnp.concatenate([jnp.ones((1, n) + q_b.shape[2:]), q_b], axis=1)
      return topk_memory_read(qs, k_b[:, :n + CT], v_b[:, :n + CT], top_k=CK)[:, n:]
    if n + CT > CS:
      rows.append(None)
      continue
    o_b, pull_b = jax.vjp(seq, q[b:b + 1], k[b:b + 1], v[b:b + 1])
    rows.append((o_b, pull_b(cot[b:b + 1])))
  return o, pullback(cot), rows


def test_q_offset_matches_loop_and_each_rows_sequence_values_and_gradients():
  r = np.random.default_rng(5)
  B = len(OFFSETS)
  q = r.normal(size=(B, CT, 2, 5)).astype(np.float32)
  k = r.normal(size=(B, CS, 2, 5)).astype(np.float32)
  v = r.normal(size=(B, CS, 2, 3)).astype(np.float32)
  cot = r.normal(size=(B, CT, 2, 3)).astype(np.float32)
  o, (gq, gk, gv), rows = jax.tree.map(np.asarray, cached_and_sequence(q, k, v, cot))
  np.testing.assert_allclose(o, numpy_loop(q, k, v, CK, 8.0, OFFSETS), rtol=1e-5, atol=1e-6)
  assert np.all(o[0, 0] == 0) and np.all(gq[0, 0] == 0)   # nothing written before: zero, no NaN
  for g in (gq, gk, gv):
    assert np.isfinite(g).all()
  for b, row in enumerate(rows):
    if row is None:
      continue
    o_b, (gq_b, gk_b, gv_b) = row
    n = OFFSETS[b]
    np.testing.assert_allclose(o[b:b + 1], o_b, rtol=1e-5, atol=1e-6, err_msg=f"row {b}")
    np.testing.assert_allclose(gq[b:b + 1], gq_b, rtol=1e-4, atol=1e-5, err_msg=f"row {b}")
    np.testing.assert_allclose(gk[b:b + 1], gk_b, rtol=1e-4, atol=1e-5, err_msg=f"row {b}")
    np.testing.assert_allclose(gv[b:b + 1], gv_b, rtol=1e-4, atol=1e-5, err_msg=f"row {b}")
    # the entries at or after the last query's position are never read
    assert np.all(gk[b, n + CT - 1:] == 0) and np.all(gv[b, n + CT - 1:] == 0)


def test_q_offset_bad_arguments():
  q, k = np.zeros((2, 3, 2, 4), np.float32), np.zeros((2, 7, 2, 4), np.float32)
  with pytest.raises(ValueError, match="lengths"):
    topk_memory_read(q, k, k)   # a longer memory needs q_offset
  with pytest.raises(ValueError, match="key/value lengths"):
    topk_memory_read(q, k, k[:, :5], q_offset=np.zeros(2, np.int32))
  with pytest.raises(ValueError, match="must hold integers"):
    topk_memory_read(q, k, k, q_offset=np.zeros(2, np.float32))


# --- packed sequences: segment_ids ----------------------------------------------------------------------


@jax.jit
def packed_and_alone(q, k, v, cot):
  """Values and (q, k, v)-cotangents of the packed read (top_k = 3) and of each segment read alone."""
  read3 = lambda q, k, v, **kw: topk_memory_read(q, k, v, top_k=3, **kw)
  vjp = lambda f: (lambda o_pull: (o_pull[0], o_pull[1](cot)))(jax.vjp(f, q, k, v))
  return (vjp(lambda q, k, v: read3(q, k, v, segment_ids=SEGMENTS)),
          vjp(lambda *xs: per_segment(read3, *xs)))


def test_packed_sequences_equal_each_segment_alone():
  # a read keeps the top 3 of its own segment's earlier entries: a segment's first token reads 0, padding
  # reads 0 and is nobody's candidate (zero gradient)
  r = np.random.default_rng(7)
  B, T = SEGMENTS.shape
  q, k = (r.normal(size=(B, T, 2, 5)).astype(np.float32) for _ in range(2))
  v, cot = (r.normal(size=(B, T, 2, 3)).astype(np.float32) for _ in range(2))
  (o, g), (o_ref, g_ref) = jax.tree.map(np.asarray, packed_and_alone(q, k, v, cot))
  np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-6)
  assert not np.any(o[SEGMENTS == 0]), "padding reads 0"
  for name, a, b in zip("qkv", g, g_ref, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")
    assert not np.any(a[SEGMENTS == 0]), f"padding: zero gradient d/d{name}"


def test_bad_segment_ids():
  x = np.zeros(SEGMENTS.shape + (2, 4), np.float32)
  for bad in (SEGMENTS.astype(np.float32), SEGMENTS[:, :-1]):
    with pytest.raises(ValueError, match="segment_ids"):
      topk_memory_read(x, x, x, segment_ids=bad)
  with pytest.raises(ValueError, match="segment_ids"):   # the cached form takes none
    topk_memory_read(x, x, x, q_offset=np.zeros(2, np.int32), segment_ids=SEGMENTS)
