"""The layers the simulator simulates, computed directly: ``attention_layer`` and ``encoder_layer``.

These are the targets ``T`` of Theorem 6 and Corollary 6.1 of Dutta, Chakrabarty, Ansari &
Das, "On the Existence of Universal Simulators of Attention" (arXiv:2506.18739 v2): a
single-layer, multi-head, non-causal softmax attention layer, and the encoder layer built
from it. Everything is float32 with ``precision="highest"``.

Attention (``H`` heads, model width ``D``, head width ``D_h``)::

    attention_layer(T, X) = Σ_h softmax( X wq_h (X wk_h)ᵀ / √D_h ) X wv_h wo_h        X [n, D]

with ``wq, wk, wv [H, D, D_h]`` and ``wo [H, D_h, D]`` (no biases; the softmax is row-wise).

Encoder layer (post-residual, **no layer norm**, ReLU feed-forward of width ``F``)::

    Y = X + attention_layer(T.att, X)
    encoder_layer(T, X) = Y + relu(Y w1 + b1) w2 + b2      w1 [D, F], b1 [F], w2 [F, D], b2 [D]

:func:`attention_layer_numpy` is the same equation in float64 numpy (used as the "exact"
reference by :func:`jaxmem.simulator.error_table`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.arrays import device_array
from jaxmem.checks import is_concrete

__all__ = [
    "AttentionParams", "EncoderParams", "attention_layer", "attention_layer_numpy", "check_attention_params",
    "check_encoder_params", "check_finite_array", "check_matrix", "encoder_layer", "encoder_layer_numpy",
]

HIGHEST = jax.lax.Precision.HIGHEST


class AttentionParams(NamedTuple):
  """A single-layer ``H``-head attention: ``wq, wk, wv [H, D, D_h]``, ``wo [H, D_h, D]``."""
  wq: Any
  wk: Any
  wv: Any
  wo: Any


class EncoderParams(NamedTuple):
  """Corollary 6.1's encoder layer: attention ``att`` + ReLU FFN ``w1 [D, F], b1 [F], w2 [F, D], b2 [D]``."""
  att: AttentionParams
  w1: Any
  b1: Any
  w2: Any
  b2: Any


def _shape(x) -> tuple[int, ...]:
  return tuple(getattr(x, "shape", np.shape(x)))



def check_finite_array(name: str, x) -> None:
  """ValueError if a concrete array holds NaN or ±inf (skipped under tracing)."""
  if is_concrete(x) and not bool(np.all(np.isfinite(np.asarray(x)))):
    raise ValueError(f"`{name}` holds non-finite values (NaN or inf).")


def check_matrix(name: str, x, *, rank: int = 2) -> tuple[int, ...]:
  shape = _shape(x)
  if len(shape) != rank:
    raise ValueError(f"`{name}` must have rank {rank}, got shape {shape}.")
  if any(d == 0 for d in shape):
    raise ValueError(f"`{name}` must not be empty, got shape {shape}.")
  check_finite_array(name, x)
  return shape


def check_attention_params(params, *, d_model: Optional[int] = None, num_heads: Optional[int] = None,
                           head_dim: Optional[int] = None, name: str = "params") -> tuple[int, int, int]:
  """Validates an :class:`AttentionParams`; returns ``(H, D, D_h)``. Given sizes must match."""
  if isinstance(params, EncoderParams) or not isinstance(params, AttentionParams):
    raise ValueError(f"`{name}` must be an AttentionParams(wq, wk, wv, wo), got {type(params).__name__}.")
  shapes = {f: _shape(getattr(params, f)) for f in AttentionParams._fields}
  if len(shapes["wq"]) != 3:
    raise ValueError(f"`{name}.wq` must have shape [H, D, D_h], got {shapes['wq']}.")
  H, D, Dh = shapes["wq"]
  want = {"wq": (H, D, Dh), "wk": (H, D, Dh), "wv": (H, D, Dh), "wo": (H, Dh, D)}
  if d_model is not None or num_heads is not None or head_dim is not None:
    H = num_heads if num_heads is not None else H
    D = d_model if d_model is not None else D
    Dh = head_dim if head_dim is not None else Dh
    want = {"wq": (H, D, Dh), "wk": (H, D, Dh), "wv": (H, D, Dh), "wo": (H, Dh, D)}
  for f, shape in shapes.items():
    if shape != want[f]:
      raise ValueError(f"`{name}.{f}` must have shape {want[f]} [H={H}, D={D}, D_h={Dh}], got {shape}.")
  if 0 in (H, D, Dh):
    raise ValueError(f"`{name}` has an empty dimension: H={H}, D={D}, D_h={Dh}.")
  for f in AttentionParams._fields:
    check_finite_array(f"{name}.{f}", getattr(params, f))
  return H, D, Dh


