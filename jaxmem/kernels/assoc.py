"""Associative matrix memory: Hebb, delta, Oja and decaying (gated) updates, read ``S q``.

The Pavlovian reading of attention (see ``shared/papers/pavlovian.md``): keys are
conditioned stimuli, values unconditioned stimuli, and the forward pass binds them into
an associative matrix that a query reads. Layout pinned here once:

* state ``S [D_v, D_k]`` per head ("US × CS"), ``[B, H, D_v, D_k]`` for a batch;
* **read after write**: ``o_t = S_t q_t``;
* public arrays ``q, k [B, T, H, D_k]``, ``v [B, T, H, D_v]``, ``beta, decay [B, T, H]``.

Rules (``rule=``), with ``β_t`` the write strength and ``γ_t ∈ (0, 1]`` the decay:

* ``hebb``: ``S_t = S_{t−1} + β_t v_t k_tᵀ`` (linear attention when β=1)
* ``delta``: ``S_t = S_{t−1} + β_t (v_t − S_{t−1} k_t) k_tᵀ``
* ``oja``: ``S_t = S_{t−1} + β_t (v_t k_tᵀ − v_t v_tᵀ S_{t−1})``
* ``decay``: ``S_t = γ_t S_{t−1} + β_t v_t k_tᵀ``
* ``gated_delta``: ``S_t = γ_t S_{t−1} + β_t (v_t − γ_t S_{t−1} k_t) k_tᵀ`` (decay then delta,
  as in Gated DeltaNet)

Sources: Hebb = linear attention (Katharopoulos et al. 2020; Schlag, Irie & Schmidhuber
2021); delta = DeltaNet (Schlag et al. 2021); Oja as jaxmem's subspace form
in the digest (Oja 1982 with the US as post-synaptic signal); decay = RetNet / gated
linear attention (Sun et al. 2023, Yang et al. 2024); gated delta = Gated DeltaNet
(Yang, Kautz & Hatamizadeh 2025).

Execution forms (``mode=``), all equal up to float rounding (tested):

========== ===== ===== ===== ===== ===========
mode       hebb  delta oja   decay gated_delta
========== ===== ===== ===== ===== ===========
recurrent  yes   yes   yes   yes   yes
parallel   yes   yes   no    yes   yes
chunked    yes   yes   yes   yes   yes
========== ===== ===== ===== ===== ===========

* ``recurrent``: ``lax.scan`` over time per head, the literal equations; the reference
  and the inference form (see also :func:`init_state` and :func:`step`).
* ``parallel``: hebb/decay as the masked quadratic form
  ``O = ((Q Kᵀ) ⊙ M ⊙ causal)(β ⊙ V) + diag(G) Q S̃_0`` with ``M_ti = G_t / G_i``,
  ``G_t = Π_{s≤t} γ_s`` taken as ``exp`` of a cumulative log-decay masked *before* ``exp``;
  delta/gated_delta as the chunked UT form below with one chunk spanning the whole
  sequence (an ``O(T²)`` memory, ``O(T³)`` triangular solve). Oja has no parallel form here
  (``ValueError``); its one-chunk form is ``mode="chunked", chunk_size=T``.
* ``chunked``: intra-chunk parallel + ``lax.scan`` over chunks (Yang et al. 2024,
  "Parallelizing Linear Transformers with the Delta Rule over Sequence Length": the
  WY / UT transform; the digest's construction). In the key×value layout ``S̃ = Sᵀ``
  (``o_t = S̃_tᵀ q_t``) a gated delta chunk with rows ``Q, K, V``, betas ``β``, and
  in-chunk cumulative log-decays ``g`` (``G = exp g``, ``Γ_ti = exp(g_t − g_i)`` for
  ``i ≤ t``) is::

      A = tril(diag(β) (K Kᵀ ⊙ Γ), −1),   T = (I + A)^{-1}  (unit lower triangular)
      W = T diag(β G) K,                   U = T diag(β) V
      Δ = U − W S̃_0                         (the effective writes "V'")
      O = diag(G) Q S̃_0 + (tril(Q Kᵀ) ⊙ Γ) Δ
      S̃_C = G_C S̃_0 + (diag(G_C / G) K)ᵀ Δ     (G_C / G as exp(g_C − g), never a division)

  Derivation: write ``S̃_t = G_t S̃_0 + Σ_{i≤t} (G_t/G_i) k_i δ_iᵀ``; the delta rule gives
  ``δ_t = β_t (v_t − G_t S̃_0ᵀ k_t − Σ_{i<t} Γ_ti (k_tᵀ k_i) δ_i)``, i.e. ``(I + A) Δ =
  diag(β)(V − diag(G) K S̃_0)``. ``delta`` is ``G = 1``; ``decay`` is ``W = 0, Δ = β V``;
  ``hebb`` both. ``T`` is formed by recursive block inversion
  (:func:`unit_lower_inverse`, matmuls only) and everything that does not depend on the
  state (Gram matrices, ``T``, ``W``, ``U``, the reads) is batched over chunks outside
  the sequential part, whose body is two small matmuls (``W S̃`` and ``Kᵀ Δ``) per chunk.
  Hebb and decay need no inverse and their sequential part is elementwise.

  Oja is the same construction with the roles of keys and values exchanged: in the
  ``S [D_v, D_k]`` layout ``S_t = (I − β_t v_t v_tᵀ) S_{t−1} + β_t v_t k_tᵀ`` is the delta
  rule with write-key ``v`` and write-value ``k``, so ``A = tril(diag(β) V Vᵀ, −1)``,
  ``W = T diag(β) V``, ``U = T diag(β) K``, ``Δ = U − W S_0``, ``S_C = S_0 + Vᵀ Δ``; only
  the read differs: ``O = Q S_0ᵀ + tril(Q Δᵀ) V``.

  A length ``T`` that is not a multiple of ``chunk_size`` is padded at the end with
  ``β = 0``, zero keys/values/queries and ``γ = 1`` (which leave the state unchanged) and
  the output is sliced back. ``chunk_size`` larger than ``T`` means one chunk of ``T``.
* ``auto``: ``chunked`` whenever gradients are taken (any platform) and on accelerators;
  ``recurrent`` for a forward-only call on CPU. "Gradients are taken" is decided by JAX
  itself: ``auto`` is a ``jax.custom_jvp`` whose primal is the forward-fastest form and
  whose JVP is the chunked form's, so ``jax.grad``/``jax.jvp`` (and anything built on
  them) differentiate the chunked form while a plain call runs the fast forward. The rule
  comes from ``jaxmem bench assoc`` and a shape sweep on the project's 2-core CPU (delta
  rule, D=64): a forward-only recurrent scan was 1.2-2.6× faster than chunked at every
  measured shape (B·H from 1 to 128, T from 64 to 8192), while chunked forward+backward
  was ~10× faster than the recurrent one from T=512 on; on GPU/TPU a per-token scan is
  latency-bound, so chunked throughout (the speed-ups the digest cites). Re-measured after
  the chunked form stopped copying its ``B = 1`` inputs (see :func:`chunked`): at ``B=1,
  H=8`` recurrent was still ~2× faster for ``T ≤ 2048`` and the two were within ~10% of
  each other at ``T=8192`` (on a loaded machine), so CPU forward stays ``recurrent``.

Stability guard: for ``delta``/``gated_delta`` the erase factor ``I − β_t k_t k_tᵀ`` has
eigenvalue ``1 − β_t‖k_t‖²`` along ``k_t``; outside ``0 ≤ β_t‖k_t‖² ≤ 2`` the state (and the
UT inverse) grows geometrically. For ``oja`` the factor is ``I − β_t v_t v_tᵀ``, so the
bound is on ``β_t‖v_t‖²``. When ``beta`` and the keys (values for oja) are concrete
(eager calls, not under ``jit``/``grad`` tracing) a violation raises ``ValueError``;
traced values cannot be checked. ``normalize_keys=True`` L2-normalises keys inside the
kernel (``k / sqrt(‖k‖² + 1e-6)``), which makes any ``β ∈ [0, 2]`` safe for the
delta rules — the recommended setting for models (as in DeltaNet).

Numerics: every form accumulates in float32 (float64 for float64 inputs); the output has
the dtype of ``v``, the returned state is float32 (float64).

Invariants tested (tests/kernels/test_assoc.py): every mode equals an independent
float64 numpy loop over tokens, outputs and final states, for every rule; gradients
agree across modes and with finite differences; hebb parallel equals causal linear
attention; chunked with an initial state equals recurrent with it; :func:`step` over a
sequence equals the sequence form; odd ``T`` and ``D``; long sequences stay finite.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem._checks import check_choice, check_equal, check_positive_int, check_rank, shape_of

RULES = ("hebb", "delta", "oja", "decay", "gated_delta")
MODES = ("auto", "recurrent", "parallel", "chunked")
DECAY_RULES = ("decay", "gated_delta")
# Rules whose update multiplies the state by (I − β a aᵀ) and so need β‖a‖² in [0, 2].
ERASE_RULES = ("delta", "gated_delta", "oja")

# Masked (future) log-decay differences become this before exp: exp underflows to 0
# without inf arithmetic (the masked branch gets no gradient through jnp.where).
_LOG_MASK = -1e30
_NORM_EPS = 1e-6
# float32 slack on the stability bound: β = 2 with L2-normalised float32 keys is allowed.
_STABILITY_SLACK = 1e-4


def l2_normalize(x: jax.Array) -> jax.Array:
  """``x / ‖x‖₂`` over the last axis (``+ 1e-6`` under the root): the ``normalize_keys`` guard."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _NORM_EPS)


