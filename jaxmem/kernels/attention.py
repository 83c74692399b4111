"""Softmax attention: the write-once memory that every other memory is compared with.

Layout: public functions take ``[B, T, H, D]`` arrays (batch, time, heads, features).
The arithmetic is written once per head on ``[T, D]`` arrays (:func:`attention_head`)
and vmapped over heads and batch.

Equation (Vaswani et al. 2017, eq. 1)::

    o_i = sum_j softmax_j(s · q_i·k_j + mask_ij) v_j,   s = 1/sqrt(D_k) by default,

with ``mask_ij = 0`` where key ``j`` is visible to query ``i`` (``j <= i`` when causal) and
a large negative finite number elsewhere, so that no row ever becomes NaN.
Logits, the softmax and the weighted sum accumulate in float32 (float64 for float64
inputs); the output has the
dtype of ``v``.

Precision: ``precision=`` is passed to both matmuls (:mod:`jaxmem.kernels.precision`).
The default ``None`` is the platform's default, as in every mainstream attention kernel:
bfloat16 operands on TPU, TF32 on recent GPUs (logits then carry ~1e-2 / ~1e-3 relative
error); pass ``"highest"`` for float32 operands everywhere.

Invariant tested (tests/kernels/test_attention.py): equals ``jax.nn.dot_product_attention``
and an independent numpy loop, values and gradients, on odd ``T`` and ``D``, for self-
and cross-attention.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from jaxmem.checks import check_equal, check_finite_number, check_floating, check_rank
from jaxmem.kernels.precision import Matmul, matmul_for

# Large negative *finite* logit for masked slots: exp underflows to exactly 0 while a
# fully masked row stays finite (uniform weights) instead of becoming NaN.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_PLATFORM_DEFAULT = Matmul(None)


def attention_head(
    q_TD: jax.Array,
    k_SD: jax.Array,
    v_SE: jax.Array,
    *,
    causal: bool,
    scale: float,
    dot: Matmul = _PLATFORM_DEFAULT,
) -> jax.Array:
  """One head of softmax attention on ``q [T, D]``, ``k [S, D]``, ``v [S, E]`` -> ``[T, E]``."""
  acc = jnp.promote_types(jnp.result_type(q_TD, k_SD, v_SE), jnp.float32)  # >= float32
  logits_TS = dot.einsum(
      "td,sd->ts", q_TD, k_SD, preferred_element_type=acc
  ) * jnp.asarray(scale, acc)
  if causal:
    t_idx = jnp.arange(q_TD.shape[0])[:, None]
    s_idx = jnp.arange(k_SD.shape[0])[None, :]
    logits_TS = jnp.where(s_idx <= t_idx, logits_TS, MASK_VALUE)
  weights_TS = jax.nn.softmax(logits_TS, axis=-1)
  out_TE = dot.einsum(
      "ts,se->te", weights_TS, v_SE.astype(acc), preferred_element_type=acc,
  )
  return out_TE.astype(v_SE.dtype)


def check_qkv(q, k, v, *, heads: str = "numbers of heads",
              floating: bool = False) -> tuple[int, int, int, int, int]:
  """Validates ``q [B, T, H, D]``, ``k [B, S, H, D]``, ``v [B, S, H, E]``; returns (B, T, H, D, S).

  ``floating=True`` also requires floating dtypes (:func:`jaxmem.checks.check_floating`), for kernels whose
  output takes the dtype of ``v`` (an integer ``v`` would truncate the weighted average)."""
  B, T, H, D = check_rank("q", q, 4, "B, T, H, D")
  Bk, S, Hk, Dk = check_rank("k", k, 4, "B, S, H, D")
  Bv, Sv, Hv, _ = check_rank("v", v, 4, "B, S, H, E")
  check_equal("batch sizes", q=B, k=Bk, v=Bv)
  check_equal(heads, q=H, k=Hk, v=Hv)
  check_equal("key widths", q=D, k=Dk)
  check_equal("key/value lengths", k=S, v=Sv)
  if floating:
    check_floating(q=q, k=k, v=v)
  return B, T, H, D, S


def softmax_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    precision: Any = None,
) -> jax.Array:
  """Multi-head softmax attention.

  Args:
    q: queries ``[B, T, H, D]``.
    k: keys ``[B, S, H, D]``; ``S`` may differ from ``T`` only when ``causal=False``
      (cross-attention).
    v: values ``[B, S, H, E]``; the value width ``E`` may differ from ``D``.
    causal: if True, query ``t`` sees keys ``0..t`` only (requires ``S == T``).
    scale: logit scale; ``1/sqrt(D)`` when None.
    precision: matmul precision (:mod:`jaxmem.kernels.precision`); None: platform default.

  Returns:
    ``[B, T, H, E]`` in the dtype of ``v``.

  Raises:
    ValueError: on wrong ranks, non-floating dtypes, mismatched batch/heads/feature/length sizes, a causal
      call with ``S != T``, a non-finite ``scale``, or an unknown ``precision``.
  """
  dot = matmul_for(precision)
  _, T, _, D, S = check_qkv(q, k, v, floating=True)
  if causal and S != T:
    raise ValueError(
        f"causal attention needs equal query and key lengths, got q length {T} and "
        f"k length {S}; pass causal=False for cross-attention."
    )
  scale = D ** -0.5 if scale is None else check_finite_number("scale", scale)

  head = lambda q_, k_, v_: attention_head(q_, k_, v_, causal=causal, scale=scale, dot=dot)
  over_heads = jax.vmap(head, in_axes=1, out_axes=1)  # [T, H, D] -> [T, H, E]
  return jax.vmap(over_heads)(q, k, v)  # over batch
