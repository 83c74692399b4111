"""What the attention-shaped mixers share: ``x -> (q, k, v)`` heads, an optional short
convolution, and the output projection ``W_O`` that mixes the heads' reads.

Read as memory (Tang & Xie 2026, ``docs/papers/sdnc.md``): each head is a read head of a
memory, ``W_O`` mixes the read vectors. Subclasses implement :meth:`QKVMixer.kernel`, the
per-head arithmetic (which calls into :mod:`jaxmem.kernels`), and optionally
:meth:`QKVMixer.gates`, the per-token, per-head inputs it needs from the parameters; the base
class runs the kernel per device under :func:`jaxmem.sharding.map_heads`.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_config_ints
from jaxmem.kernels.segments import check_lengths
from jaxmem.models.layers import CausalConv, constant, linear
from jaxmem.models.mixers.registry import Mixer
from jaxmem.sharding import HEADS_BTH, HEADS_BTHK, constrain_heads, map_heads


def check_short_conv(cfg) -> None:
  check_config_ints(cfg, ("short_conv",), allow_zero=True)


def qkv_heads(cfg, n_heads: int) -> tuple:
  """``(H_q, H_k, H_v)``, the heads of ``q``, ``k`` and ``v``: ``n_heads`` each, except grouped heads —
  ``cfg.n_kv_heads`` (grouped-query attention: fewer key/value heads, each serving ``n_heads / n_kv_heads``
  query heads) or ``cfg.n_qk_heads`` (grouped value heads: fewer query/key heads, each serving
  ``n_heads / n_qk_heads`` value heads, fla's GVA); 0 means ``n_heads``. ``ValueError`` unless they divide
  ``n_heads``."""
  kv, qk = getattr(cfg, "n_kv_heads", 0) or n_heads, getattr(cfg, "n_qk_heads", 0) or n_heads
  for name, h in (("n_kv_heads", kv), ("n_qk_heads", qk)):
    if n_heads % h:
      raise ValueError(f"{type(cfg).__name__}.{name}={h} must divide n_heads={n_heads}.")
  return qk, min(kv, qk), kv


def qkv_state_floats(cfg, d_model: int, n_heads: int = 1) -> int:
  """What a :class:`QKVMixer`'s short convolution carries between tokens: the last ``K − 1`` of its input
  channels (``(H_q + H_k + H_v)·d_model / n_heads``; 0 without one)."""
  K = getattr(cfg, "short_conv", 0)
  return (K - 1) * sum(qkv_heads(cfg, n_heads)) * (d_model // n_heads) if K else 0


def gate_projection(d_model: int, width: int, bias, *, dtype, rngs: nnx.Rngs,
                    axis: str | None = "heads") -> nnx.Linear:
  """A per-token gate ``W x + b`` with ``W = 0`` at init, so the gate starts at ``bias``; its ``width``
  outputs have the logical ``axis`` (``"heads"``: one per head, or whole heads)."""
  return linear(d_model, width, ("embed", axis), dtype=dtype, rngs=rngs, kernel_init=nnx.initializers.zeros,
                bias_init=constant(jnp.asarray(bias, jnp.float32)))


class QKVMixer(Mixer):
  """``x [B, T, D] -> W_O · kernel(q, k, v, **gates(x))`` with ``q, k, v [B, T, H, D/H]`` from one projection.

  A subclass implements :meth:`kernel`, the memory's arithmetic on ``[B, T, H, K]`` blocks of heads, and,
  when the memory needs per-token inputs computed from parameters (write strengths, decays, read modes),
  :meth:`gates`. The split is what lets the base class, in this one place, run every kernel through
  :func:`jaxmem.sharding.map_heads`: under a mesh the kernel runs inside ``jax.shard_map`` on each device's
  own batch rows and heads, so whatever reads a parameter happens before it, in :meth:`gates` on the whole
  activations, and the kernel sees per-head arrays only (no parameter, no other device's heads).

  ``cfg.short_conv = K > 0`` applies a :class:`~jaxmem.models.layers.CausalConv` of width ``K`` (identity at
  initialisation) to ``q, k, v``
  after the projection. Subclasses create their extra projections *after* calling
  ``super().__init__`` (parameter initialisation draws from ``rngs`` in creation order).
  """

  def __init__(self, cfg, *, d_model: int, n_heads: int, n_layers: int, dtype: str, rngs: nnx.Rngs):
    if d_model % n_heads:
      raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}.")
    self.cfg = cfg
    self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
    self.n_q_heads, self.n_k_heads, self.n_v_heads = qkv_heads(cfg, n_heads)
    width = (self.n_q_heads + self.n_k_heads + self.n_v_heads) * self.head_dim
    dt = jnp.dtype(dtype)
    self.qkv = linear(d_model, width, ("embed", "heads"), use_bias=False, dtype=dt, rngs=rngs)
    self.out = linear(d_model, d_model, ("heads", "embed"), use_bias=False, dtype=dt, rngs=rngs,
                      kernel_init=nnx.initializers.normal(0.02 / (2 * n_layers) ** 0.5))
    self.conv = nnx.data(CausalConv(cfg.short_conv, width, rngs=rngs) if cfg.short_conv else None)

  def gate(self, width: int, bias, rngs: nnx.Rngs, axis: str | None = "heads") -> nnx.Linear:
    return gate_projection(self.d_model, width, bias, dtype=self.qkv.dtype, rngs=rngs, axis=axis)

  def heads(self, x_BTD: jax.Array, segment_ids=None):
    """``(q, k, v)``, each ``[B, T, H, D/H]`` (heads over the mesh's ``model`` axis when one is set); the short
    convolution stays inside each segment of ``segment_ids``."""
    B, T, _ = x_BTD.shape
    qkv = self.qkv(x_BTD)
    if self.conv is not None:
      qkv = self.conv(qkv, segment_ids)
    return constrain_heads(*self._split(qkv))

  def _split(self, qkv_BTW: jax.Array) -> tuple:
    """The projection's output ``[B, T, (H_q + H_k + H_v)·K]`` as ``q, k, v [B, T, H_·, K]``."""
    B, T, _ = qkv_BTW.shape
    hq, hk = self.n_q_heads * self.head_dim, self.n_k_heads * self.head_dim
    parts = (qkv_BTW[..., :hq], qkv_BTW[..., hq:hq + hk], qkv_BTW[..., hq + hk:])
    return tuple(p.reshape(B, T, -1, self.head_dim) for p in parts)

  def gates(self, x_BTD: jax.Array) -> dict:
    """The kernel's keyword inputs computed from parameters: ``name -> [B, T, H]`` (one per head),
    ``[B, T, H, C]`` (``C`` per head) or None (the input is off). No gates by default (``{}``)."""
    return {}

  def kernel(self, q_BTHK, k_BTHK, v_BTHK, *, segment_ids=None, **gates) -> jax.Array:
    """The read ``o [B, T, H, K_v]``: arithmetic only, on any block of batch rows and heads (under a mesh it
    sees one device's), so it reads no parameter (those go through :meth:`gates`) and never mixes heads or
    batch rows. ``segment_ids [B, T]`` (or None): packed sequences, nothing crosses a segment boundary
    (:mod:`jaxmem.kernels.segments`)."""
    raise NotImplementedError(f"{type(self).__name__} does not implement the per-head kernel.")

  # -- decoding: the base class carries the short convolution's tail, a subclass the kernel's own state ------

  def kernel_init(self, batch_size: int, max_len: int) -> Any:
    """The kernel's decoding state before the first token (a pytree: a KV cache with its lengths, a matrix
    memory, ...), for sequences of up to ``max_len`` tokens. A subclass that decodes implements this and
    :meth:`kernel_scan`."""
    raise NotImplementedError(f"{type(self).__name__} has no token-by-token decoding "
                              "(kernel_init / kernel_scan).")

  def kernel_scan(self, kstate, q_BTHK, k_BTHK, v_BTHK, *, lengths=None, **gates) -> tuple:
    """The kernel from a state: ``(kstate, q, k, v [B, T, H, K], gates) -> (kstate after the last token,
    o [B, T, H, K_v])``, equal to :meth:`kernel` when ``kstate`` is :meth:`kernel_init`'s. ``lengths [B]`` (or
    None): right-padded rows, row ``b``'s ``kstate`` is the one after its first ``lengths[b]`` tokens
    (:meth:`~jaxmem.models.mixers.registry.Mixer.scan`)."""
    raise NotImplementedError(f"{type(self).__name__} has no token-by-token decoding "
                              "(kernel_init / kernel_scan).")

  def kernel_state_axes(self, kstate) -> Any:
    """The logical axes of :meth:`kernel_init`'s pytree (a tuple per array), so that :meth:`scan` runs
    :meth:`kernel_scan` per device under :func:`jaxmem.sharding.map_heads` like :meth:`__call__`. The default
    names a KV cache (:func:`jaxmem.kernels.attention.kv_cache_init`: ``k``, ``v`` ``[B, max_len, H, K]``,
    ``length [B]``, and an optional ``presence [B, max_len, H]``); a mixer with another state overrides it."""
    known = {"k": KV_BLHK, "v": KV_BLHK, "length": ("batch",), "presence": ("batch", None, "heads")}
    if not (isinstance(kstate, dict) and set(kstate) <= set(known)):
      raise NotImplementedError(f"{type(self).__name__}: give the logical axes of its decoding state "
                                "(kernel_state_axes).")
    return {name: known[name] for name in kstate}

  @classmethod
  def decodes(cls) -> bool:
    return cls.kernel_scan is not QKVMixer.kernel_scan

  @classmethod
  def scans(cls) -> bool:
    return cls.decodes()

  def init_state(self, batch_size: int, max_len: int) -> dict:
    """``{"conv": the short convolution's last K − 1 inputs [B, K − 1, 3·d_model] (None without one),
    "kernel": kernel_init(...)}``."""
    conv = None if self.conv is None else self.conv.init_tail(batch_size, self.qkv.dtype or jnp.float32)
    return {"conv": conv, "kernel": self.kernel_init(batch_size, max_len)}

  def scan(self, state: dict, x_BTD: jax.Array, lengths=None) -> tuple:
    B, T, _ = x_BTD.shape
    if lengths is not None:
      if "lengths" not in inspect.signature(self.kernel_scan).parameters:
        raise ValueError(f"{type(self).__name__}.kernel_scan takes no `lengths`: this mixer cannot prefill "
                         "right-padded rows of different lengths in one call.")
      lengths = check_lengths(lengths, B, T)
    qkv = self.qkv(x_BTD)
    conv = state["conv"]
    if self.conv is not None:
      conv, qkv = self.conv.scan(conv, qkv, lengths)
    q, k, v = constrain_heads(*self._split(qkv))
    gates = self.gates(x_BTD)
    kstate = state["kernel"]
    leaves, treedef = jax.tree.flatten(kstate)
    state_axes = jax.tree.leaves(self.kernel_state_axes(kstate), is_leaf=lambda a: isinstance(a, tuple))
    names, n = tuple(gates), len(leaves)

    def fn(*args):
      ks = jax.tree.unflatten(treedef, args[:n])
      rows = {} if args[n + 3] is None else {"lengths": args[n + 3]}
      return self.kernel_scan(ks, *args[n:n + 3], **rows, **dict(zip(names, args[n + 4:], strict=True)))

    axes = (tuple(state_axes) + (HEADS_BTHK,) * 3 + (("batch",),)
            + tuple(_gate_axes(m, g) for m, g in gates.items()))
    out_axes = (jax.tree.unflatten(treedef, state_axes), HEADS_BTHK)
    # per device: its own batch rows and heads (jaxmem.sharding.map_heads), when a mesh is set
    kstate, o = map_heads(fn, (*leaves, q, k, v, lengths, *gates.values()), axes, out_axes)
    o = constrain_heads(o)
    return {"conv": conv, "kernel": kstate}, self.out(o.reshape(B, T, self.d_model))

  def step(self, state: dict, x_BD: jax.Array) -> tuple:
    state, y = self.scan(state, x_BD[:, None])
    return state, y[:, 0]

  def __call__(self, x_BTD: jax.Array, segment_ids=None) -> jax.Array:
    B, T, _ = x_BTD.shape
    if segment_ids is not None and "segment_ids" not in inspect.signature(self.kernel).parameters:
      raise ValueError(f"{type(self).__name__}.kernel takes no `segment_ids`: this mixer cannot read packed "
                       "sequences.")
    q, k, v = self.heads(x_BTD, segment_ids)
    gates = self.gates(x_BTD)
    names = tuple(gates)

    def fn(q, k, v, segment_ids, *g):
      gates = dict(zip(names, g, strict=True))
      if segment_ids is None:  # a kernel written before packed sequences need not take them
        return self.kernel(q, k, v, **gates)
      return self.kernel(q, k, v, segment_ids=segment_ids, **gates)

    axes = (HEADS_BTHK,) * 3 + (SEGMENTS_BT,) + tuple(_gate_axes(n, g) for n, g in gates.items())
    # per device: its own batch rows and heads (jaxmem.sharding.map_heads), when a mesh is set
    o_BTHK = constrain_heads(map_heads(fn, (q, k, v, segment_ids, *gates.values()), axes, HEADS_BTHK))
    return self.out(o_BTHK.reshape(B, T, self.d_model))


KV_BLHK = ("batch", None, "heads", "head_dim")   # a KV cache: rows and heads split, positions not
SEGMENTS_BT = ("batch", "length")                # segment ids: split with the batch rows


def _gate_axes(name: str, g):
  """The logical axes of a gate from its rank: ``[B, T, H]`` or ``[B, T, H, C]`` (None: no input)."""
  if g is None:
    return None
  if g.ndim == 3:
    return HEADS_BTH
  if g.ndim == 4:
    return ("batch", "length", "heads", None)
  raise ValueError(f"gate {name!r} must be [B, T, H] or [B, T, H, C], got shape {tuple(g.shape)}.")
