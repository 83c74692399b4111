"""UniMatrix's matrix-state token mixer (Liu Xiao 2026, arXiv:2604.25930, ``docs/papers/unimatrix.md``).

Per head (state ``S × S``), per token, with ``x`` the block's normalised input::

    q, k, v (, d) = tanh(W x + b)                       [B, T, H, S] each
    ρ_t = σ(w_ρ · x_t + b_ρ)                           one scalar per head (``retention="head"``), or
    ρ_t = σ(W_ρ x_t + b_ρ)  ∈ (0, 1)^S                  per state channel, b_ρ per head (``"channel"``)
    S_t = ρ_t S_{t−1} + (1 − ρ_t) U_t                  U_t = k vᵀ (``updates="outer"``, Core) or
          U_t = w_o k vᵀ + w_d Diag(d) + w_s ½(k vᵀ + v kᵀ),  w = softmax(per-head logits)
                                                        (``updates="hybrid"``, Discovery)
    y_t = (W_o [S_t q_t]_heads) ⊙ σ(W_g x_t)           output projection under a sigmoid gate

With ``retention="channel"`` the update is ``S_t = S_{t−1} Diag(ρ_t) + U_t Diag(1 − ρ_t)`` (the
kernel's per-channel gate decays the state's columns, the key side of the read). Its gate is
``Linear(d_model → n_heads·S, no bias)`` plus one bias per head: at UniMatrix's sizes exactly the
3,840 parameters by which the paper's Core count exceeds the per-head gate's
(``jaxmem/models/unimatrix/README.md``).

The recurrence is :func:`jaxmem.kernels.matrix_state.matrix_state` (a ``lax.scan`` or the
chunked form built on the associative kernel's ``decay`` rule); ``spectral_norm=True``
rescales every ``S_t`` to spectral norm ≤ 1 (recurrent form only). The state starts at 0
on every call, so a Universal-Transformer body that applies this mixer at several depth
steps resets the state at each one (the paper's released code does not, which leaks future
tokens; ``tests/models/test_unimatrix.py`` checks causality by gradient).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_config_ints
from jaxmem.kernels import matrix_state as ms
from jaxmem.kernels.precision import PRECISIONS
from jaxmem.kernels.segments import check_lengths, lengths_to_segment_ids
from jaxmem.models.layers import linear
from jaxmem.models.mixers.qkv import gate_projection
from jaxmem.models.mixers.registry import Mixer, MixerConfig, register
from jaxmem.sharding import HEADS_BTH, HEADS_BTHK, STATE_BHKV, constrain_heads, map_heads, param

UPDATES = ("outer", "hybrid")
RETENTIONS = ("head", "channel")


@dataclasses.dataclass(frozen=True)
class MatrixStateConfig(MixerConfig):
  """Attributes:
    state_dim: ``S``, the side of each head's square state; 0 means ``d_model // n_heads``.
    updates: "outer" (``U = k vᵀ``, UniMatrix-Core) or "hybrid" (the per-head softmax mix
      of outer, diagonal and symmetric updates, UniMatrix-Discovery).
    spectral_norm: rescale ``S_t`` to spectral norm ≤ 1 after every update (recurrent form).
    output_gate: multiply the output projection by ``σ(W_g x)`` (the paper's gate).
    retention: "head" (one gate ``ρ`` per head and token, ``Linear(d_model → n_heads)`` with
      bias) or "channel" (one per head, token and state channel, ``Linear(d_model → n_heads·S,
      no bias)`` plus a bias per head; the state's columns decay separately).
    rho_bias: initial bias of the retention gate, ``ρ = σ(rho_bias)`` at init (2 → 0.88; every
      channel alike with ``retention="channel"``, whose weights start at 0).
    mode: "auto" (the fastest forward, chunked derivatives; recurrent with spectral_norm),
      "recurrent" or "chunked".
    chunk_size: chunk length of the chunked form.
    precision: matmul precision of the kernel (:mod:`jaxmem.kernels.precision`).
  """

  name: str = dataclasses.field(default="matrix_state", init=False)
  state_dim: int = 0
  updates: str = "outer"
  spectral_norm: bool = False
  output_gate: bool = True
  retention: str = "head"
  rho_bias: float = 2.0
  mode: str = "auto"
  chunk_size: int = 64
  precision: str = "highest"

  def state_floats(self, *, d_model: int, n_heads: int, seq_len: int) -> int:
    """One ``S × S`` matrix per head, ``H·S²``."""
    S = self.state_dim or d_model // n_heads
    return n_heads * S * S

  @classmethod
  def examples(cls) -> tuple:
    return (cls(), cls(updates="hybrid", retention="channel", output_gate=False, state_dim=4, chunk_size=4))

  def __post_init__(self):
    check_config_ints(self, ("state_dim",), allow_zero=True)
    check_config_ints(self, ("chunk_size",))
    if self.updates not in UPDATES:
      raise ValueError(f"MatrixStateConfig.updates must be one of {list(UPDATES)}, got {self.updates!r}.")
    if self.retention not in RETENTIONS:
      raise ValueError(f"MatrixStateConfig.retention must be one of {list(RETENTIONS)}, "
                       f"got {self.retention!r}.")
    if self.mode not in ms.MODES:
      raise ValueError(f"MatrixStateConfig.mode must be one of {list(ms.MODES)}, got {self.mode!r}.")
    if self.spectral_norm and self.mode == "chunked":
      raise ValueError("MatrixStateConfig: spectral_norm=True needs mode='recurrent' or 'auto' (the "
                       "rescaling is nonlinear in S, so there is no chunked form).")
    if not isinstance(self.precision, str) or self.precision.lower() not in PRECISIONS:
      raise ValueError(f"MatrixStateConfig.precision must be one of {list(PRECISIONS)}, "
                       f"got {self.precision!r}.")
    if isinstance(self.rho_bias, bool) or not isinstance(self.rho_bias, (int, float)) or not math.isfinite(
        self.rho_bias):
      raise ValueError(f"MatrixStateConfig.rho_bias must be a finite number, got {self.rho_bias!r}.")
    for name in ("spectral_norm", "output_gate"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"MatrixStateConfig.{name} must be a bool, got {getattr(self, name)!r}.")


class MatrixStateMixer(Mixer):
  """``x [B, T, d_model] -> y [B, T, d_model]``: projections here, the recurrence in the kernel."""

  def __init__(self, cfg: MatrixStateConfig, *, d_model: int, n_heads: int, n_layers: int, dtype: str,
               rngs: nnx.Rngs):
    S = cfg.state_dim or d_model // n_heads
    if S <= 0:
      raise ValueError(f"n_heads={n_heads} leaves no state: d_model={d_model} // n_heads is 0; set state_dim.")
    self.cfg, self.n_heads, self.state_dim = cfg, n_heads, S
    dt = jnp.dtype(dtype)
    self.n_proj = 4 if cfg.updates == "hybrid" else 3  # q, k, v (, d)
    self.proj = linear(d_model, self.n_proj * n_heads * S, ("embed", "heads"), dtype=dt, rngs=rngs)
    if cfg.retention == "channel":  # ρ = σ(W_ρ x + b_ρ): W_ρ [d_model, H·S] (head-major), from 0; b_ρ per head
      self.rho = linear(d_model, n_heads * S, ("embed", "heads"), use_bias=False, dtype=dt, rngs=rngs,
                        kernel_init=nnx.initializers.zeros)
      self.rho_bias = nnx.data(param(jnp.full((n_heads,), cfg.rho_bias, jnp.float32), ("heads",)))
    else:
      self.rho = gate_projection(d_model, n_heads, jnp.full((n_heads,), cfg.rho_bias), dtype=dt, rngs=rngs)
      self.rho_bias = nnx.data(None)
    self.mix_logits = nnx.data(param(jnp.zeros((n_heads, 3), jnp.float32), ("heads", None), decay=False)
                               if cfg.updates == "hybrid" else None)
    self.out = linear(n_heads * S, d_model, ("heads", "embed"), dtype=dt, rngs=rngs,
                      kernel_init=nnx.initializers.normal(0.02 / (2 * n_layers) ** 0.5))
    self.gate = nnx.data(linear(d_model, d_model, ("embed", "embed"), dtype=dt, rngs=rngs) if cfg.output_gate
                         else None)

  def __call__(self, x_BTD: jax.Array, segment_ids=None) -> jax.Array:
    """``y [B, T, d_model]`` from the all-zero state; packed sequences with ``segment_ids [B, T]`` (the state
    empties at each segment, :mod:`jaxmem.kernels.segments`)."""
    return self._sequence(None, x_BTD, segment_ids)[1]

  def init_state(self, batch_size: int, max_len: int) -> jax.Array:
    """The all-zero state ``S_0 [B, H, S, S]`` (float32; its size does not grow with ``max_len``)."""
    return jnp.zeros((batch_size, self.n_heads, self.state_dim, self.state_dim), jnp.float32)

  def scan(self, state, x_BTD: jax.Array, segment_ids=None, lengths=None) -> tuple:
    """The sequence form from a given state: ``(S_0 [B, H, S, S] or None for zeros, x [B, T, d_model]) ->
    (S_T, y [B, T, d_model])``, by the kernel's chunked / parallel forms (``cfg.mode``); :meth:`step`
    applied token by token gives the same. ``segment_ids [B, T]``: packed rows (the first segment continues
    ``S_0``, later ones start from zero; ``S_T`` is the last segment's). ``lengths [B]`` (instead): right-padded
    rows, the segment ids 1 for a row's first ``lengths[b]`` tokens and 0 (padding, which writes nothing)
    after them, so ``S_T`` is each row's state after its own tokens."""
    if lengths is not None:
      if segment_ids is not None:
        raise ValueError("give `segment_ids` or `lengths`, not both.")
      B, T, _ = x_BTD.shape
      segment_ids = lengths_to_segment_ids(check_lengths(lengths, B, T), T)
    return self._sequence(state, x_BTD, segment_ids)

  def _sequence(self, state, x_BTD: jax.Array, segment_ids) -> tuple:
    B, T, _ = x_BTD.shape
    H, S, cfg = self.n_heads, self.state_dim, self.cfg
    parts = jnp.tanh(self.proj(x_BTD)).reshape(B, T, self.n_proj, H, S)
    q, k, v = constrain_heads(parts[:, :, 0], parts[:, :, 1], parts[:, :, 2])
    d = constrain_heads(parts[:, :, 3]) if self.n_proj == 4 else None
    mix = None if self.mix_logits is None else jax.nn.softmax(self.mix_logits[...], axis=-1)
    z = self.rho(x_BTD).astype(jnp.float32)  # [B, T, H] or [B, T, H·S]
    if self.rho_bias is not None:
      z = z.reshape(B, T, H, S) + self.rho_bias[...].reshape(1, 1, H, 1)
    log_rho = jax.nn.log_sigmoid(z)
    def kernel(q, k, v, log_rho, d, mix, initial_state, segment_ids):
      return ms.matrix_state(q, k, v, log_rho=log_rho, d=d, mix=mix, mode=cfg.mode, chunk_size=cfg.chunk_size,
                             spectral_norm=cfg.spectral_norm, precision=cfg.precision,
                             initial_state=initial_state, return_state=True, segment_ids=segment_ids)
    # per device: its own batch rows and heads (jaxmem.sharding.map_heads), when a mesh is set
    o, S_T = map_heads(kernel, (q, k, v, log_rho, d, mix, state, segment_ids),
                       (HEADS_BTHK,) * 3 + (HEADS_BTH if log_rho.ndim == 3 else HEADS_BTHK, HEADS_BTHK,
                                            ("heads", None), STATE_BHKV, ("batch", "length")),
                       (HEADS_BTHK, STATE_BHKV))
    y = self.out(constrain_heads(o).reshape(B, T, H * S))
    if self.gate is not None:
      y = y * jax.nn.sigmoid(self.gate(x_BTD))
    return S_T, y

  def step(self, state: jax.Array, x_BD: jax.Array) -> tuple:
    """One token: ``(S [B, H, S, S], x_t [B, d_model]) -> (S', y_t [B, d_model])``."""
    state, y = self.scan(state, x_BD[:, None])
    return state, y[:, 0]


register("matrix_state", MatrixStateConfig, MatrixStateMixer)
