"""Flax NNX layers whose parameters carry logical axes (:mod:`jaxmem.sharding`): what every body and mixer
builds its projections, embeddings and norms from.

``linear(d_model, 3 * d_model, ("embed", "heads"), rngs=rngs)`` is ``nnx.Linear`` with its kernel annotated
``("embed", "heads")`` and its bias ``("heads",)``; the initializers and their random draws are
``nnx.Linear``'s own, so a model built from these layers has the same values as one built from plain
``nnx`` layers. The mesh layout and the weight-decay mask of a model are derived from these annotations
alone (:func:`jaxmem.sharding.state_shardings`, :func:`jaxmem.sharding.decay_mask`).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn.linear import default_bias_init, default_embed_init, default_kernel_init

from jaxmem.checks import check_finite_number, check_positive_int, is_concrete
from jaxmem.kernels.segments import check_lengths, previous_in_segment
from jaxmem.sharding import param, with_axes

Axes = Sequence[Optional[str]]


def linear(d_in: int, d_out: int, axes: Axes, *, use_bias: bool = True, dtype=None, rngs: nnx.Rngs,
           kernel_init: Callable = default_kernel_init, bias_init: Callable = default_bias_init) -> nnx.Linear:
  """``nnx.Linear(d_in, d_out)``: kernel ``[d_in, d_out]`` with logical ``axes`` (input, output), bias
  ``[d_out]`` with the output's axis."""
  axes = tuple(axes)
  if len(axes) != 2:
    raise ValueError(f"`axes` of a linear layer name its input and output dimensions, got {axes!r}.")
  return nnx.Linear(d_in, d_out, use_bias=use_bias, dtype=dtype, rngs=rngs,
                    kernel_init=with_axes(kernel_init, axes), bias_init=with_axes(bias_init, axes[1:]))


def embed(num: int, features: int, axes: Axes = ("vocab", "embed"), *, dtype=None, rngs: nnx.Rngs,
          embedding_init: Callable = default_embed_init) -> nnx.Embed:
  """``nnx.Embed(num, features)`` with its table annotated ``axes``."""
  return nnx.Embed(num, features, dtype=dtype, rngs=rngs, embedding_init=with_axes(embedding_init, axes))


def layer_norm(features: int, axis: Optional[str] = "embed", *, dtype=None, rngs: nnx.Rngs,
               **kwargs) -> nnx.LayerNorm:
  """``nnx.LayerNorm(features)`` with scale and bias annotated ``(axis,)``."""
  return nnx.LayerNorm(features, dtype=dtype, rngs=rngs, scale_init=with_axes(nnx.initializers.ones, (axis,)),
                       bias_init=with_axes(nnx.initializers.zeros, (axis,)), **kwargs)


def positions(max_len: int, d_model: int, *, std: float, rngs: nnx.Rngs) -> nnx.Param:
  """Learned absolute positions ``[max_len, d_model]``, ``N(0, std²)``, axes ``("length", "embed")`` (so never
  weight-decayed)."""
  return param(nnx.initializers.normal(std)(rngs.params(), (max_len, d_model)), ("length", "embed"))


class FeedForward(nnx.Module):
  """The position-wise MLP ``W_2 GELU(W_1 x + b_1) + b_2`` (hidden width ``d_ff``, axes ``"ffn"``), ``W_2``
  initialised ``N(0, 0.02²/(2·n_layers))`` (GPT-2's residual scaling), ``W_1`` as ``nnx.Linear``."""

  def __init__(self, d_model: int, d_ff: int, *, n_layers: int, dtype=None, rngs: nnx.Rngs):
    self.up = linear(d_model, d_ff, ("embed", "ffn"), dtype=dtype, rngs=rngs)
    self.down = linear(d_ff, d_model, ("ffn", "embed"), dtype=dtype, rngs=rngs,
                       kernel_init=nnx.initializers.normal(0.02 / (2 * n_layers) ** 0.5))

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.down(jax.nn.gelu(self.up(x)))


CONV_INITS = ("identity", "uniform")