def check_encoder_params(params, *, d_model: Optional[int] = None, num_heads: Optional[int] = None,
                         head_dim: Optional[int] = None, ffn_dim: Optional[int] = None,
                         name: str = "params") -> tuple[int, int, int, int]:
  """Validates an :class:`EncoderParams`; returns ``(H, D, D_h, F)``."""
  if not isinstance(params, EncoderParams):
    raise ValueError(f"`{name}` must be an EncoderParams(att, w1, b1, w2, b2), got {type(params).__name__}.")
  H, D, Dh = check_attention_params(params.att, d_model=d_model, num_heads=num_heads, head_dim=head_dim,
                                    name=f"{name}.att")
  w1 = _shape(params.w1)
  F = ffn_dim if ffn_dim is not None else (w1[1] if len(w1) == 2 else -1)
  want = {"w1": (D, F), "b1": (F,), "w2": (F, D), "b2": (D,)}
  for f, shape in want.items():
    got = _shape(getattr(params, f))
    if got != shape or F <= 0:
      raise ValueError(f"`{name}.{f}` must have shape {shape} [D={D}, F={F}], got {got}.")
    check_finite_array(f"{name}.{f}", getattr(params, f))
  return H, D, Dh, F


def _check_x(X, D: int, name: str = "X") -> int:
  shape = check_matrix(name, X)
  if shape[1] != D:
    raise ValueError(f"`{name}` must have shape [n, {D}] (the parameters' D), got {shape}.")
  return shape[0]


def _f32(x) -> jax.Array:
  return device_array(x, jnp.float32)


@jax.jit
def _attention_layer(wq, wk, wv, wo, X):
  Dh = wq.shape[2]
  q = jnp.einsum("nd,hde->hne", X, wq, precision=HIGHEST)
  k = jnp.einsum("nd,hde->hne", X, wk, precision=HIGHEST)
  v = jnp.einsum("nd,hde->hne", X, wv, precision=HIGHEST)
  qk = jnp.einsum("hne,hme->hnm", q, k, precision=HIGHEST)
  # softmax(qk / √D_h) with the row max subtracted from the raw products, then scaled: (qk − max)/√D_h ≤ 0
  # exactly. jax.nn.softmax(qk / √D_h) under jit fuses the scaling into `s − max(s)`, which XLA may
  # contract to fma(qk, 1/√D_h, −max): the unrounded product minus the rounded one, up to half an ulp of
  # the largest logit (±512 at 1e10), so exp overflowed and the layer returned NaN.
  z = (qk - jnp.max(qk, axis=-1, keepdims=True)) / jnp.sqrt(jnp.float32(Dh))
  e = jnp.exp(z)
  p = e / jnp.sum(e, axis=-1, keepdims=True)
  o = jnp.einsum("hnm,hme->hne", p, v, precision=HIGHEST)
  return jnp.einsum("hne,hed->nd", o, wo, precision=HIGHEST)


@jax.jit
def _encoder_layer(att, w1, b1, w2, b2, X):
  Y = X + _attention_layer(*att, X)
  h = jax.nn.relu(jnp.matmul(Y, w1, precision=HIGHEST) + b1[None, :])
  return Y + jnp.matmul(h, w2, precision=HIGHEST) + b2[None, :]


def attention_layer(params: AttentionParams, X) -> jax.Array:
  """``Σ_h softmax(X wq_h (X wk_h)ᵀ / √D_h) X wv_h wo_h``: ``X [n, D]`` → ``[n, D]`` (float32)."""
  H, D, Dh = check_attention_params(params)
  _check_x(X, D)
  return _attention_layer(*(_f32(w) for w in params), _f32(X))


def encoder_layer(params: EncoderParams, X) -> jax.Array:
  """``Y + relu(Y w1 + b1) w2 + b2`` with ``Y = X + attention_layer(params.att, X)`` (no layer norm)."""
  H, D, Dh, F = check_encoder_params(params)
  _check_x(X, D)
  att = tuple(_f32(w) for w in params.att)
  return _encoder_layer(att, *(_f32(w) for w in params[1:]), _f32(X))


def attention_layer_numpy(params: AttentionParams, X) -> np.ndarray:
  """The same equation in float64 numpy (vectorised; max-subtracted softmax)."""
  wq, wk, wv, wo = (np.asarray(w, np.float64) for w in params)
  X = np.asarray(X, np.float64)
  out = np.zeros_like(X)
  for h in range(wq.shape[0]):
    s = (X @ wq[h]) @ (X @ wk[h]).T / np.sqrt(wq.shape[2])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out += p @ (X @ wv[h]) @ wo[h]
  return out


def encoder_layer_numpy(params: EncoderParams, X) -> np.ndarray:
  X = np.asarray(X, np.float64)
  Y = X + attention_layer_numpy(params.att, X)
  w1, b1, w2, b2 = (np.asarray(a, np.float64) for a in params[1:])
  return Y + np.maximum(Y @ w1 + b1, 0.0) @ w2 + b2
