"""What the fla-named ops share: fla's layouts, gates and varlen forms mapped onto
:func:`jaxmem.kernels.assoc.associative_memory`.

fla (flash-linear-attention) layouts: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]`` (``HV`` a multiple of ``H``),
per-token gates ``[B, T, HV]``, the state ``h [N, HV, K, V]`` ("key-first"; ``state_v_first=True`` is ``[N, HV,
V, K]``, jaxmem's own layout). Varlen: ``cu_seqlens [N + 1]`` with ``B = 1`` (sequence ``n`` is tokens
``cu_seqlens[n]:cu_seqlens[n + 1]``, with its own ``initial_state[n]`` and final state), or jaxmem's
``segment_ids [B, T]`` (:mod:`jaxmem.kernels.segments`; ``initial_state`` and the final state per row).

How a call runs: the checks (shapes, dtypes, and ``cu_seqlens`` / ``segment_ids`` when concrete), then
one compiled program: gates, ``q·scale``, L2 norms, and the kernel in the op's form (``chunk_*`` → ``chunked``,
``fused_recurrent_*`` → ``recurrent``). ``cu_seqlens`` (a list or an integer array) without states is the
packed row itself with a segment per sequence; with ``initial_state`` or ``output_final_state`` each sequence
starts from its own state and ends in its own, still in one pass over the packed row: every sequence gets chunks
of its own, which the chunked form runs as UT / WY chunks and the recurrent form token by token
(``jaxmem/kernels/assoc/varlen.py``; measurements in ``jaxmem/ops/README.md``). The shapes depend on ``T`` and
``N`` only, so a traced ``cu_seqlens`` works under ``jit`` and new lengths do not compile again.

The final state is in the accumulation dtype, float32 (float64 when an input or ``initial_state`` is float64),
whatever the dtype of the inputs and of ``initial_state``, as fla's (its kernels read ``h0`` into float32 and
write the final state as float32): bf16 inputs give a float32 state.

Stability, as in fla: the erasing rules (delta, gated delta, Oja) need ``0 <= β_t‖k_t‖² <= 2`` (``‖v_t‖²`` for
Oja) or the state grows without bound, and like fla's the ops do not check it, eagerly or under ``jit`` (a
check could only run on concrete inputs, so the same call would raise outside ``jit`` and diverge inside it).
The guard is by construction: ``use_qk_l2norm_in_kernel=True`` makes ``‖k_t‖ < 1``, and ``β`` in ``[0, 1]``
(``use_beta_sigmoid_in_kernel=True``; ``[0, 2)`` with ``allow_neg_eigval``) keeps the product in range; for
Oja normalise ``v`` (``use_k_l2norm`` normalises ``k``, not the erase vector ``v``).
:func:`jaxmem.kernels.assoc.associative_memory` keeps its own eager check.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from jaxmem.checks import (
  check_equal,
  check_finite_number,
  check_floating,
  check_positive_int,
  check_rank,
  shape_of,
)
from jaxmem.kernels.assoc import (
  DECAY_RULES,
  associative_memory,
  check_grouped_heads,
  l2_normalize,
)
from jaxmem.kernels.segments import check_cu_seqlens, check_segment_ids

FORMS = {"chunk": "chunked", "fused_recurrent": "recurrent"}


def check_gate(name: str, x, shape: tuple, layout: str) -> None:
  if x is None:
    return
  if shape_of(x) != shape:
    raise ValueError(f"`{name}` must have shape [{layout}] = {shape}, got {shape_of(x)}.")
  check_floating(**{name: x})


def check_head_vector(name: str, x, HV: int) -> None:
  if x is not None and shape_of(x) != (HV,):
    raise ValueError(f"`{name}` must have shape [HV] = {(HV,)} (one value per value head), got {shape_of(x)}.")
  check_floating(**{name: x})


def gdn_gate(g, A_log, dt_bias):
  """Gated DeltaNet's decay in log space, ``−exp(A_log) · softplus(g + dt_bias)`` (fla's
  ``use_gate_in_kernel``), in float32."""
  g = g.astype(jnp.promote_types(g.dtype, jnp.float32))
  per_head = lambda x: x.astype(g.dtype).reshape((1,) * (g.ndim - 1) + (-1,))  # [HV] against [..., HV]
  if dt_bias is not None:
    g = g + per_head(dt_bias)
  return -jnp.exp(per_head(A_log)) * jax.nn.softplus(g)


def check_qkv(q, k, v, initial_state=None) -> tuple:
  """fla's layouts ``q, k [B, T, H, K]``, ``v [B, T, HV, V]`` (``HV`` a multiple of ``H``), floating inputs,
  ``T ≥ 1``: ``(B, T, H, K, HV, V)``, else ``ValueError`` naming the argument."""
  B, T, H, K = check_rank("q", q, 4, "B, T, H, K")
  Bk, Tk, Hk, Kk = check_rank("k", k, 4, "B, T, H, K")
  Bv, Tv, HV, V = check_rank("v", v, 4, "B, T, HV, V")
  check_equal("batch sizes", q=B, k=Bk, v=Bv)
  check_equal("lengths", q=T, k=Tk, v=Tv)
  check_equal("numbers of heads", q=H, k=Hk)
  check_equal("key widths", q=K, k=Kk)
  check_grouped_heads(H, HV)
  check_floating(q=q, k=k, v=v, initial_state=initial_state)
  if T == 0:
    raise ValueError(f"`q` must have at least one time step, got shape {shape_of(q)}.")
  return B, T, H, K, HV, V


def run(rule: str, form: str, q, k, v, *, beta=None, g=None, scale: Optional[float] = None,
        initial_state=None, output_final_state: bool = False, cu_seqlens=None, segment_ids=None,
        chunk_size: int = 64, state_v_first: bool = False, q_l2norm: bool = False, k_l2norm: bool = False,
        beta_sigmoid: bool = False, beta_max: float = 1.0, A_log=None, dt_bias=None, extra_v=None,
        op: str = "op"):
  """One fla-named op: ``(o [B, T, HV, V], final state or None)``; see the module docstring.

  ``g``: log-decay ``[B, T, HV]`` (the raw gate with ``A_log``, see :func:`gdn_gate`); ``beta`` ``[B, T, HV]``
  (logits when ``beta_sigmoid``: ``β = beta_max · σ(beta)``); ``extra_v``: a value column appended to every
  value head inside the program (linear attention's normaliser), returned as part of ``o`` and the state.
  """
  if form not in FORMS:
    raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}.")
  B, T, H, K, HV, V = check_qkv(q, k, v, initial_state)
  chunk_size = check_positive_int("chunk_size", chunk_size)
  scale = K ** -0.5 if scale is None else check_finite_number("scale", scale)
  check_gate("beta", beta, (B, T, HV), "B, T, HV")
  check_gate("g", g, (B, T, HV), "B, T, HV")
  check_head_vector("A_log", A_log, HV)
  check_head_vector("dt_bias", dt_bias, HV)

  if cu_seqlens is not None and segment_ids is not None:
    raise ValueError("pass `cu_seqlens` (fla's varlen form, B = 1) or `segment_ids` [B, T], not both.")
  N = B
  if cu_seqlens is not None:
    if B != 1:
      raise ValueError(f"with `cu_seqlens` the batch size must be 1 (sequences packed along T), got B = {B}; "
                       "flatten the batch, or pass `segment_ids` [B, T] instead.")
    cu_seqlens = check_cu_seqlens(cu_seqlens, T)
    N = shape_of(cu_seqlens)[0] - 1
  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, B, T)
  Vs = V + (extra_v is not None)  # the state's value width (the appended channel included)
  state_shape = (N, HV, Vs, K) if state_v_first else (N, HV, K, Vs)
  if initial_state is not None and shape_of(initial_state) != state_shape:
    what = "N sequences" if cu_seqlens is not None else "B rows"
    raise ValueError(f"`initial_state` must have shape [N, HV, {'V, K' if state_v_first else 'K, V'}] = "
                     f"{state_shape} ({what}), got {shape_of(initial_state)}.")
  if rule in DECAY_RULES and g is None:
    raise ValueError(f"{op} needs the decay `g` [B, T, HV] (log space).")
  # no stability check of the erasing rules (β‖k‖² <= 2), as fla: the module docstring says why
  if extra_v is not None:
    extra_v = jnp.asarray(extra_v)
  return _program(q, k, v, beta, g, A_log, dt_bias, initial_state, cu_seqlens, segment_ids, extra_v,
                  rule=rule, mode=FORMS[form], scale=float(scale), chunk_size=chunk_size,
                  final=bool(output_final_state), state_v_first=bool(state_v_first), q_l2norm=bool(q_l2norm),
                  k_l2norm=bool(k_l2norm), beta_sigmoid=bool(beta_sigmoid), beta_max=float(beta_max))


@functools.partial(jax.jit, static_argnames=("rule", "mode", "scale", "chunk_size", "final", "state_v_first",
                                             "q_l2norm", "k_l2norm", "beta_sigmoid", "beta_max"))
def _program(q, k, v, beta, g, A_log, dt_bias, h0, cu, segment_ids, extra_v, *, rule, mode, scale, chunk_size,
             final, state_v_first, q_l2norm, k_l2norm, beta_sigmoid, beta_max):
  acc = jnp.promote_types(jnp.result_type(q, k, v), jnp.float32)
  out_dtype = v.dtype
  q, k = q.astype(acc), k.astype(acc)
  if q_l2norm:
    q = l2_normalize(q)
  if k_l2norm:
    k = l2_normalize(k)
  q = q * scale
  if beta is not None and beta_sigmoid:
    beta = beta_max * jax.nn.sigmoid(beta.astype(acc))
  if g is not None and A_log is not None:
    g = gdn_gate(g, A_log, dt_bias)
  if extra_v is not None:  # e.g. a column of ones: the normaliser Σ q·k rides along as one more value channel
    v = jnp.concatenate([v.astype(acc), jnp.broadcast_to(extra_v.astype(acc), v.shape[:-1] + (1,))], axis=-1)
  # fla's final state is float32 whatever the inputs' and h0's dtypes: h0 enters in the accumulation dtype
  S0 = None if h0 is None else (h0 if state_v_first else jnp.swapaxes(h0, -1, -2))
  S0 = None if S0 is None else S0.astype(jnp.promote_types(acc, S0.dtype))
  # cu_seqlens: a segment per sequence, or with states (initial or final) a state per sequence, in one pass
  # over the packed row either way (jaxmem/kernels/assoc/varlen.py)
  out = associative_memory(q, k, v, beta, rule=rule, mode=mode, chunk_size=chunk_size,
                           log_decay=g if rule in DECAY_RULES else None, initial_state=S0, return_state=final,
                           segment_ids=segment_ids, cu_seqlens=cu)
  o, S = out if final else (out, None)
  if extra_v is None:
    o = o.astype(out_dtype)
  if not final:
    return o, None
  return o, (S if state_v_first else jnp.swapaxes(S, -1, -2))


__all__ = ["FORMS", "check_gate", "check_head_vector", "check_qkv", "gdn_gate", "run"]