class CausalConv(nnx.Module):
  """Depthwise causal convolution over time on ``[B, T, C]``: ``y_t = b + Σ_{j<K} w_j ⊙ x_{t−K+1+j}``.

  PyTorch's ``Conv1d`` order, as fla's ``ShortConvolution`` and Mamba's ``conv1d`` store it: ``taps[K − 1]``
  multiplies the current token, ``taps[0]`` the one ``K − 1`` back (zeros before the first). It is the short
  convolution of H3 (Fu et al. 2023, its "shift" SSM), Zoology's BaseConv, DeltaNet and Mamba; ``K`` is a
  small static width, so this is ``K`` vector ops, not a loop over time.

  ``init="identity"``: ``taps[K − 1] = 1``, the rest 0, no change to the model at initialisation (the q/k/v
  short convolution); ``"uniform"``: taps (and bias) uniform in ``±1/√K``, PyTorch's ``Conv1d`` default for
  one input channel per group (Mamba-2's). ``bias`` adds ``b [C]`` (zeros with the identity init).
  ``taps [K, C]`` has logical axes ``("conv", axis)``, ``bias`` ``(axis,)``.

  Decoding: :meth:`scan` continues from the last ``K − 1`` inputs (``tail [B, K − 1, C]``, oldest first;
  zeros at the start), :meth:`step` is one token of it.
  """

  def __init__(self, width: int, channels: int, axis: Optional[str] = "heads", *, bias: bool = False,
               init: str = "identity", rngs: nnx.Rngs):
    check_positive_int("width", width)
    check_positive_int("channels", channels)
    if init not in CONV_INITS:
      raise ValueError(f"`init` must be one of {list(CONV_INITS)}, got {init!r}.")
    self.width, self.channels = width, channels
    if init == "identity":
      taps, b = jnp.zeros((width, channels), jnp.float32).at[width - 1].set(1.0), jnp.zeros((channels,))
    else:
      bound = 1.0 / math.sqrt(width)
      draw = lambda shape: jax.random.uniform(rngs.params(), shape, jnp.float32, -bound, bound)
      taps = draw((width, channels))
      b = draw((channels,)) if bias else None
    self.taps = param(taps, ("conv", axis))
    self.bias = nnx.data(param(jnp.asarray(b, jnp.float32), (axis,)) if bias else None)

  def init_tail(self, batch_size: int, dtype=jnp.float32) -> jax.Array:
    """The state before the first token: ``K − 1`` zero inputs ``[B, K − 1, C]``."""
    return jnp.zeros((batch_size, self.width - 1, self.channels), dtype)

  def scan(self, tail_BKC: Optional[jax.Array], x_BTC: jax.Array, lengths=None) -> tuple:
    """``(tail [B, K − 1, C] or None for zeros, x [B, T, C]) -> (the last K − 1 inputs, y [B, T, C])``.
    ``lengths [B]`` (or None: all ``T``): right-padded rows, row ``b`` reads its first ``lengths[b]`` inputs
    only, and the tail returned is the last ``K − 1`` of those (with the tail it came with); ``y`` at the
    padding is unspecified."""
    K, T = self.width, x_BTC.shape[1]
    w = self.taps[...].astype(x_BTC.dtype)
    tail = jnp.zeros((x_BTC.shape[0], K - 1, x_BTC.shape[2]), x_BTC.dtype) if tail_BKC is None \
        else tail_BKC.astype(x_BTC.dtype)
    padded = jnp.concatenate([tail, x_BTC], axis=1)
    y = w[K - 1][None, None] * x_BTC
    for j in range(1, K):  # taps, not time steps: the current token first, then 1, 2, .. back
      y = y + w[K - 1 - j][None, None] * padded[:, K - 1 - j: K - 1 - j + T]
    if self.bias is not None:
      y = y + self.bias[...].astype(x_BTC.dtype)[None, None]
    if lengths is None:
      return padded[:, padded.shape[1] - (K - 1):], y
    # row b's last K − 1 inputs end at its input lengths[b] − 1, i.e. at padded[lengths[b] + K − 2]
    lengths = check_lengths(lengths, x_BTC.shape[0], T)
    idx = lengths[:, None] + jnp.arange(K - 1, dtype=jnp.int32)[None]
    return jnp.take_along_axis(padded, idx[..., None], axis=1), y

  def __call__(self, x_BTC: jax.Array, segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """``y [B, T, C]``; with ``segment_ids [B, T]`` (packed sequences, :mod:`jaxmem.kernels.segments`) each tap
    reads the token that many non-padding tokens back in the same segment, zeros before the segment's start."""
    if segment_ids is None:
      return self.scan(None, x_BTC)[1]
    K = self.width
    w = self.taps[...].astype(x_BTC.dtype)
    y = w[K - 1][None, None] * x_BTC
    for j in range(1, K):  # taps, not time steps
      src, ok = previous_in_segment(segment_ids, j)
      back = jnp.take_along_axis(x_BTC, src[..., None], axis=1)
      y = y + w[K - 1 - j][None, None] * jnp.where(ok[..., None], back, jnp.zeros((), x_BTC.dtype))
    if self.bias is not None:
      y = y + self.bias[...].astype(x_BTC.dtype)[None, None]
    return y

  def step(self, tail_BKC: jax.Array, x_BC: jax.Array) -> tuple:
    """One token: ``(tail [B, K − 1, C], x_t [B, C]) -> (tail, y_t [B, C])``."""
    tail, y = self.scan(tail_BKC, x_BC[:, None])
    return tail, y[:, 0]


NORM_GATE_ACTIVATIONS = ("swish", "silu", "sigmoid")


class RMSNormGated(nnx.Module):
  """The gated RMSNorm of fla's ``GatedDeltaNet`` output (fla's ``FusedRMSNormGated``), over the last axis:

      y = x / sqrt(mean(x²) + eps) · w ⊙ act(g),   act(g) = g·σ(g) ("swish" / "silu") or σ(g) ("sigmoid")

  normalise first, then gate (Mamba-2's ``norm_before_gate=True``; :mod:`jaxmem.models.mixers.ssd` gates before
  the norm). ``eps`` is added to the mean square under the root (fla's and PyTorch's ``RMSNorm`` convention),
  default ``1e-5`` as fla's; ``w [features]`` starts at ones, logical axis ``axis`` (one weight shared by every
  head when ``features`` is the head width, as in fla's layer); ``elementwise_affine=False`` drops it.
  Computed in float32 (float64 for float64 inputs) and returned in ``x``'s dtype, as fla's kernel.
  """

  def __init__(self, features: int, *, eps: float = 1e-5, activation: str = "swish",
               elementwise_affine: bool = True, axis: Optional[str] = "head_dim"):
    self.features = check_positive_int("features", features)
    if activation not in NORM_GATE_ACTIVATIONS:
      raise ValueError(f"`activation` must be one of {list(NORM_GATE_ACTIVATIONS)}, got {activation!r}.")
    self.eps, self.activation = check_finite_number("eps", eps, positive=True), activation
    self.weight = nnx.data(param(jnp.ones((features,), jnp.float32), (axis,)) if elementwise_affine else None)

  def __call__(self, x: jax.Array, g: jax.Array) -> jax.Array:
    """``x, g [..., features]`` (the same shape) -> ``y``, ``x``'s shape and dtype."""
    if x.shape != g.shape or not x.shape or x.shape[-1] != self.features:
      raise ValueError(f"`x` and `g` must have the same shape [..., features = {self.features}], got "
                       f"{x.shape} and {g.shape}.")
    acc = jnp.promote_types(jnp.result_type(x, g), jnp.float32)
    xf, gf = x.astype(acc), g.astype(acc)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + self.eps)
    if self.weight is not None:
      y = y * self.weight[...].astype(acc).reshape((1,) * (x.ndim - 1) + (-1,))
    y = y * (jax.nn.sigmoid(gf) if self.activation == "sigmoid" else gf * jax.nn.sigmoid(gf))
    return y.astype(x.dtype)


