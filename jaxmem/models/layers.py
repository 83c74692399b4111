"""Flax NNX layers whose parameters carry logical axes (:mod:`jaxmem.sharding`): what every body and mixer
builds its projections, embeddings and norms from.

``linear(d_model, 3 * d_model, ("embed", "heads"), rngs=rngs)`` is ``nnx.Linear`` with its kernel annotated
``("embed", "heads")`` and its bias ``("heads",)``; the initializers and their random draws are
``nnx.Linear``'s own, so a model built from these layers has the same values as one built from plain
``nnx`` layers. The mesh layout and the weight-decay mask of a model are derived from these annotations
alone (:func:`jaxmem.sharding.state_shardings`, :func:`jaxmem.sharding.decay_mask`).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import numpy as np
from flax import nnx
from flax.nnx.nn.linear import default_bias_init, default_embed_init, default_kernel_init

from jaxmem.checks import is_concrete
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