def _acc_dtype(*xs) -> Any:
  return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


# ----------------------------------------------------------------------------------------
# Recurrent form: the literal equations, one token per scan step (state S [D_v, D_k]).


def _update(rule: str, S_VK, k_K, v_V, b, g):
  """One write of ``rule`` on ``S [D_v, D_k]``; ``b`` = β_t, ``g`` = γ_t (scalars)."""
  if rule in DECAY_RULES:
    S_VK = g * S_VK
  if rule in ("hebb", "decay"):
    return S_VK + b * (v_V[:, None] * k_K[None, :])
  if rule in ("delta", "gated_delta"):
    err_V = v_V - S_VK @ k_K  # gated: S already decayed, i.e. v − γ S_{t−1} k
    return S_VK + b * (err_V[:, None] * k_K[None, :])
  # oja: S + β (v kᵀ − v (vᵀ S))
  return S_VK + b * (v_V[:, None] * (k_K - v_V @ S_VK)[None, :])


def recurrent_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, *, rule: str):
  """One head, ``lax.scan`` over time; returns ``(o [T, D_v], S_T [D_v, D_k])``.

  ``logg_T`` is the log-decay ``log γ`` (None for rules without decay). Inputs in the
  accumulation dtype.
  """
  gamma_T = jnp.exp(logg_T) if logg_T is not None else jnp.ones_like(beta_T)

  def body(S_VK, x):
    q_K, k_K, v_V, b, g = x
    S_VK = _update(rule, S_VK, k_K, v_V, b, g)
    return S_VK, S_VK @ q_K  # read after write

  S_VK, o_TV = jax.lax.scan(body, S_VK, (q_TK, k_TK, v_TV, beta_T, gamma_T))
  return o_TV, S_VK