def count_params(model: nnx.Module) -> int:
  """The number of parameter floats (``nnx.Param`` leaves) of ``model``."""
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def token_ids(tokens_BT, vocab_size: int) -> jax.Array:
  """``tokens`` checked as ids of a ``vocab_size`` vocabulary, for an embedding lookup.

  Integer dtype required (``ValueError`` otherwise). Concrete ids outside ``[0, vocab_size)`` raise a
  ``ValueError`` naming a few of them. Under ``jit`` the values cannot be checked: out-of-range ids are
  clipped into range (``jnp.clip``; a lookup past the table would otherwise give NaN embeddings, and NaN
  logits then stop training with no hint of the cause), so validate ids before jitting."""
  tokens_BT = tokens_BT if isinstance(tokens_BT, jax.Array) else jax.numpy.asarray(tokens_BT)
  if not jax.numpy.issubdtype(tokens_BT.dtype, jax.numpy.integer):
    raise ValueError(f"`tokens` must be integer token ids, got dtype {tokens_BT.dtype}.")
  if is_concrete(tokens_BT):
    t = np.asarray(tokens_BT)
    bad = t[(t < 0) | (t >= vocab_size)]
    if bad.size:
      raise ValueError(f"`tokens` must lie in [0, vocab_size={vocab_size}), got ids such as "
                       f"{bad.ravel()[:3].tolist()}.")
  return jax.numpy.clip(tokens_BT, 0, vocab_size - 1)


def constant(value) -> Callable:
  """An initializer returning ``value`` (cast to the requested dtype), for gates' biases."""
  return lambda key, shape, dtype=None: jax.numpy.broadcast_to(jax.numpy.asarray(value, dtype), shape)
