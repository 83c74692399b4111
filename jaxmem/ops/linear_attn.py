"""fla's ``linear_attn`` ops: ``h_t = h_{t−1} + k_t v_tᵀ``, read ``o_t = scale · h_tᵀ q_t`` (jaxmem's ``hebb``
rule), with fla's optional normaliser ``o_t / (scale · q_t · Σ_{s≤t} k_s + 1e-10)``.

Like fla, ``normalize`` defaults to True for :func:`chunk_linear_attn` and to False for
:func:`fused_recurrent_linear_attn`. With ``normalize=True`` the state is the pair ``(h [N, H, K, V],
z [N, 1, H, K])``, ``z`` the running key sum (fla's layout); the normaliser rides through the kernel as one
more value channel, so it restarts with every sequence of ``cu_seqlens`` / ``segment_ids`` too.

Returns, as fla 0.6: ``normalize=False`` gives ``(o, h or None)``; ``normalize=True`` gives ``(o, (h, z))`` with
``output_final_state=True`` and ``(o, (None, z))`` without it (the key sum is always returned, so a caller can
continue the normaliser). ``initial_state`` is ``h``, ``(h, z)`` or ``(None, z)`` (``h`` = 0). Dtypes, as
fla's: ``h`` in float32 (the accumulation dtype, :mod:`jaxmem.ops.common`), ``z`` in ``k``'s dtype promoted
with the initial ``z``'s (so bfloat16 keys and no initial ``z`` give a bfloat16 ``z``).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from jaxmem.checks import check_floating, shape_of
from jaxmem.kernels.segments import cu_seqlens_to_segment_ids, segment_index
from jaxmem.ops.common import run

_EPS = 1e-10  # fla's: added to the normaliser


def _linear_attn(form, q, k, v, scale, initial_state, output_final_state, normalize, cu_seqlens, segment_ids,
                 reverse, op):
  if reverse:
    raise ValueError(f"{op}: reverse=True is not supported (flip T, and cu_seqlens, before the call).")
  if len(shape_of(q)) == 4 and len(shape_of(v)) == 4 and shape_of(q)[2] != shape_of(v)[2]:
    raise ValueError(f"{op}: `q` and `v` must have the same number of heads (fla's linear attention has no "
                     f"grouped value heads), got {shape_of(q)[2]} and {shape_of(v)[2]}.")
  kw = dict(scale=scale, output_final_state=output_final_state, cu_seqlens=cu_seqlens, segment_ids=segment_ids,
            op=op)
  if not normalize:
    if isinstance(initial_state, tuple):
      raise ValueError(f"{op}: with normalize=False `initial_state` is one array [N, H, K, V], got a tuple.")
    return run("hebb", form, q, k, v, initial_state=initial_state, **kw)
  h0, z0 = initial_state if isinstance(initial_state, tuple) else (initial_state, None)
  B, T, H, K = shape_of(q)
  HV, V = shape_of(v)[2], shape_of(v)[3]
  N = B if cu_seqlens is None else shape_of(cu_seqlens)[0] - 1
  if z0 is not None and shape_of(z0) != (N, 1, H, K):
    raise ValueError(f"{op}: the key sum of `initial_state` (its second element) must have shape "
                     f"[N, 1, H, K] = {(N, 1, H, K)}, got {shape_of(z0)}.")
  check_floating(initial_state=z0)
  if h0 is not None and shape_of(h0) != (N, HV, K, V):
    raise ValueError(f"`initial_state` must have shape [N, H, K, V] = {(N, HV, K, V)}, got {shape_of(h0)}.")
  # fla's z: the key sum in k's dtype, promoted with the initial z's
  z_dtype = jnp.result_type(k) if z0 is None else jnp.promote_types(jnp.result_type(k), jnp.result_type(z0))
  hz0 = None
  if h0 is not None or z0 is not None:  # the key sum rides as one more value channel of the state
    h0 = jnp.zeros((N, HV, K, V), jnp.result_type(z0)) if h0 is None else h0
    z = jnp.zeros((N, HV, K), h0.dtype) if z0 is None else jnp.swapaxes(z0, 1, 2)[:, :, 0]
    hz0 = jnp.concatenate([h0, z.astype(jnp.promote_types(h0.dtype, z.dtype))[..., None]], axis=-1)
  o, S = run("hebb", form, q, k, v, initial_state=hz0, extra_v=1.0, **kw)
  o = (o[..., :-1] / (o[..., -1:] + _EPS)).astype(v.dtype)
  if S is not None:
    return o, (S[..., :-1], jnp.swapaxes(S[..., -1:], -1, -2).swapaxes(1, 2).astype(z_dtype))
  cu = None if cu_seqlens is None else jnp.asarray(cu_seqlens, jnp.int32)
  return o, (None, _key_sum(k, z0, cu, segment_ids, N=N, dtype=z_dtype))


@functools.partial(jax.jit, static_argnames=("N", "dtype"))
def _key_sum(k, z0, cu, segment_ids, *, N, dtype):
  """The final key sum ``z [N, 1, H, K]`` without the state: what the state's key-sum channel holds after the
  last token, ``z0`` plus the keys of each sequence of ``cu``, of each row's last segment (``z0`` only when that
  segment is the row's first: later ones start empty; padding adds nothing), or of each row."""
  acc = jnp.promote_types(k.dtype, jnp.float32)
  k = k.astype(acc)
  keep_z0 = True
  if cu is not None:  # B = 1: token t belongs to sequence ids[t] − 1
    z = jax.ops.segment_sum(k[0], cu_seqlens_to_segment_ids(cu, k.shape[1])[0] - 1, num_segments=N)
  elif segment_ids is not None:
    run_of = segment_index(jnp.asarray(segment_ids, jnp.int32))  # [B, T]: 0, 1, .. per segment, −1 padding
    last = jnp.max(run_of, axis=1)  # the row's last segment (−1: the row is all padding)
    mine = (run_of == last[:, None]) & (run_of >= 0)
    z = jnp.sum(jnp.where(mine[..., None, None], k, 0.0), axis=1)
    keep_z0 = (last <= 0)[:, None, None]
  else:
    z = jnp.sum(k, axis=1)
  if z0 is not None:
    z = z + jnp.where(keep_z0, z0[:, 0].astype(acc), 0.0)
  return z[:, None].astype(dtype)