# ----------------------------------------------------------------------------------------
# Parallel form (hebb, decay): masked quadratic; state St = Sᵀ [D_k, D_v].


def parallel_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, *, rule: str):
  """Hebb/decay as ``O = ((Q Kᵀ) ⊙ M ⊙ causal)(β ⊙ V) + diag(G) Q S̃_0``; see module doc."""
  T = q_TK.shape[0]
  St_KV = S_VK.T
  causal_TT = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
  scores_TT = q_TK @ k_TK.T
  bv_TV = beta_T[:, None] * v_TV
  if rule == "hebb":
    o_TV = jnp.where(causal_TT, scores_TT, 0.0) @ bv_TV + q_TK @ St_KV
    return o_TV, (St_KV + k_TK.T @ bv_TV).T
  g_T = jnp.cumsum(logg_T)  # log G_t
  m_TT = jnp.exp(jnp.where(causal_TT, g_T[:, None] - g_T[None, :], _LOG_MASK))  # mask, then exp
  o_TV = (scores_TT * m_TT) @ bv_TV + jnp.exp(g_T)[:, None] * (q_TK @ St_KV)
  kend_TK = jnp.exp(g_T[-1] - g_T)[:, None] * k_TK
  return o_TV, (jnp.exp(g_T[-1]) * St_KV + kend_TK.T @ bv_TV).T


# ----------------------------------------------------------------------------------------
# Chunked form (UT / WY transform).
#
# The per-chunk algebra is written on chunk-major arrays ``[N, X, C, D]`` (chunk, head,
# row in chunk, feature) with the heads (batch × heads, flattened into X) as a matmul
# batch axis rather than through ``vmap``, so the scan over chunks slices every per-chunk
# tensor without transposes. The sequence is processed as a ``lax.scan`` over groups of
# ``G`` chunks read straight from the ``[B, T, H, D]`` inputs: each step lays its group
# out chunk-major, does all state-free work (Gram matrices, triangular inverse, W, U,
# reads) as batched matmuls over the group's chunks, and runs the inner scan that
# carries the state chunk to chunk. Temporaries are one group's worth (≈ _GROUP_BYTES
# per tensor) instead of whole-sequence ``[N, X, C, C]`` tensors, which on the project's
# 2-core CPU were re-faulted from the OS on every call (33k vs 14k page faults per call
# at T=8192, B=1, H=8, D=64): the grouped forward ran 1.45× faster. The group step is
# rematerialised (``jax.checkpoint``) for the backward pass.

_GROUP_BYTES = 1 << 19


def _mT(x):
  return jnp.swapaxes(x, -1, -2)


def chunked_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, *, rule: str, chunk_size: int):
  """One head, intra-chunk parallel + ``lax.scan`` over chunks; see the module docstring."""
  add = lambda x: None if x is None else x[None, :, None]  # [T, ...] -> [1, T, 1, ...]
  o_BTHV, S_BHVK = chunked(add(q_TK), add(k_TK), add(v_TV), add(beta_T), add(logg_T),
                           S_VK[None, None], rule=rule, chunk_size=chunk_size)
  return o_BTHV[0, :, 0], S_BHVK[0, 0]


