"""What the attention-shaped mixers share: ``x -> (q, k, v)`` heads, an optional short
convolution, and the output projection ``W_O`` that mixes the heads' reads.

Read as memory (Tang & Xie 2026, ``docs/papers/sdnc.md``): each head is a read head of a
memory, ``W_O`` mixes the read vectors. Subclasses implement :meth:`QKVMixer.read`, the
arithmetic, which calls into :mod:`jaxmem.kernels`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_config_ints, check_positive_int
from jaxmem.models.layers import constant, linear
from jaxmem.models.mixers.registry import Mixer
from jaxmem.sharding import constrain_heads, param


def check_short_conv(cfg) -> None:
  check_config_ints(cfg, ("short_conv",), allow_zero=True)


def qkv_state_floats(cfg, d_model: int) -> int:
  """What a :class:`QKVMixer`'s short convolution carries between tokens: the last ``K − 1`` of its
  ``3·d_model`` input channels (0 without one)."""
  K = getattr(cfg, "short_conv", 0)
  return (K - 1) * 3 * d_model if K else 0


def gate_projection(d_model: int, width: int, bias, *, dtype, rngs: nnx.Rngs,
                    axis: str | None = "heads") -> nnx.Linear:
  """A per-token gate ``W x + b`` with ``W = 0`` at init, so the gate starts at ``bias``; its ``width``
  outputs have the logical ``axis`` (``"heads"``: one per head, or whole heads)."""
  return linear(d_model, width, ("embed", axis), dtype=dtype, rngs=rngs, kernel_init=nnx.initializers.zeros,
                bias_init=constant(jnp.asarray(bias, jnp.float32)))


class ShortConv(nnx.Module):
  """Causal depthwise convolution over time: ``y_t = Σ_{j<K} w_j ⊙ x_{t−j}`` on ``[B, T, C]``.

  The short convolution of H3 (Fu et al. 2023, its "shift" SSM), Zoology's BaseConv and
  DeltaNet (Yang et al. 2024). ``K`` shifted copies summed (``K`` is a small static width,
  so this is ``K`` vector ops, not a loop over time). Starts as the identity (``w_0 = 1``).
  """

  def __init__(self, width: int, channels: int, *, rngs: nnx.Rngs, axis: str | None = "heads"):
    del rngs
    check_positive_int("width", width)
    check_positive_int("channels", channels)
    self.width = width
    self.kernel = param(jnp.zeros((width, channels), jnp.float32).at[0].set(1.0), ("conv", axis))

  def __call__(self, x_BTC: jax.Array) -> jax.Array:
    T = x_BTC.shape[1]
    w = self.kernel[...].astype(x_BTC.dtype)
    padded = jnp.pad(x_BTC, ((0, 0), (self.width - 1, 0), (0, 0)))
    y = w[0][None, None] * x_BTC
    for j in range(1, self.width):  # taps, not time steps
      y = y + w[j][None, None] * padded[:, self.width - 1 - j: self.width - 1 - j + T]
    return y


class QKVMixer(Mixer):
  """``x [B, T, D] -> W_O · read(x, q, k, v)`` with ``q, k, v [B, T, H, D/H]`` from one projection.

  ``cfg.short_conv = K > 0`` applies a :class:`ShortConv` of width ``K`` to ``q, k, v``
  after the projection. Subclasses create their extra projections *after* calling
  ``super().__init__`` (parameter initialisation draws from ``rngs`` in creation order).
  """

  def __init__(self, cfg, *, d_model: int, n_heads: int, n_layers: int, dtype: str, rngs: nnx.Rngs):
    if d_model % n_heads:
      raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}.")
    self.cfg = cfg
    self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
    dt = jnp.dtype(dtype)
    self.qkv = linear(d_model, 3 * d_model, ("embed", "heads"), use_bias=False, dtype=dt, rngs=rngs)
    self.out = linear(d_model, d_model, ("heads", "embed"), use_bias=False, dtype=dt, rngs=rngs,
                      kernel_init=nnx.initializers.normal(0.02 / (2 * n_layers) ** 0.5))
    self.conv = nnx.data(ShortConv(cfg.short_conv, 3 * d_model, rngs=rngs) if cfg.short_conv else None)

  def gate(self, width: int, bias, rngs: nnx.Rngs, axis: str | None = "heads") -> nnx.Linear:
    return gate_projection(self.d_model, width, bias, dtype=self.qkv.dtype, rngs=rngs, axis=axis)

  def heads(self, x_BTD: jax.Array):
    """``(q, k, v)``, each ``[B, T, H, D/H]`` (heads over the mesh's ``model`` axis when one is set)."""
    B, T, _ = x_BTD.shape
    qkv = self.qkv(x_BTD)
    if self.conv is not None:
      qkv = self.conv(qkv)
    qkv = qkv.reshape(B, T, 3, self.n_heads, self.head_dim)
    return constrain_heads(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])

  def read(self, x_BTD, q_BTHK, k_BTHK, v_BTHK) -> jax.Array:
    raise NotImplementedError

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    B, T, _ = x_BTD.shape
    o_BTHK = constrain_heads(self.read(x_BTD, *self.heads(x_BTD)))
    return self.out(o_BTHK.reshape(B, T, self.d_model))