def chunk_linear_attn(q, k, v, scale: Optional[float] = None, initial_state=None,
                      output_final_state: bool = False,
                      normalize: bool = True, cu_seqlens=None, *, segment_ids=None):
  """fla's ``chunk_linear_attn`` in the chunked form: ``q, k [B, T, H, K]``, ``v [B, T, H, V]``; returns
  ``(o [B, T, H, V], final state)``: ``h`` or None, or with ``normalize`` the pair ``(h, z)`` or ``(None, z)``
  (module docstring). ``scale`` defaults to ``K ** -0.5``. Varlen: ``cu_seqlens [N + 1]`` (``B = 1``) or
  ``segment_ids [B, T]`` (:mod:`jaxmem.ops.common`)."""
  return _linear_attn("chunk", q, k, v, scale, initial_state, output_final_state, normalize, cu_seqlens,
                      segment_ids, False, "chunk_linear_attn")


def fused_recurrent_linear_attn(q, k, v, scale: Optional[float] = None, initial_state=None,
                                output_final_state: bool = False, reverse: bool = False,
                                normalize: bool = False,
                                cu_seqlens=None, *, segment_ids=None):
  """fla's ``fused_recurrent_linear_attn`` in the recurrent form (a ``lax.scan`` of the update); arguments as
  :func:`chunk_linear_attn` (``normalize`` defaults to False, as in fla; ``reverse=True`` is refused)."""
  return _linear_attn("fused_recurrent", q, k, v, scale, initial_state, output_final_state, normalize,
                      cu_seqlens,
                      segment_ids, reverse, "fused_recurrent_linear_attn")
