"""attention_layer / encoder_layer (the simulated layers) against plain float64 numpy loops."""

import jax
import numpy as np
import pytest

from jaxmem.simulator import AttentionParams, EncoderParams, attention_layer, encoder_layer


def loop_attention(params, X):
  """Per-(head, query, key) loop in float64: the equation of Theorem 6, nothing shared."""
  wq, wk, wv, wo = (np.asarray(w, np.float64) for w in params)
  X = np.asarray(X, np.float64)
  H, D, Dh = wq.shape
  n = X.shape[0]
  out = np.zeros((n, D))
  for h in range(H):
    q = [X[i] @ wq[h] for i in range(n)]
    k = [X[j] @ wk[h] for j in range(n)]
    v = [X[j] @ wv[h] for j in range(n)]
    for i in range(n):
      logits = [sum(q[i][e] * k[j][e] for e in range(Dh)) / np.sqrt(Dh) for j in range(n)]
      m = max(logits)
      w = [np.exp(s - m) for s in logits]
      z = sum(w)
      mixed = sum((w[j] / z) * v[j] for j in range(n))
      out[i] += mixed @ wo[h]
  return out


def loop_encoder(params, X):
  X = np.asarray(X, np.float64)
  Y = X + loop_attention(params.att, X)
  w1, b1, w2, b2 = (np.asarray(a, np.float64) for a in params[1:])
  out = np.zeros_like(Y)
  for i in range(Y.shape[0]):
    hidden = np.array([max(0.0, Y[i] @ w1[:, f] + b1[f]) for f in range(w1.shape[1])])
    out[i] = Y[i] + hidden @ w2 + b2
  return out


def rand_params(rng, H, D, Dh, scale=1.0):
  g = lambda *s: rng.standard_normal(s).astype(np.float32) / np.sqrt(D)
  return AttentionParams(g(H, D, Dh) * scale, g(H, D, Dh) * scale, g(H, D, Dh), g(H, Dh, D))


@pytest.mark.parametrize("H,D,Dh,n", [(1, 5, 3, 4), (2, 5, 4, 7), (3, 4, 2, 1), (2, 3, 5, 6)])
def test_attention_layer_matches_float64_loop(H, D, Dh, n):
  rng = np.random.default_rng(H * 100 + n)
  params = rand_params(rng, H, D, Dh)
  X = rng.standard_normal((n, D)).astype(np.float32)
  ref = loop_attention(params, X)
  out = np.asarray(attention_layer(params, X))
  assert out.shape == (n, D) and out.dtype == np.float32
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


def test_attention_layer_saturating_scores_match_loop():
  rng = np.random.default_rng(7)
  params = rand_params(rng, 2, 5, 4, scale=20.0)
  X = rng.standard_normal((6, 5)).astype(np.float32)
  ref = loop_attention(params, X)
  np.testing.assert_allclose(attention_layer(params, X), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("H,D,Dh,n", [(2, 3, 2, 4), (1, 5, 3, 7)])
def test_attention_layer_under_jit_is_finite_at_logits_of_1e10(H, D, Dh, n):
  """Logits of ~1e10: XLA fused the 1/√D_h scaling into `s − max(s)` and contracted it to an fma, whose
  unrounded product minus the rounded maximum is up to half an ulp of the logit (±512 at 1e10), so under
  `jax.jit` exp overflowed and the layer returned NaN where op-by-op execution did not (review of issue 37).
  The row max is now subtracted from the raw products. With the top two logits of every row more than 1e6
  apart the softmax is one-hot in float64 and float32 alike, so the output is one value row through `wo`,
  held to the same bound as the unsaturated case."""
  rng = np.random.default_rng(11 * n)
  params = rand_params(rng, H, D, Dh, scale=1e5)
  X = rng.standard_normal((n, D)).astype(np.float32)
  q, k = (np.einsum("nd,hde->hne", X.astype(np.float64), np.asarray(w, np.float64)) for w in params[:2])
  logits = np.sort(np.einsum("hne,hme->hnm", q, k) / np.sqrt(Dh), axis=-1)
  assert np.abs(logits).max() > 1e9 and (n == 1 or np.min(logits[..., -1] - logits[..., -2]) > 1e6)
  ref = loop_attention(params, X)
  jitted = np.asarray(jax.jit(attention_layer)(params, X))
  with jax.disable_jit():   # op by op, nothing fused
    eager = np.asarray(attention_layer(params, X))
  for out in (jitted, eager):
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


def test_encoder_layer_matches_float64_loop():
  rng = np.random.default_rng(3)
  D, F = 5, 7
  att = rand_params(rng, 2, D, 3)
  g = lambda *s: rng.standard_normal(s).astype(np.float32)
  params = EncoderParams(att, g(D, F), g(F), g(F, D), g(D))
  X = rng.standard_normal((4, D)).astype(np.float32)
  ref = loop_encoder(params, X)
  np.testing.assert_allclose(encoder_layer(params, X), ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


def test_reference_bad_inputs():
  rng = np.random.default_rng(0)
  p = rand_params(rng, 2, 5, 3)
  with pytest.raises(ValueError, match="params.wo"):
    attention_layer(p._replace(wo=np.zeros((2, 3, 4), np.float32)), np.zeros((3, 5)))
  with pytest.raises(ValueError, match="`X` must have shape"):
    attention_layer(p, np.zeros((3, 6)))
  with pytest.raises(ValueError, match="AttentionParams"):
    attention_layer((p.wq, p.wk, p.wv, p.wo), np.zeros((3, 5)))
  with pytest.raises(ValueError, match="non-finite"):
    attention_layer(p, np.full((3, 5), np.nan))
