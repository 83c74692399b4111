"""Mamba-2 as a token mixer (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060, the Mamba-2 block).

With ``d_inner = expand · d_model`` split into the body's ``H = n_heads`` heads of ``P = d_inner / H``
channels, ``G = n_groups`` groups of ``N = d_state`` shared by ``H / G`` heads each, and ``x`` the block's
normalised input ``[batch, T, d_model]``::

    z = W_z x,  u = W_x x [d_inner],  B = W_B x,  C = W_C x [G·N],  δ = W_Δ x [H]    (no biases)
    u, B, C = SiLU(conv(u)), SiLU(conv(B)), SiLU(conv(C))        causal depthwise, width d_conv, with bias
    Δ = softplus(δ + dt_bias),   A = −exp(A_log)                 float32
    y = SSD(u [H, P], Δ, A, B, C, D)                              :func:`jaxmem.kernels.ssd.ssd`
    y = RMSNorm(y ⊙ SiLU(z)) ⊙ w                                  per group of d_inner / G channels
    out = W_out y

The SSD recurrence per head is ``h_t = exp(Δ_t A) h_{t−1} + Δ_t u_t B_tᵀ``, ``y_t = h_t C_t + D u_t``
(:mod:`jaxmem.kernels.ssd`: the associative memory's ``decay`` rule). The gate multiplies before the norm
(Mamba-2's gated RMSNorm with ``norm_before_gate=False``); with ``G > 1`` each group of ``d_inner / G``
channels (the channels of ``H / G`` heads) is normalised on its own.

Initialisation (Mamba-2's): ``Δ`` at ``dt_bias = softplus⁻¹(Δ₀)`` with ``Δ₀`` log-uniform in
``[dt_min, dt_max]`` and floored at ``dt_init_floor``; ``A_log = log a``, ``a`` uniform in ``a_init_range``;
``D = 1``; norm weight 1; the convolution's taps and bias uniform in ``±1/√d_conv`` (PyTorch's ``Conv1d``
default, which Mamba-2's convolution uses); input projections ``nnx.Linear``'s default; the output
projection ``N(0, 0.02/√(2·n_layers))`` as :class:`~jaxmem.models.mixers.qkv.QKVMixer`'s. The projections
are separate matrices (Mamba-2 fuses them into one ``in_proj``), so that each carries clean logical axes:
``"heads"`` for dimensions made of whole heads (``d_inner``, ``H``), ``"state"`` for ``G·N`` (shared by the
heads, replicated over a mesh), ``"conv"`` for the taps. On a mesh the kernel runs per device on its own
batch rows and heads (:func:`jaxmem.sharding.map_heads`); with ``G > 1`` the groups are first broadcast to
their heads, since a device's local head ``i`` is not global head ``i`` (replicated groups would be read by the
wrong heads).

Tested: ``tests/models/test_ssd_mixer.py`` (against a float64 NumPy re-implementation of the block; decoding;
state size; in ``TransformerLM``; logical axes and weight decay) and ``tests/models/test_mixer_contract.py``.

Porting from ``mamba_ssm.Mamba2``: the head count is the body's ``n_heads`` (Mamba-2 fixes ``headdim`` and
derives it); defaults ``d_state = 16`` and ``chunk_size = 64`` (Mamba-2: 128 and 256); ``n_groups`` /
``a_init_range`` for ``ngroups`` / ``A_init_range``; no ``dt_limit``; the input projections use
``nnx.Linear``'s lecun-normal init (PyTorch: uniform); weights are split (``in_z``, ``in_x``, ``in_B``,
``in_C``, ``in_dt``, ``conv_x`` / ``conv_B`` / ``conv_C``, ``norm``, ``out``), so importing Mamba-2 weights
means splitting ``in_proj`` and ``conv1d`` by channel; the decoding conv window is ``[batch, d_conv − 1,
channels]`` (Mamba-2: ``[batch, channels, d_conv]``).

Decoding: :meth:`Mamba2.init_state` / :meth:`Mamba2.step` / :meth:`Mamba2.scan` carry the last ``d_conv − 1``
inputs of the convolution (``u, B, C`` channels) and the SSM state ``[batch, H, P, N]``; their size does not
grow with the sequence (:meth:`SSDConfig.state_floats`). ``scan`` (a prompt's prefill) is the sequence form
from a state, the convolution from its tail (:meth:`~jaxmem.models.layers.CausalConv.scan`) and the kernel
from its ``initial_state``; ``__call__`` is ``scan`` from the zero state and ``step`` a ``scan`` of one
token (one code path, :meth:`Mamba2._sequence`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.linear import default_kernel_init

from jaxmem.checks import check_config_ints, check_positive_int
from jaxmem.kernels import ssd as ssd_kernel
from jaxmem.kernels.precision import PRECISIONS
from jaxmem.kernels.segments import check_lengths, lengths_to_segment_ids
from jaxmem.models.layers import CausalConv
from jaxmem.models.mixers.registry import Mixer, MixerConfig, register
from jaxmem.sharding import HEADS_BTH, HEADS_BTHK, constrain_heads, map_heads, param, with_axes

SHARED_BTGN = ("batch", "length", None, None)  # B and C with one group: read by every head, replicated
STATE_BHPN = ("batch", "heads", None, None)  # the SSM state: per batch row and head


@dataclasses.dataclass(frozen=True)
class SSDConfig(MixerConfig):
  """Attributes:
    d_state: ``N``, the state size of each head (Mamba-2's ``d_state``).
    expand: ``d_inner = expand · d_model``; the body's ``n_heads`` must divide it (head width ``d_inner / H``).
    n_groups: ``G``, groups of ``B`` / ``C`` shared by ``H / G`` heads each; must divide ``n_heads``.
    d_conv: width of the causal depthwise convolution over the ``x``, ``B``, ``C`` channels (1: taps of the
      current token only).
    dt_min, dt_max: the range of the log-uniform initial step sizes ``Δ₀``; dt_init_floor: their floor.
    a_init_range: ``(lo, hi)``, ``0 < lo ≤ hi``: ``−A`` is drawn uniformly from it.
    chunk_size, mode: the SSD kernel's form (:func:`jaxmem.kernels.ssd.ssd`).
    norm_eps: the gated RMSNorm's ``ε``.
    precision: matmul precision of the kernel (:mod:`jaxmem.kernels.precision`).
  """

  name: str = dataclasses.field(default="ssd", init=False)
  d_state: int = 16
  expand: int = 2
  n_groups: int = 1
  d_conv: int = 4
  dt_min: float = 1e-3
  dt_max: float = 0.1
  dt_init_floor: float = 1e-4
  a_init_range: tuple = (1.0, 16.0)
  chunk_size: int = 64
  mode: str = "auto"
  norm_eps: float = 1e-5
  precision: str = "highest"

  @classmethod
  def examples(cls) -> tuple:
    """The default (one group: ``B``, ``C`` shared by every head) and two groups (broadcast to their heads)."""
    return (cls(), cls(n_groups=2, d_state=4, d_conv=2, chunk_size=4))

  def __post_init__(self):
    check_config_ints(self, ("d_state", "expand", "n_groups", "d_conv", "chunk_size"))
    for name in ("dt_min", "dt_max", "norm_eps"):
      if not _finite(getattr(self, name)) or getattr(self, name) <= 0:
        raise ValueError(f"SSDConfig.{name} must be a finite positive number, got {getattr(self, name)!r}.")
    if self.dt_min > self.dt_max:
      raise ValueError(f"SSDConfig.dt_min={self.dt_min!r} must not exceed dt_max={self.dt_max!r}.")
    if not _finite(self.dt_init_floor) or self.dt_init_floor < 0:
      raise ValueError(f"SSDConfig.dt_init_floor must be a finite number >= 0, got {self.dt_init_floor!r}.")
    r = self.a_init_range
    if isinstance(r, list):  # a config file's list; a tuple keeps the config hashable
      object.__setattr__(self, "a_init_range", r := tuple(r))
    if not (isinstance(r, tuple) and len(r) == 2 and all(_finite(a) for a in r) and 0 < r[0] <= r[1]):
      raise ValueError(f"SSDConfig.a_init_range must be a pair (lo, hi) of finite numbers with 0 < lo <= hi, "
                       f"got {r!r}.")
    if self.mode not in ssd_kernel.MODES:
      raise ValueError(f"SSDConfig.mode must be one of {list(ssd_kernel.MODES)}, got {self.mode!r}.")
    if not isinstance(self.precision, str) or self.precision.lower() not in PRECISIONS:
      raise ValueError(f"SSDConfig.precision must be one of {list(PRECISIONS)}, got {self.precision!r}.")

  def dims(self, *, d_model: int, n_heads: int) -> tuple[int, int]:
    """``(d_inner, head_dim)`` for a body of ``d_model`` and ``n_heads``; ``ValueError`` unless they fit."""
    check_positive_int("d_model", d_model)
    check_positive_int("n_heads", n_heads)
    d_inner = self.expand * d_model
    if d_inner % n_heads:
      raise ValueError(f"SSDConfig: n_heads={n_heads} must divide d_inner = expand·d_model = {d_inner}.")
    if n_heads % self.n_groups:
      raise ValueError(f"SSDConfig.n_groups={self.n_groups} must divide n_heads={n_heads}.")
    return d_inner, d_inner // n_heads

  def conv_channels(self, *, d_model: int) -> int:
    """Channels of the convolution: ``x`` (``d_inner``), ``B`` and ``C`` (``G·N`` each)."""
    return self.expand * d_model + 2 * self.n_groups * self.d_state

  def state_floats(self, *, d_model: int, n_heads: int, seq_len: int) -> int:
    """``H·P·N`` (the SSM state) ``+ (d_conv − 1)·(d_inner + 2·G·N)`` (the convolution's window); constant in
    ``seq_len``."""
    del seq_len
    d_inner, _ = self.dims(d_model=d_model, n_heads=n_heads)
    return d_inner * self.d_state + (self.d_conv - 1) * self.conv_channels(d_model=d_model)


def _finite(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _last(w: jax.Array, ndim: int) -> jax.Array:
  """A vector ``[C]`` shaped ``[1, .., 1, C]`` to broadcast over an array of rank ``ndim`` explicitly."""
  return w.reshape((1,) * (ndim - 1) + w.shape)


class Mamba2(Mixer):
  """``x [batch, T, d_model] -> [batch, T, d_model]``: the Mamba-2 block of the module docstring."""

  def __init__(self, cfg: SSDConfig, *, d_model: int, n_heads: int, n_layers: int, dtype: str, rngs: nnx.Rngs):
    d_inner, P = cfg.dims(d_model=d_model, n_heads=n_heads)
    H, G, N, K = n_heads, cfg.n_groups, cfg.d_state, cfg.d_conv
    self.cfg, self.d_model, self.d_inner = cfg, d_model, d_inner
    self.n_heads, self.head_dim = H, P
    self.compute_dtype = jnp.dtype(dtype)

    def proj(d_in, d_out, axes, init=default_kernel_init):
      return nnx.Linear(d_in, d_out, use_bias=False, dtype=self.compute_dtype, rngs=rngs,
                        kernel_init=with_axes(init, axes))

    self.in_z = proj(d_model, d_inner, ("embed", "heads"))
    self.in_x = proj(d_model, d_inner, ("embed", "heads"))
    self.in_B = proj(d_model, G * N, ("embed", "state"))
    self.in_C = proj(d_model, G * N, ("embed", "state"))
    self.in_dt = proj(d_model, H, ("embed", "heads"))
    self.conv_x = CausalConv(K, d_inner, "heads", bias=True, init="uniform", rngs=rngs)
    self.conv_B = CausalConv(K, G * N, "state", bias=True, init="uniform", rngs=rngs)
    self.conv_C = CausalConv(K, G * N, "state", bias=True, init="uniform", rngs=rngs)
    # Δ₀ log-uniform in [dt_min, dt_max], floored; dt_bias = softplus⁻¹(Δ₀) = Δ₀ + log(1 − exp(−Δ₀))
    lo, hi = math.log(cfg.dt_min), math.log(cfg.dt_max)
    dt0 = jnp.exp(jax.random.uniform(rngs.params(), (H,), jnp.float32, lo, hi))
    dt0 = jnp.maximum(dt0, cfg.dt_init_floor)
    self.dt_bias = param(dt0 + jnp.log(-jnp.expm1(-dt0)), ("heads",))
    a = jax.random.uniform(rngs.params(), (H,), jnp.float32, *map(float, cfg.a_init_range))
    self.A_log = param(jnp.log(a), ("heads",))
    self.D = param(jnp.ones((H,), jnp.float32), ("heads",))
    self.norm = param(jnp.ones((d_inner,), jnp.float32), ("heads",))
    out_init = nnx.initializers.normal(0.02 / math.sqrt(2 * n_layers))  # as QKVMixer's output projection
    self.out = proj(d_inner, d_model, ("heads", "embed"), out_init)

  # -- pieces of the block ------------------------------------------------------------------

  def _projections(self, x):
    """``x [..., d_model]`` -> ``(z, u, B, C, δ)`` (each ``[..., ·]``, compute dtype)."""
    x = x.astype(self.compute_dtype)
    return self.in_z(x), self.in_x(x), self.in_B(x), self.in_C(x), self.in_dt(x)

  def _ssm_params(self, dt_raw):
    """``Δ = softplus(δ + dt_bias)`` ``[..., H]`` and ``A = −exp(A_log)`` ``[H]``, in float32."""
    dt = jax.nn.softplus(dt_raw.astype(jnp.float32) + _last(self.dt_bias[...], dt_raw.ndim))
    return dt, -jnp.exp(self.A_log[...])

  def _gated_norm_out(self, y, z):
    """``W_out (RMSNorm(y ⊙ SiLU(z)) ⊙ w)`` with the norm per group of ``d_inner / G`` channels."""
    G = self.cfg.n_groups
    g = y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))
    grouped = g.reshape(g.shape[:-1] + (G, self.d_inner // G))
    grouped = grouped * jax.lax.rsqrt(jnp.mean(jnp.square(grouped), axis=-1, keepdims=True) + self.cfg.norm_eps)
    g = grouped.reshape(g.shape) * _last(self.norm[...], g.ndim)
    return self.out(g.astype(self.compute_dtype))

  def _groups(self, B, C):
    """``B``, ``C`` ``[..., G·N]`` -> ``[..., G, N]``."""
    G, N = self.cfg.n_groups, self.cfg.d_state
    return B.reshape(B.shape[:-1] + (G, N)), C.reshape(C.shape[:-1] + (G, N))

  # -- the sequence, from the zero state or a given one ---------------------------------------

  def _sequence(self, x_BTD: jax.Array, tail, h0, segment_ids=None, lengths=None) -> tuple:
    """The block on ``x [batch, T, d_model]`` from a state: ``tail`` the convolution's last ``d_conv − 1``
    inputs ``[batch, d_conv − 1, d_inner + 2·G·N]`` and ``h0`` the SSM state ``[batch, H, P, N]`` (None: zeros,
    the sequence call). Returns ``(tail after the last token or None when None came in, h_T, y [batch, T,
    d_model])``. ``lengths [batch]`` (decoding, with a state): right-padded rows, the tail and ``h_T`` those
    after each row's first ``lengths[b]`` tokens (the kernel gets them as segment ids, padding writing nothing).

    The SSD kernel runs in the configured ``mode``, which every form supports from an initial state; a
    single token (:meth:`step`) runs the recurrent form, the update itself (the chunked form would pad it
    to a chunk)."""
    nb, T, _ = x_BTD.shape
    H, P, cfg = self.n_heads, self.head_dim, self.cfg
    d_inner, GN = self.d_inner, cfg.n_groups * cfg.d_state
    z, u, B, C, dt_raw = self._projections(x_BTD)
    if tail is None:
      tails = (None, None, None)
    else:
      tails = (tail[..., :d_inner], tail[..., d_inner:d_inner + GN], tail[..., d_inner + GN:])
    if lengths is not None:
      lengths = check_lengths(lengths, nb, T)
      segment_ids = lengths_to_segment_ids(lengths, T)
    if segment_ids is None or lengths is not None:
      tail_u, u = self.conv_x.scan(tails[0], u, lengths)
      tail_B, B = self.conv_B.scan(tails[1], B, lengths)
      tail_C, C = self.conv_C.scan(tails[2], C, lengths)
    else:  # packed sequences from the zero state (the sequence call)
      u, B, C = self.conv_x(u, segment_ids), self.conv_B(B, segment_ids), self.conv_C(C, segment_ids)
    u = jax.nn.silu(u)
    B = jax.nn.silu(B)
    B, C = self._groups(B, jax.nn.silu(C))
    dt, A = self._ssm_params(dt_raw)
    u = constrain_heads(u.reshape(nb, T, H, P))
    if cfg.n_groups == 1:
      bc_axes = SHARED_BTGN
    else:
      # G > 1 groups: given to the kernel per head, so that a device holding a block of heads (map_heads)
      # reads each head's own group (on a device, local head i is not global head i).
      B, C = (jnp.repeat(a, H // cfg.n_groups, axis=2) for a in (B, C))
      bc_axes = HEADS_BTHK
    mode = "recurrent" if T == 1 else cfg.mode

    def kernel(u, dt, A, B, C, D, h0, segment_ids):
      return ssd_kernel.ssd(u, dt, A, B, C, D, mode=mode, chunk_size=cfg.chunk_size, initial_state=h0,
                            return_state=True, precision=cfg.precision, segment_ids=segment_ids)

    # per device: its own batch rows and heads (jaxmem.sharding.map_heads), when a mesh is set
    y, h = map_heads(kernel, (u, dt, A, B, C, self.D[...], h0, segment_ids),
                     (HEADS_BTHK, HEADS_BTH, ("heads",), bc_axes, bc_axes, ("heads",), STATE_BHPN,
                      ("batch", "length")),
                     (HEADS_BTHK, STATE_BHPN))
    y = constrain_heads(y).reshape(nb, T, d_inner)
    if tail is not None:
      tail = jnp.concatenate([tail_u, tail_B, tail_C], axis=-1).astype(tail.dtype)
    return tail, h, self._gated_norm_out(y, z).astype(x_BTD.dtype)

  def __call__(self, x_BTD: jax.Array, segment_ids=None) -> jax.Array:
    """The block on the sequence from the zero state: ``[batch, T, d_model] -> [batch, T, d_model]``; packed
    sequences with ``segment_ids [batch, T]`` (the convolutions and the state restart at each segment)."""
    return self._sequence(x_BTD, None, None, segment_ids)[2]

  # -- decoding -------------------------------------------------------------------------------

  def init_state(self, batch_size: int, max_len: int) -> dict:
    """``{"conv": [batch, d_conv − 1, d_inner + 2·G·N]`` (the last inputs of the convolution, oldest first;
    channels ``x, B, C``), ``"ssm": [batch, H, P, N]`` float32``}``, all zeros; ``max_len`` is not needed (the
    state has a fixed size)."""
    del max_len
    check_positive_int("batch_size", batch_size)
    cfg = self.cfg
    conv = jnp.zeros((batch_size, cfg.d_conv - 1, cfg.conv_channels(d_model=self.d_model)), self.compute_dtype)
    return {"conv": conv, "ssm": ssd_kernel.init(batch_size, self.n_heads, self.head_dim, cfg.d_state)}

  def scan(self, state: dict, x_BTD: jax.Array, lengths=None) -> tuple:
    """The block on ``x [batch, T, d_model]`` from ``state`` (a prompt's prefill, a chunk of a stream):
    ``(state after the last token, y [batch, T, d_model])``; the convolution continues from ``state["conv"]``,
    the SSM from ``state["ssm"]``. From :meth:`init_state`'s state it is :meth:`__call__`. ``lengths [batch]``:
    right-padded rows (:meth:`~jaxmem.models.mixers.registry.Mixer.scan`)."""
    conv, ssm, y = self._sequence(x_BTD, state["conv"], state["ssm"], lengths=lengths)
    return {"conv": conv, "ssm": ssm}, y

  def step(self, state: dict, x_BD: jax.Array) -> tuple:
    """One token: ``(state, x_t [batch, d_model]) -> (state, y_t [batch, d_model])`` (:meth:`scan` of one)."""
    state, y = self.scan(state, x_BD[:, None])
    return state, y[:, 0]


register("ssd", SSDConfig, Mamba2)