def chunked(q_BTHK, k_BTHK, v_BTHV, beta_BTH, logg_BTH, S_BHVK, *, rule: str, chunk_size: int,
            group: Optional[int] = None):
  """Chunked form on ``[B, T, H, ·]`` -> ``(o [B, T, H, D_v], S_T [B, H, D_v, D_k])``.

  ``T`` is padded at the end to a multiple of ``G·C`` (``C = min(chunk_size, T)``, ``G``
  chunks per group: ``group``, or from :data:`_GROUP_BYTES`) with ``β = 0``, zero q/k/v
  and log-decay 0 (``γ = 1``), which leave the state unchanged; the output is sliced
  back to ``T``.
  """
  B, T, H, Dk = q_BTHK.shape
  Dv = v_BTHV.shape[-1]
  X = B * H
  C = min(chunk_size, T)
  N = -(-T // C)
  if group is None:
    group = _GROUP_BYTES // (X * C * max(C, Dk, Dv) * q_BTHK.dtype.itemsize)
  G = max(1, min(group, N))
  Ng = -(-N // G)
  n_pad = Ng * G * C - T

  # B = 1: the groups are a plain reshape [Ng, G·C, H, ...] with no batch axis. Written as a
  # moveaxis of the size-1 batch axis, XLA:CPU gave it a permuted layout and copied every
  # input before the loop (at T=8192, H=8, D=64: 13.4k vs 4.1k page faults per call, the
  # forward 1.3-1.8× slower).
  squeeze = B == 1

  def to_groups(x):  # [B, T, H, ...] -> [Ng, B, G·C, H, ...] ([Ng, G·C, H, ...] when B = 1)
    if n_pad:
      x = jnp.pad(x, [(0, 0), (0, n_pad)] + [(0, 0)] * (x.ndim - 2))
    if squeeze:
      return x.reshape((Ng, G * C) + x.shape[2:])
    return jnp.moveaxis(x.reshape((B, Ng, G * C) + x.shape[2:]), 1, 0)

  def chunk_major(x):  # one group [B, G·C, H, ...] (or [G·C, H, ...]) -> [G, X, C, ...]
    x = x.reshape((B, G, C, H) + x.shape[2 if squeeze else 3:])
    x = jnp.moveaxis(x, (1, 0, 3, 2), (0, 1, 2, 3))
    return x.reshape((G, X, C) + x.shape[4:])  # from [G, B, H, C, ...]

  def step(S_XAB, xs):
    q, k, v, beta, logg = (None if x is None else chunk_major(x) for x in xs)
    if rule == "oja":
      o_GXCV, S_XAB = _oja_chunks(q, k, v, beta, S_XAB)
    else:
      o_GXCV, S_XAB = _delta_chunks(q, k, v, beta, logg, S_XAB, rule=rule)
    o = jnp.moveaxis(o_GXCV.reshape((G, B, H, C, Dv)), (0, 1, 2, 3), (1, 0, 3, 2))
    return S_XAB, o.reshape((B, G * C, H, Dv))

  xs = tuple(None if x is None else to_groups(x)
             for x in (q_BTHK, k_BTHK, v_BTHV, beta_BTH, logg_BTH))
  S_XVK = S_BHVK.reshape((X, Dv, Dk))
  # remat: the backward pass recomputes a group's intermediates from its inputs and
  # carry instead of storing them all (less memory and, measured, ~1.4× faster on CPU)
  step = jax.checkpoint(step, prevent_cse=False)
  # oja runs on S [D_v, D_k]; the delta rules on the key×value layout S̃ = Sᵀ
  S_XAB, o_NgBLHV = jax.lax.scan(step, S_XVK if rule == "oja" else _mT(S_XVK), xs)
  S_XVK = S_XAB if rule == "oja" else _mT(S_XAB)
  o_BTHV = jnp.moveaxis(o_NgBLHV, 0, 1).reshape((B, Ng * G * C, H, Dv))[:, :T]
  return o_BTHV, S_XVK.reshape((B, H, Dv, Dk))


def _causal(C: int, ndim: int, strict: bool = False):
  """Lower-triangular ``[1, .., 1, C, C]`` mask: row ``t`` sees column ``i ≤ t`` (``i < t``)."""
  t, i = jnp.arange(C)[:, None], jnp.arange(C)[None, :]
  return ((t > i) if strict else (t >= i)).reshape((1,) * (ndim - 2) + (C, C))


def _eye(n: int, ndim: int, dtype):
  return jnp.eye(n, dtype=dtype).reshape((1,) * (ndim - 2) + (n, n))


_BASE_INVERSE = 8  # blocks up to this size: forward substitution row by row


def unit_lower_inverse(A_XCC):
  """``(I + A)^{-1}`` for strictly lower-triangular ``A [..., C, C]`` (the UT transform's T).

  Recursive 2×2 block inversion (the block method for triangular inversion, e.g.
  Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, ch. 14):
  ``[[I + A11, 0], [A21, I + A22]]^{-1} = [[T11, 0], [−T22 A21 T11, T22]]``, both halves
  inverted together as one batch, down to forward substitution on blocks of ≤ 8 rows.
  Matmuls only, so it maps onto accelerator matrix units; on the project's CPU the
  inverse plus the two products ``W``, ``U`` ran ~2× faster than one batched LAPACK
  ``trsm`` solve for ``[W, U]`` (whose time also swung ~10× with BLAS threading).
  ``C`` is padded to a power of two with zeros (identity blocks), then sliced back.
  The batch is flattened to one axis first: the forward substitution written on
  rank-8/9 arrays crashed XLA:CPU (jaxlib 0.10, segfault at run time) for some shapes.
  """
  *batch, C, _ = A_XCC.shape
  A_XCC = A_XCC.reshape((-1, C, C))  # one batch axis: every op stays at rank <= 4
  P = 1 << max(C - 1, 0).bit_length()
  if P != C:
    A_XCC = jnp.pad(A_XCC, [(0, 0), (0, P - C), (0, P - C)])
  return _inverse_rec(A_XCC)[:, :C, :C].reshape(tuple(batch) + (C, C))


def _inverse_rec(A_XCC):
  X, C, _ = A_XCC.shape
  if C <= _BASE_INVERSE:
    return _inverse_forward_substitution(A_XCC)
  h = C // 2
  T_2XHH = _inverse_rec(jnp.concatenate([A_XCC[:, :h, :h], A_XCC[:, h:, h:]], axis=0))
  T11, T22 = T_2XHH[:X], T_2XHH[X:]
  T21 = -(T22 @ (A_XCC[:, h:, :h] @ T11))
  top = jnp.concatenate([T11, jnp.zeros_like(T11)], axis=-1)
  return jnp.concatenate([top, jnp.concatenate([T21, T22], axis=-1)], axis=-2)


def _inverse_forward_substitution(A_XCC):
  """Row ``i`` of ``T = (I + A)^{-1}``: ``T_i = e_i − Σ_{j<i} A_ij T_j``."""
  C = A_XCC.shape[-1]
  eye_XCC = jnp.broadcast_to(_eye(C, 3, A_XCC.dtype), A_XCC.shape)
  rows = [eye_XCC[:, 0, :]]
  for i in range(1, C):  # static, C <= 8: the rows of one small block, not time steps
    T_prev = jnp.stack(rows, axis=1)  # [X, i, C]
    rows.append(eye_XCC[:, i, :] - jnp.sum(A_XCC[:, i, :i, None] * T_prev, axis=1))
  return jnp.stack(rows, axis=1)


def _additive_scan(gend_NX, X_NXKV, St_XKV):
  """hebb / decay across chunks: ``S̃_{n+1} = G_C S̃_n + X_n`` (``G_C = 1`` when None).

  The per-chunk contributions ``X_n = K̂ᵀ (β ⊙ V)`` do not depend on the state, so they
  are computed for all chunks at once and the sequential part is elementwise. Returns
  (``S̃_n`` before each chunk ``[N, X, K, V]``, ``S̃_N``).
  """
  if gend_NX is None:
    St_XKV, S0_NXKV = jax.lax.scan(lambda St, X_: (St + X_, St), St_XKV, X_NXKV)
  else:
    body = lambda St, x: (x[0][:, None, None] * St + x[1], St)
    St_XKV, S0_NXKV = jax.lax.scan(body, St_XKV, (gend_NX, X_NXKV))
  return S0_NXKV, St_XKV


def _delta_chunks(q_NXCK, k_NXCK, v_NXCV, beta_NXC, logg_NXC, St_XKV, *, rule: str):
  """hebb / delta / decay / gated_delta on ``N`` chunks (one group), state ``S̃ = Sᵀ [X, K, V]``.

  The UT / WY construction of the module docstring (the digest's chunked form, with the
  decays of Gated DeltaNet entering as ``Γ`` and ``G``); returns ``(O [N, X, C, V], S̃_N)``.
  """
  C = q_NXCK.shape[2]
  causal = _causal(C, 4)
  decays, erases = rule in DECAY_RULES, rule in ("delta", "gated_delta")
  bv_NXCV = beta_NXC[..., None] * v_NXCV
  scores_NXCC = q_NXCK @ _mT(k_NXCK)
  if decays:
    g_NXC = jnp.cumsum(logg_NXC, axis=-1)  # in-chunk cumulative log-decay log G_t
    diff_NXCC = g_NXC[..., :, None] - g_NXC[..., None, :]
    gamma_NXCC = jnp.exp(jnp.where(causal, diff_NXCC, _LOG_MASK))  # Γ_ti; mask, then exp
    G_NXC = jnp.exp(g_NXC)
    kend_NXCK = jnp.exp(g_NXC[..., -1:] - g_NXC)[..., None] * k_NXCK  # (G_C / G_i) k_i
    scores_NXCC = scores_NXCC * gamma_NXCC  # (Q Kᵀ) ⊙ Γ
  else:
    kend_NXCK = k_NXCK
    scores_NXCC = jnp.where(causal, scores_NXCC, 0.0)  # tril(Q Kᵀ)
  kendT_NXKC = _mT(kend_NXCK)

  if erases:
    A_NXCC = beta_NXC[..., None] * (k_NXCK @ _mT(k_NXCK))
    A_NXCC = jnp.where(_causal(C, 4, strict=True), A_NXCC * gamma_NXCC if decays else A_NXCC, 0.0)
    T_NXCC = unit_lower_inverse(A_NXCC)
    bk_NXCK = beta_NXC[..., None] * k_NXCK
    W_NXCK = T_NXCC @ (G_NXC[..., None] * bk_NXCK if decays else bk_NXCK)  # W = T diag(βG) K
    U_NXCV = T_NXCC @ bv_NXCV  # U = T diag(β) V
    gend_NX = G_NXC[..., -1] if decays else jnp.ones(q_NXCK.shape[:2], St_XKV.dtype)

    def body(St_XKV, x):  # the sequential part: two small matmuls per chunk
      W_XCK, U_XCV, kendT_XKC, gend_X = x
      D_XCV = U_XCV - W_XCK @ St_XKV  # the effective writes V' = U − W S̃
      return gend_X[:, None, None] * St_XKV + kendT_XKC @ D_XCV, (St_XKV, D_XCV)

    xs = (W_NXCK, U_NXCV, kendT_NXKC, gend_NX)
    St_XKV, (S0_NXKV, D_NXCV) = jax.lax.scan(body, St_XKV, xs)
  else:  # W = 0: the writes β V are known up front
    D_NXCV = bv_NXCV
    S0_NXKV, St_XKV = _additive_scan(G_NXC[..., -1] if decays else None, kendT_NXKC @ D_NXCV, St_XKV)

  inter_NXCV = q_NXCK @ S0_NXKV
  if decays:
    inter_NXCV = G_NXC[..., None] * inter_NXCV
  return inter_NXCV + scores_NXCC @ D_NXCV, St_XKV


def _oja_chunks(q_NXCK, k_NXCK, v_NXCV, beta_NXC, S_XVK):
  """Oja chunks on ``S [X, D_v, D_k]``: the delta construction with write-key ``v``."""
  C = q_NXCK.shape[2]
  vT_NXVC = _mT(v_NXCV)
  A_NXCC = beta_NXC[..., None] * (v_NXCV @ vT_NXVC)
  T_NXCC = unit_lower_inverse(jnp.where(_causal(C, 4, strict=True), A_NXCC, 0.0))
  W_NXCV = T_NXCC @ (beta_NXC[..., None] * v_NXCV)
  U_NXCK = T_NXCC @ (beta_NXC[..., None] * k_NXCK)

  def body(S_XVK, x):  # S_{n+1} = S_n + Vᵀ (U − W S_n)
    W_XCV, U_XCK, vT_XVC = x
    D_XCK = U_XCK - W_XCV @ S_XVK
    return S_XVK + vT_XVC @ D_XCK, (S_XVK, D_XCK)

  S_XVK, (S0_NXVK, D_NXCK) = jax.lax.scan(body, S_XVK, (W_NXCV, U_NXCK, vT_NXVC))
  qd_NXCC = jnp.where(_causal(C, 4), q_NXCK @ _mT(D_NXCK), 0.0)  # tril(Q Δᵀ)
  return q_NXCK @ _mT(S0_NXVK) + qd_NXCC @ v_NXCV, S_XVK


# ----------------------------------------------------------------------------------------
# Dispatch over modes, batch and heads.


def _run(rule, mode, chunk_size, q, k, v, beta, logg, S0):
  """``[B, T, H, ·]`` inputs (accumulation dtype) -> ``(o [B, T, H, D_v], S [B, H, D_v, D_k])``."""
  T = q.shape[1]
  if mode == "chunked" or (mode == "parallel" and rule in ("delta", "gated_delta")):
    # parallel delta rules: the UT form with one chunk spanning the sequence
    C = chunk_size if mode == "chunked" else T
    return chunked(q, k, v, beta, logg, S0, rule=rule, chunk_size=C)
  head = functools.partial(recurrent_head if mode == "recurrent" else parallel_head, rule=rule)
  t = 1  # per batch element, time-major [T, H, ...]: heads on axis 1
  lg = t if logg is not None else None
  over_heads = jax.vmap(head, in_axes=(t, t, t, t, lg, 0), out_axes=(t, 0))
  over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, 0, None if logg is None else 0, 0))
  return over_batch(q, k, v, beta, logg, S0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _auto(rule, fwd_mode, chunk_size, q, k, v, beta, logg, S0):
  """auto: the forward-fastest form when not differentiated, the chunked form's JVP when."""
  return _run(rule, fwd_mode, chunk_size, q, k, v, beta, logg, S0)


@_auto.defjvp
def _auto_jvp(rule, fwd_mode, chunk_size, primals, tangents):
  del fwd_mode
  return jax.jvp(functools.partial(_run, rule, "chunked", chunk_size), primals, tangents)


def auto_forward_mode(platform: Optional[str] = None) -> str:
  """The form ``mode="auto"`` runs when no gradient is taken (see module docstring)."""
  platform = platform or jax.default_backend()
  return "recurrent" if platform == "cpu" else "chunked"


@functools.partial(jax.jit, static_argnames=("rule", "mode", "chunk_size", "normalize_keys"))
def _forward(q, k, v, beta, logg, S0, *, rule, mode, chunk_size, normalize_keys):
  acc = _acc_dtype(q, k, v)
  q, k, v, beta, S0 = (x.astype(acc) for x in (q, k, v, beta, S0))
  logg = logg.astype(acc) if logg is not None else None
  if normalize_keys:
    k = l2_normalize(k)
  if mode == "auto":
    return _auto(rule, auto_forward_mode(), chunk_size, q, k, v, beta, logg, S0)
  return _run(rule, mode, chunk_size, q, k, v, beta, logg, S0)


# ----------------------------------------------------------------------------------------
# Public API.


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _check_scalar_or_BTH(name: str, x, B: int, T: int, H: int):
  shape = shape_of(x)
  if shape != () and shape != (B, T, H):
    raise ValueError(f"`{name}` must be a scalar or have shape [B, T, H] = {(B, T, H)}, got {shape}.")


def _check_decay_values(decay, name: str = "decay") -> None:
  if decay is None or not _is_concrete(decay):
    return
  d = np.asarray(decay, np.float64)
  if not (np.all(np.isfinite(d)) and np.all(d > 0) and np.all(d <= 1)):
    bad = d[~(np.isfinite(d) & (d > 0) & (d <= 1))]
    raise ValueError(f"`{name}` must lie in (0, 1], got value(s) such as {bad.ravel()[:3].tolist()}.")


def _check_stability(rule: str, beta, k, v, normalize_keys: bool) -> None:
  """Raises when concrete ``β_t‖a_t‖²`` leaves ``[0, 2]`` (a = k, or v for oja)."""
  if rule not in ERASE_RULES:
    return
  a = v if rule == "oja" else k
  if not (_is_concrete(beta) and _is_concrete(a)):
    return
  b = np.asarray(1.0 if beta is None else beta, np.float64)
  if normalize_keys and rule != "oja":
    sq = np.ones(shape_of(a)[:-1])
  else:
    sq = np.sum(np.square(np.asarray(a, np.float64)), axis=-1)
  prod = b * sq
  if np.any(prod < -_STABILITY_SLACK) or np.any(prod > 2.0 * (1.0 + _STABILITY_SLACK)):
    which, arg = ("‖v_t‖²", "v") if rule == "oja" else ("‖k_t‖²", "k")
    worst = float(prod.max()) if prod.max() > 2 else float(prod.min())
    raise ValueError(
        f"rule {rule!r} diverges unless 0 <= beta_t·{which} <= 2 for every token, got {worst:.4g} "
        f"(`beta` shape {shape_of(beta)}, `{arg}` shape {shape_of(a)}); "
        + ("normalise the values or lower beta." if rule == "oja"
           else "pass normalize_keys=True (or L2-normalise k) and keep beta in [0, 2].")
    )


def associative_memory(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    beta: Optional[jax.Array] = None,
    *,
    rule: str,
    mode: str = "auto",
    chunk_size: int = 64,
    decay: Any = None,
    initial_state: Optional[jax.Array] = None,
    return_state: bool = False,
    normalize_keys: bool = False,
):
  """Multi-head associative matrix memory (write with ``rule``, read ``o_t = S_t q_t``).

  Args:
    q: queries ``[B, T, H, D_k]``.
    k: keys ``[B, T, H, D_k]``.
    v: values ``[B, T, H, D_v]``.
    beta: write strengths ``[B, T, H]`` or a scalar; None means 1.
    rule: ``"hebb" | "delta" | "oja" | "decay" | "gated_delta"`` (equations in the module
      docstring).
    mode: ``"auto" | "recurrent" | "parallel" | "chunked"``; ``parallel`` is not
      available for ``oja``.
    chunk_size: chunk length for ``chunked`` (and ``auto`` when it chooses chunked); any
      ``T`` works (padded internally).
    decay: ``γ`` in ``(0, 1]``, ``[B, T, H]`` or a scalar; required for ``decay`` and
      ``gated_delta``, rejected for the other rules.
    initial_state: ``S_0 [B, H, D_v, D_k]``; zeros when None.
    return_state: also return the final state ``S_T [B, H, D_v, D_k]``.
    normalize_keys: L2-normalise ``k`` before writing (stability guard, see module doc).

  Returns:
    ``o [B, T, H, D_v]`` in the dtype of ``v``, and ``S_T`` (float32, float64 for
    float64 inputs) if ``return_state``.

  Raises:
    ValueError: wrong ranks or mismatched batch/length/heads/key widths; bad ``rule``,
      ``mode``, ``chunk_size``; ``parallel`` with ``oja``; ``decay`` missing, given for a
      rule without decay, of the wrong shape, or (when concrete) outside ``(0, 1]``;
      ``beta``/``initial_state`` of the wrong shape; concrete ``β‖k‖²`` (``β‖v‖²`` for
      oja) outside ``[0, 2]`` for the erasing rules.
  """
  check_choice("rule", rule, RULES)
  check_choice("mode", mode, MODES)
  chunk_size = check_positive_int("chunk_size", chunk_size)
  B, T, H, Dk = check_rank("q", q, 4, "B, T, H, D_k")
  Bk, Tk, Hk, Dkk = check_rank("k", k, 4, "B, T, H, D_k")
  Bv, Tv, Hv, Dv = check_rank("v", v, 4, "B, T, H, D_v")
  check_equal("batch sizes", q=B, k=Bk, v=Bv)
  check_equal("lengths", q=T, k=Tk, v=Tv)
  check_equal("numbers of heads", q=H, k=Hk, v=Hv)
  check_equal("key widths", q=Dk, k=Dkk)
  if T == 0:
    raise ValueError(f"`q` must have at least one time step, got shape {shape_of(q)}.")
  if mode == "parallel" and rule == "oja":
    raise ValueError(
        "mode='parallel' is not available for rule='oja' (no masked quadratic form); use "
        "mode='chunked' (chunk_size=T gives the one-chunk form) or 'recurrent'."
    )
  if beta is not None:
    _check_scalar_or_BTH("beta", beta, B, T, H)
  if rule in DECAY_RULES:
    if decay is None:
      raise ValueError(f"rule {rule!r} needs `decay` (γ in (0, 1], [B, T, H] or a scalar).")
    _check_scalar_or_BTH("decay", decay, B, T, H)
    _check_decay_values(decay)
  elif decay is not None:
    raise ValueError(f"`decay` is only used by rules {list(DECAY_RULES)}, got it for rule {rule!r}.")
  if initial_state is not None:
    s = shape_of(initial_state)
    if s != (B, H, Dv, Dk):
      raise ValueError(
          f"`initial_state` must have shape [B, H, D_v, D_k] = {(B, H, Dv, Dk)}, got {s}."
      )
  _check_stability(rule, beta, k, v, normalize_keys)

  acc = _acc_dtype(q, k, v)
  beta_BTH = jnp.ones((B, T, H), acc) if beta is None else jnp.broadcast_to(jnp.asarray(beta), (B, T, H))
  logg_BTH = None
  if decay is not None:
    logg_BTH = jnp.log(jnp.broadcast_to(jnp.asarray(decay, acc), (B, T, H)))
  S0 = jnp.zeros((B, H, Dv, Dk), acc) if initial_state is None else jnp.asarray(initial_state)
  o, S = _forward(q, k, v, beta_BTH, logg_BTH, S0, rule=rule, mode=mode, chunk_size=chunk_size,
                  normalize_keys=bool(normalize_keys))
  o = o.astype(v.dtype)
  return (o, S) if return_state else o


def init_state(batch: int, heads: int, d_k: int, d_v: int, dtype=jnp.float32) -> jax.Array:
  """The empty memory ``S_0 = 0``, ``[batch, heads, d_v, d_k]``."""
  for name, n in (("batch", batch), ("heads", heads), ("d_k", d_k), ("d_v", d_v)):
    check_positive_int(name, n)
  return jnp.zeros((batch, heads, d_v, d_k), dtype)


def step(state, q_t, k_t, v_t, beta_t=None, decay_t=None, *, rule: str, normalize_keys: bool = False):
  """One token of inference: write ``(k_t, v_t)`` with ``rule``, then read ``o_t = S_t q_t``.

  Args:
    state: ``S_{t−1} [B, H, D_v, D_k]``.
    q_t, k_t: ``[B, H, D_k]``; v_t: ``[B, H, D_v]``.
    beta_t: ``[B, H]`` or a scalar (None → 1); decay_t: ``[B, H]`` or a scalar in (0, 1],
      required exactly for ``decay``/``gated_delta``.
    rule: as in :func:`associative_memory`.
    normalize_keys: as in :func:`associative_memory`.

  Returns:
    ``(S_t [B, H, D_v, D_k], o_t [B, H, D_v])``; the state keeps its (≥ float32) dtype,
    ``o_t`` has the dtype of ``v_t``.
  """
  check_choice("rule", rule, RULES)
  B, H, Dv, Dk = check_rank("state", state, 4, "B, H, D_v, D_k")
  Bq, Hq, Dq = check_rank("q_t", q_t, 3, "B, H, D_k")
  Bk, Hk, Dkk = check_rank("k_t", k_t, 3, "B, H, D_k")
  Bv, Hv, Dvv = check_rank("v_t", v_t, 3, "B, H, D_v")
  check_equal("batch sizes", state=B, q_t=Bq, k_t=Bk, v_t=Bv)
  check_equal("numbers of heads", state=H, q_t=Hq, k_t=Hk, v_t=Hv)
  check_equal("key widths", state=Dk, q_t=Dq, k_t=Dkk)
  check_equal("value widths", state=Dv, v_t=Dvv)
  for name, x in (("beta_t", beta_t), ("decay_t", decay_t)):
    if x is not None and shape_of(x) not in ((), (B, H)):
      raise ValueError(f"`{name}` must be a scalar or have shape [B, H] = {(B, H)}, got {shape_of(x)}.")
  if rule in DECAY_RULES:
    if decay_t is None:
      raise ValueError(f"rule {rule!r} needs `decay_t` (γ in (0, 1], [B, H] or a scalar).")
    _check_decay_values(decay_t, "decay_t")
  elif decay_t is not None:
    raise ValueError(f"`decay_t` is only used by rules {list(DECAY_RULES)}, got it for rule {rule!r}.")
  _check_stability(rule, beta_t, k_t, v_t, normalize_keys)

  acc = jnp.promote_types(_acc_dtype(q_t, k_t, v_t), state.dtype)
  q, k, v = (x.astype(acc) for x in (q_t, k_t, v_t))
  if normalize_keys:
    k = l2_normalize(k)
  b = jnp.broadcast_to(jnp.asarray(1.0 if beta_t is None else beta_t, acc), (B, H))
  g = jnp.broadcast_to(jnp.asarray(1.0 if decay_t is None else decay_t, acc), (B, H))
  update = jax.vmap(jax.vmap(functools.partial(_update, rule)))
  S = update(state.astype(acc), k, v, b, g)
  o = jnp.einsum("bhvk,bhk->bhv", S, q)
  return S, o.astype(v_t.dtype)


__all__ = [
    "MODES", "RULES", "associative_memory", "auto_forward_mode",
    "chunked_head", "init_state", "l2_normalize", "parallel_head", "recurrent_head", "step",
]
