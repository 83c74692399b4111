"""Associative matrix memory: Hebb, delta, Oja and decaying (gated) updates, read ``S q``.

The Pavlovian reading of attention (see ``shared/papers/pavlovian.md``): keys are
conditioned stimuli, values unconditioned stimuli, and the forward pass binds them into
an associative matrix that a query reads. Layout pinned here once:

* state ``S [D_v, D_k]`` per head ("US × CS"), ``[B, H, D_v, D_k]`` for a batch;
* **read after write**: ``o_t = S_t q_t``;
* public arrays ``q, k [B, T, H, D_k]``, ``v [B, T, H, D_v]``, ``beta, decay [B, T, H]``.

Rules (``rule=``), with ``β_t`` the write strength and ``γ_t ∈ [0, 1]`` the decay:

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
  ``O = ((Q Kᵀ) ⊙ M ⊙ causal)(β ⊙ V) + diag(G) Q S̃_0`` with ``M_ti = Π_{i<s≤t} γ_s`` and
  ``G_t = Π_{s≤t} γ_s`` taken from segment sums of ``log γ``
  (:func:`jaxmem.kernels.segsum.segsum`: no difference of two cumulative sums, so
  long sequences keep float32 accuracy and ``γ = 0`` is exact);
  delta/gated_delta as the chunked UT form below with one chunk spanning the whole
  sequence (an ``O(T²)`` memory, ``O(T³)`` triangular inverse). The one-chunk form writes
  the state as a sum of ``T`` rank-one corrections computed without seeing the rounded
  state, so unlike the recurrent and chunked forms (whose errors ``v − S k`` correct) its
  rounding error grows with ``T``: measured 5.7e-5 (delta) at ``T = 2048`` against 3.2e-6
  chunked (``D_k = 16``, unit keys); it is an exposition / reference form, not the one for
  long sequences. Oja has no parallel form here (``ValueError``); its one-chunk form is
  ``mode="chunked", chunk_size=T``.
* ``chunked``: intra-chunk parallel + ``lax.scan`` over chunks (Yang et al. 2024,
  "Parallelizing Linear Transformers with the Delta Rule over Sequence Length": the
  WY / UT transform; the digest's construction). In the key×value layout ``S̃ = Sᵀ``
  (``o_t = S̃_tᵀ q_t``) a gated delta chunk with rows ``Q, K, V``, betas ``β``, and
  in-chunk decays ``Γ_ti = Π_{i<s≤t} γ_s`` (``i ≤ t``), ``G_t = Π_{s≤t} γ_s`` is::

      A = tril(diag(β) (K Kᵀ ⊙ Γ), −1),   T = (I + A)^{-1}  (unit lower triangular)
      W = T diag(β G) K,                   U = T diag(β) V
      Δ = U − W S̃_0                         (the effective writes "V'")
      O = diag(G) Q S̃_0 + (tril(Q Kᵀ) ⊙ Γ) Δ
      S̃_C = G_C S̃_0 + (diag(G_C / G) K)ᵀ Δ     (G_C / G_i = Γ_Ci, never a division)

  Derivation: write ``S̃_t = G_t S̃_0 + Σ_{i≤t} (G_t/G_i) k_i δ_iᵀ``; the delta rule gives
  ``δ_t = β_t (v_t − G_t S̃_0ᵀ k_t − Σ_{i<t} Γ_ti (k_tᵀ k_i) δ_i)``, i.e. ``(I + A) Δ =
  diag(β)(V − diag(G) K S̃_0)``. ``delta`` is ``G = 1``; ``decay`` is ``W = 0, Δ = β V``;
  ``hebb`` both. ``Γ``, ``G`` and ``G_C / G`` are ``exp`` of segment sums of ``log γ``
  inside the chunk (:func:`~jaxmem.kernels.segsum.segsum`). ``T`` is formed by recursive
  block inversion (:func:`unit_lower_inverse`, matmuls only) and everything that does not
  depend on the state (Gram matrices, ``T``, ``W``, ``U``, the reads) is batched over
  chunks outside the sequential part, whose body is two small matmuls (``W S̃`` and
  ``Kᵀ Δ``) per chunk. Hebb and decay need no inverse and their sequential part is
  elementwise.

  Oja is the same construction with the roles of keys and values exchanged: in the
  ``S [D_v, D_k]`` layout ``S_t = (I − β_t v_t v_tᵀ) S_{t−1} + β_t v_t k_tᵀ`` is the delta
  rule with write-key ``v`` and write-value ``k``, so ``A = tril(diag(β) V Vᵀ, −1)``,
  ``W = T diag(β) V``, ``U = T diag(β) K``, ``Δ = U − W S_0``, ``S_C = S_0 + Vᵀ Δ``; only
  the read differs: ``O = Q S_0ᵀ + tril(Q Δᵀ) V``.

  A length ``T`` that is not a multiple of ``chunk_size`` is padded at the end, to the next
  multiple of the chunk only, with ``β = 0``, zero keys/values/queries and ``γ = 1`` (which
  leave the state unchanged) and the output is sliced back. ``chunk_size`` larger than
  ``T`` means one chunk of ``T``.
* ``auto``: ``chunked`` whenever gradients are taken (any platform) and on accelerators;
  ``recurrent`` for a forward-only call on CPU. "Gradients are taken" is decided by JAX
  itself: ``auto`` is a ``jax.custom_jvp`` whose primal is the forward-fastest form and
  whose JVP is the chunked form's, so ``jax.grad``/``jax.jvp`` (and anything built on
  them) differentiate the chunked form while a plain call runs the fast forward. The rule
  comes from ``jaxmem bench assoc`` and a shape sweep on the project's 2-core CPU (delta
  rule, D=64): a forward-only recurrent scan was 1.2-2.6× faster than chunked at every
  measured shape (B·H from 1 to 128, T from 64 to 8192), while chunked forward+backward
  was ~10× faster than the recurrent one from T=512 on; on GPU/TPU a per-token scan is
  latency-bound, so chunked throughout.

Decays: pass ``log_decay = log γ`` (e.g. ``jax.nn.log_sigmoid(z)``, finite for every
finite ``z``) or ``decay = γ``. Every form works on ``log γ``: values and gradients are
finite for ``γ`` anywhere in ``[0, 1]`` (``log_decay = −inf`` is ``γ = 0`` exactly).
``decay=`` is read as ``log max(γ, 1e-30)`` with the derivative ``1 / max(γ, 1e-30)``
(a state kept with weight 1e-30 instead of 0, far below float32 resolution, and the
correct gradient at ``γ = 0``); use ``log_decay`` for decays below 1e-30. Concrete values
outside ``[0, 1]`` (``log_decay`` above 0, NaN) raise ``ValueError``; traced ones cannot
be checked, so a model should produce them in range by construction (``log_sigmoid``).

Stability: for ``delta``/``gated_delta`` the erase factor ``I − β_t k_t k_tᵀ`` has
eigenvalue ``1 − β_t‖k_t‖²`` along ``k_t``; outside ``0 ≤ β_t‖k_t‖² ≤ 2`` the state (and the
UT inverse) grows geometrically (``2`` itself is the marginal, oscillating edge). For
``oja`` the factor is ``I − β_t v_t v_tᵀ``, so the bound is on ``β_t‖v_t‖²``. When ``beta``
and the keys (values for oja) are concrete (eager calls, not under ``jit``/``grad``
tracing) a violation, or a non-finite ``beta``, raises ``ValueError``; the bound is
checked with a slack of the input dtype's rounding (``3·eps``: 1e-4 for float32, 2.3% for
bfloat16, so that keys normalised in bfloat16 pass with ``β = 2``); non-finite keys (values
for oja) raise too. Traced values cannot
be checked: under ``jit`` divergence is prevented only by construction —
``normalize_keys=True`` L2-normalises keys inside the kernel in float32
(``k / sqrt(‖k‖² + 1e-6)``), which makes any ``β ∈ [0, 2]`` safe for the delta rules;
:class:`jaxmem.models.TransformerConfig` does this by default for every erasing rule.
``normalize_keys`` normalises keys for every rule; for ``oja`` the erase vector is ``v``,
which the kernel leaves as given, so it does not make oja stable: normalise ``v`` before
the call (the model's ``key_norm`` does).

Precision: every matmul runs at ``precision`` (default ``"highest"``: float32 operands on
every platform; see :mod:`jaxmem.kernels.precision`). Max abs error against the float64
loop at ``T = 2048`` (``D = 16``, unit keys and values, β ∈ (0.1, 1.5), γ ∈ (0.6, 1); hebb's
outputs grow with ``T``: max |o| 43 here, 4.8 for delta), reduced precisions emulated on CPU
(``jaxmem bench precision`` prints the full rule × form table):

================ ============= ============= ============= =============
                 highest       TF32 (GPU)    bf16×3 (TPU   bf16 (TPU
                 (default)     "default"     "high")       "default")
================ ============= ============= ============= =============
delta / oja      9e-7 – 1e-5   3e-3 – 3e-2   4e-5 – 4e-4   2e-2 – 2e-1
decay / gated    4e-7 – 8e-7   1e-3 – 2e-3   1e-5 – 3e-5   8e-3 – 2e-2
hebb             9e-6 – 6e-5   2e-2          3e-4          1e-1 – 2e-1
================ ============= ============= ============= =============

(the chunked form is 1.5–3× worse than the recurrent one at reduced precision, the
one-chunk parallel delta form ~10×: the triangular inverse amplifies operand rounding).
Reduced precision is a speed/accuracy choice for training; keep ``"highest"`` where the
numbers matter. Tested: every ``dot_general`` of the values and of the gradients carries
the requested precision, and emulated TF32 / bf16 errors stay within the tolerances in
``tests/kernels/test_assoc_numerics.py``.

Numerics: every form accumulates in float32 (float64 for float64 inputs); the output has
the dtype of ``v``; the returned state has the dtype of ``initial_state`` (so a carried
state keeps its dtype), or the accumulation dtype when no initial state is given.

Invariants tested (tests/kernels/test_assoc.py, test_assoc_numerics.py): every mode
equals an independent float64 numpy loop over tokens, outputs and final states, for every
rule, including decays near and at 0; gradients agree across modes and with finite
differences in every mode; hebb parallel equals causal linear attention; chunked with an
initial state equals recurrent with it; :func:`step` over a sequence equals the sequence
form; odd ``T`` and ``D``; long sequences stay finite and the parallel form stays accurate
at ``T ≥ 2048``; every matmul carries the requested precision (values and gradients).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem._checks import check_choice, check_equal, check_positive_int, check_rank, shape_of
from jaxmem.kernels.precision import Matmul, matmul_for
from jaxmem.kernels.segsum import segsum

RULES = ("hebb", "delta", "oja", "decay", "gated_delta")
MODES = ("auto", "recurrent", "parallel", "chunked")
DECAY_RULES = ("decay", "gated_delta")
# Rules whose update multiplies the state by (I − β a aᵀ) and so need β‖a‖² in [0, 2].
ERASE_RULES = ("delta", "gated_delta", "oja")

_NORM_EPS = 1e-6
# decay= values below this are read as it (log-space kernels; see the module docstring)
DECAY_FLOOR = 1e-30
_HIGHEST = Matmul()


def l2_normalize(x: jax.Array) -> jax.Array:
  """``x / ‖x‖₂`` over the last axis (``+ 1e-6`` under the root): the ``normalize_keys`` guard."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _NORM_EPS)


def _acc_dtype(*xs) -> Any:
  return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


def log_of_decay(decay: jax.Array) -> jax.Array:
  """``log max(γ, 1e-30)`` with derivative ``1 / max(γ, 1e-30)``: finite for ``γ ∈ [0, 1]``.

  ``d/dγ = (d/d log γ) / γ`` would be ``0 · inf`` at ``γ = 0``; with the floor the
  log-space derivative carries the factor ``1e-30`` that the division removes, so the
  gradient with respect to ``γ`` is the true one (the limit at ``γ → 0``).
  """
  decay = jnp.asarray(decay)
  decay = decay.astype(jnp.promote_types(decay.dtype, jnp.float32))  # 1e-30 is 0 in float16
  floored = jnp.maximum(decay, jnp.asarray(DECAY_FLOOR, decay.dtype))
  return jnp.log(decay + jax.lax.stop_gradient(floored - decay))  # value: floored; d/dγ = 1/floored


def _decay_mask(logg_TX):
  """``(M [.., T, T], G [.., T], G_end / G [.., T], G_end [..])`` from log-decays ``[.., T]``.

  ``M_ti = Π_{i<s≤t} γ_s`` (0 above the diagonal), ``G_t = Π_{s≤t} γ_s``, all as ``exp`` of
  segment sums (no subtraction of cumulative sums).
  """
  seg = segsum(logg_TX)
  g = logg_TX[..., :1] + seg[..., :, 0]  # Σ_{s≤t} log γ_s
  return jnp.exp(seg), jnp.exp(g), jnp.exp(seg[..., -1, :]), jnp.exp(g[..., -1])


# ----------------------------------------------------------------------------------------
# Recurrent form: the literal equations, one token per scan step (state S [D_v, D_k]).


def _update(rule: str, S_VK, k_K, v_V, b, g, dot: Matmul = _HIGHEST):
  """One write of ``rule`` on ``S [D_v, D_k]``; ``b`` = β_t, ``g`` = γ_t (scalars)."""
  if rule in DECAY_RULES:
    S_VK = g * S_VK
  if rule in ("hebb", "decay"):
    return S_VK + b * (v_V[:, None] * k_K[None, :])
  if rule in ("delta", "gated_delta"):
    err_V = v_V - dot(S_VK, k_K)  # gated: S already decayed, i.e. v − γ S_{t−1} k
    return S_VK + b * (err_V[:, None] * k_K[None, :])
  # oja: S + β (v kᵀ − v (vᵀ S))
  return S_VK + b * (v_V[:, None] * (k_K - dot(v_V, S_VK))[None, :])


def recurrent_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, *, rule: str, dot: Matmul = _HIGHEST):
  """One head, ``lax.scan`` over time; returns ``(o [T, D_v], S_T [D_v, D_k])``.

  ``logg_T`` is the log-decay ``log γ`` (None for rules without decay). Inputs in the
  accumulation dtype; no argument checks (see :func:`associative_memory`).
  """
  check_choice("rule", rule, RULES)
  gamma_T = jnp.exp(logg_T) if logg_T is not None else jnp.ones_like(beta_T)

  def body(S_VK, x):
    q_K, k_K, v_V, b, g = x
    S_VK = _update(rule, S_VK, k_K, v_V, b, g, dot)
    return S_VK, dot(S_VK, q_K)  # read after write

  S_VK, o_TV = jax.lax.scan(body, S_VK, (q_TK, k_TK, v_TV, beta_T, gamma_T))
  return o_TV, S_VK


# ----------------------------------------------------------------------------------------
# Parallel form: masked quadratic (hebb, decay); one UT chunk (delta, gated_delta).


def parallel_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, *, rule: str, dot: Matmul = _HIGHEST):
  """One head in the parallel form; returns ``(o [T, D_v], S_T [D_v, D_k])``.

  hebb/decay: ``O = ((Q Kᵀ) ⊙ M ⊙ causal)(β ⊙ V) + diag(G) Q S̃_0``; delta/gated_delta:
  the UT form with one chunk of length ``T`` (see the module docstring); oja has none
  (``ValueError``). Inputs in the accumulation dtype; no argument checks.
  """
  check_choice("rule", rule, RULES)
  if rule == "oja":
    raise ValueError("rule='oja' has no parallel form; use chunked_head(..., chunk_size=T).")
  T = q_TK.shape[0]
  if rule in ("delta", "gated_delta"):
    return chunked_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, rule=rule, chunk_size=T, dot=dot)
  St_KV = S_VK.T
  causal_TT = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
  scores_TT = dot(q_TK, k_TK.T)
  bv_TV = beta_T[:, None] * v_TV
  if rule == "hebb":
    o_TV = dot(jnp.where(causal_TT, scores_TT, 0.0), bv_TV) + dot(q_TK, St_KV)
    return o_TV, (St_KV + dot(k_TK.T, bv_TV)).T
  m_TT, G_T, kend_T, G_end = _decay_mask(logg_T)  # M is 0 above the diagonal
  o_TV = dot(scores_TT * m_TT, bv_TV) + G_T[:, None] * dot(q_TK, St_KV)
  return o_TV, (G_end * St_KV + dot((kend_T[:, None] * k_TK).T, bv_TV)).T


# ----------------------------------------------------------------------------------------
# Chunked form (UT / WY transform).
#
# The per-chunk algebra is written on chunk-major arrays ``[N, X, C, D]`` (chunk, head,
# row in chunk, feature) with the heads (batch × heads, flattened into X) as a matmul
# batch axis rather than through ``vmap``, so the scan over chunks slices every per-chunk
# tensor without transposes. The sequence is processed as a ``lax.scan`` over groups of
# ``G`` chunks read straight from the ``[B, T, H, D]`` inputs (plus one shorter group for
# the remaining ``N mod G`` chunks): each step lays its group out chunk-major, does all
# state-free work (Gram matrices, triangular inverse, W, U, reads) as batched matmuls
# over the group's chunks, and runs the inner scan that carries the state chunk to
# chunk. Temporaries are one group's worth (≈ _GROUP_BYTES per tensor) instead of
# whole-sequence ``[N, X, C, C]`` tensors, which on the project's 2-core CPU were
# re-faulted from the OS on every call (33k vs 14k page faults per call at T=8192, B=1,
# H=8, D=64): the grouped forward ran 1.45× faster. The group step is rematerialised
# (``jax.checkpoint``) for the backward pass.

_GROUP_BYTES = 1 << 19


def _mT(x):
  return jnp.swapaxes(x, -1, -2)


def chunked_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, *, rule: str, chunk_size: int,
                 dot: Matmul = _HIGHEST):
  """One head, intra-chunk parallel + ``lax.scan`` over chunks; see the module docstring."""
  add = lambda x: None if x is None else x[None, :, None]  # [T, ...] -> [1, T, 1, ...]
  o_BTHV, S_BHVK = chunked(add(q_TK), add(k_TK), add(v_TV), add(beta_T), add(logg_T),
                           S_VK[None, None], rule=rule, chunk_size=chunk_size, dot=dot)
  return o_BTHV[0, :, 0], S_BHVK[0, 0]


def chunked(q_BTHK, k_BTHK, v_BTHV, beta_BTH, logg_BTH, S_BHVK, *, rule: str, chunk_size: int,
            group: Optional[int] = None, dot: Matmul = _HIGHEST):
  """Chunked form on ``[B, T, H, ·]`` -> ``(o [B, T, H, D_v], S_T [B, H, D_v, D_k])``.

  ``T`` is padded at the end to a multiple of ``C = min(chunk_size, T)`` with ``β = 0``,
  zero q/k/v and log-decay 0 (``γ = 1``), which leave the state unchanged; the output is
  sliced back to ``T``. The ``N`` chunks run as a scan over ``N // G`` groups of ``G``
  (``group``, or from :data:`_GROUP_BYTES`) plus one group of the last ``N mod G``.
  Inputs in the accumulation dtype; no argument checks.
  """
  check_choice("rule", rule, RULES)
  chunk_size = check_positive_int("chunk_size", chunk_size)
  B, T, H, Dk = q_BTHK.shape
  Dv = v_BTHV.shape[-1]
  X = B * H
  C = min(chunk_size, T)
  N = -(-T // C)
  if group is None:
    group = _GROUP_BYTES // (X * C * max(C, Dk, Dv) * q_BTHK.dtype.itemsize)
  G = max(1, min(group, N))
  n_full, rem = divmod(N, G)
  n_pad = N * C - T

  # B = 1: the groups are a plain reshape [Ng, G·C, H, ...] with no batch axis. Written as a
  # moveaxis of the size-1 batch axis, XLA:CPU gave it a permuted layout and copied every
  # input before the loop (at T=8192, H=8, D=64: 13.4k vs 4.1k page faults per call, the
  # forward 1.3-1.8× slower).
  squeeze = B == 1

  def to_groups(x, ng, g):  # [B, ng·g·C, H, ...] -> [ng, B, g·C, H, ...] ([ng, g·C, H, ...] when B = 1)
    if squeeze:
      return x.reshape((ng, g * C) + x.shape[2:])
    return jnp.moveaxis(x.reshape((B, ng, g * C) + x.shape[2:]), 1, 0)

  def make_step(g):
    def chunk_major(x):  # one group [B, g·C, H, ...] (or [g·C, H, ...]) -> [g, X, C, ...]
      x = x.reshape((B, g, C, H) + x.shape[2 if squeeze else 3:])
      x = jnp.moveaxis(x, (1, 0, 3, 2), (0, 1, 2, 3))
      return x.reshape((g, X, C) + x.shape[4:])  # from [g, B, H, C, ...]

    def step(S_XAB, xs):
      q, k, v, beta, logg = (None if x is None else chunk_major(x) for x in xs)
      if rule == "oja":
        o_GXCV, S_XAB = _oja_chunks(q, k, v, beta, S_XAB, dot)
      else:
        o_GXCV, S_XAB = _delta_chunks(q, k, v, beta, logg, S_XAB, rule=rule, dot=dot)
      o = jnp.moveaxis(o_GXCV.reshape((g, B, H, C, Dv)), (0, 1, 2, 3), (1, 0, 3, 2))
      return S_XAB, o.reshape((B, g * C, H, Dv))

    # remat: the backward pass recomputes a group's intermediates from its inputs and
    # carry instead of storing them all (less memory and, measured, ~1.4× faster on CPU)
    return jax.checkpoint(step, prevent_cse=False)

  xs = []
  for x in (q_BTHK, k_BTHK, v_BTHV, beta_BTH, logg_BTH):
    if x is not None and n_pad:
      x = jnp.pad(x, [(0, 0), (0, n_pad)] + [(0, 0)] * (x.ndim - 2))
    xs.append(x)
  S_XVK = S_BHVK.reshape((X, Dv, Dk))
  # oja runs on S [D_v, D_k]; the delta rules on the key×value layout S̃ = Sᵀ
  S_XAB = S_XVK if rule == "oja" else _mT(S_XVK)
  L = n_full * G * C
  main = tuple(None if x is None else to_groups(x if rem == 0 else x[:, :L], n_full, G) for x in xs)
  S_XAB, o_NgBLHV = jax.lax.scan(make_step(G), S_XAB, main)
  o_BTHV = jnp.moveaxis(o_NgBLHV, 0, 1).reshape((B, L, H, Dv))
  if rem:  # the last N mod G chunks: one shorter group (no padding to a whole group)
    tail = tuple(None if x is None else (x[0, L:] if squeeze else x[:, L:]) for x in xs)
    S_XAB, o_tail = make_step(rem)(S_XAB, tail)
    o_BTHV = jnp.concatenate([o_BTHV, o_tail], axis=1)
  S_XVK = S_XAB if rule == "oja" else _mT(S_XAB)
  return o_BTHV[:, :T], S_XVK.reshape((B, H, Dv, Dk))


def _causal(C: int, ndim: int, strict: bool = False):
  """Lower-triangular ``[1, .., 1, C, C]`` mask: row ``t`` sees column ``i ≤ t`` (``i < t``)."""
  t, i = jnp.arange(C)[:, None], jnp.arange(C)[None, :]
  return ((t > i) if strict else (t >= i)).reshape((1,) * (ndim - 2) + (C, C))


def _eye(n: int, ndim: int, dtype):
  return jnp.eye(n, dtype=dtype).reshape((1,) * (ndim - 2) + (n, n))


_BASE_INVERSE = 8  # blocks up to this size: forward substitution row by row


def unit_lower_inverse(A_XCC, dot: Matmul = _HIGHEST):
  """``(I + A)^{-1}`` for strictly lower-triangular ``A [..., C, C]`` (the UT transform's T).

  Recursive 2×2 block inversion (the block method for triangular inversion, e.g.
  Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, ch. 14):
  ``[[I + A11, 0], [A21, I + A22]]^{-1} = [[T11, 0], [−T22 A21 T11, T22]]``, both halves
  inverted together as one batch, down to forward substitution on blocks of ≤ 8 rows.
  Matmuls only (at ``dot``'s precision), so it maps onto accelerator matrix units; on the
  project's CPU the inverse plus the two products ``W``, ``U`` ran ~2× faster than one
  batched LAPACK ``trsm`` solve for ``[W, U]`` (whose time also swung ~10× with BLAS
  threading). ``C`` is padded with zeros (identity blocks) to ``m·2^L`` with ``m ≤ 8``, the
  least such size (``L`` halvings reach blocks of ``m`` rows; the padding is under 25% of
  ``C``, where a power of two would nearly double ``C = 2100`` to 4096), then sliced back.
  The batch is flattened to one axis first: the forward substitution written on
  rank-8/9 arrays crashed XLA:CPU (jaxlib 0.10, segfault at run time) for some shapes.
  """
  *batch, C, _ = A_XCC.shape
  A_XCC = A_XCC.reshape((-1, C, C))  # one batch axis: every op stays at rank <= 4
  L = 0
  while -(-C // (1 << L)) > _BASE_INVERSE:
    L += 1
  P = -(-C // (1 << L)) << L
  if P != C:
    A_XCC = jnp.pad(A_XCC, [(0, 0), (0, P - C), (0, P - C)])
  return _inverse_rec(A_XCC, dot)[:, :C, :C].reshape(tuple(batch) + (C, C))


def _inverse_rec(A_XCC, dot):
  X, C, _ = A_XCC.shape
  if C <= _BASE_INVERSE:
    return _inverse_forward_substitution(A_XCC)
  h = C // 2
  T_2XHH = _inverse_rec(jnp.concatenate([A_XCC[:, :h, :h], A_XCC[:, h:, h:]], axis=0), dot)
  T11, T22 = T_2XHH[:X], T_2XHH[X:]
  T21 = -dot(T22, dot(A_XCC[:, h:, :h], T11))
  top = jnp.concatenate([T11, jnp.zeros_like(T11)], axis=-1)
  return jnp.concatenate([top, jnp.concatenate([T21, T22], axis=-1)], axis=-2)


def _inverse_forward_substitution(A_XCC):
  """Row ``i`` of ``T = (I + A)^{-1}``: ``T_i = e_i − Σ_{j<i} A_ij T_j`` (elementwise, no matmul)."""
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


def _delta_chunks(q_NXCK, k_NXCK, v_NXCV, beta_NXC, logg_NXC, St_XKV, *, rule: str, dot: Matmul):
  """hebb / delta / decay / gated_delta on ``N`` chunks (one group), state ``S̃ = Sᵀ [X, K, V]``.

  The UT / WY construction of the module docstring (the digest's chunked form, with the
  decays of Gated DeltaNet entering as ``Γ`` and ``G``); returns ``(O [N, X, C, V], S̃_N)``.
  """
  C = q_NXCK.shape[2]
  decays, erases = rule in DECAY_RULES, rule in ("delta", "gated_delta")
  bv_NXCV = beta_NXC[..., None] * v_NXCV
  scores_NXCC = dot(q_NXCK, _mT(k_NXCK))
  if decays:
    # Γ_ti = Π_{i<s≤t} γ_s (0 for i > t), G_t = Π_{s≤t} γ_s, G_C / G_i: segment sums, no subtraction
    gamma_NXCC, G_NXC, kend_NXC, gend_NX = _decay_mask(logg_NXC)
    kend_NXCK = kend_NXC[..., None] * k_NXCK  # (G_C / G_i) k_i
    scores_NXCC = scores_NXCC * gamma_NXCC  # (Q Kᵀ) ⊙ Γ
  else:
    kend_NXCK = k_NXCK
    scores_NXCC = jnp.where(_causal(C, 4), scores_NXCC, 0.0)  # tril(Q Kᵀ)
  kendT_NXKC = _mT(kend_NXCK)

  if erases:
    A_NXCC = beta_NXC[..., None] * dot(k_NXCK, _mT(k_NXCK))
    A_NXCC = jnp.where(_causal(C, 4, strict=True), A_NXCC * gamma_NXCC if decays else A_NXCC, 0.0)
    T_NXCC = unit_lower_inverse(A_NXCC, dot)
    bk_NXCK = beta_NXC[..., None] * k_NXCK
    W_NXCK = dot(T_NXCC, G_NXC[..., None] * bk_NXCK if decays else bk_NXCK)  # W = T diag(βG) K
    U_NXCV = dot(T_NXCC, bv_NXCV)  # U = T diag(β) V
    if not decays:
      gend_NX = jnp.ones(q_NXCK.shape[:2], St_XKV.dtype)

    def body(St_XKV, x):  # the sequential part: two small matmuls per chunk
      W_XCK, U_XCV, kendT_XKC, gend_X = x
      D_XCV = U_XCV - dot(W_XCK, St_XKV)  # the effective writes V' = U − W S̃
      return gend_X[:, None, None] * St_XKV + dot(kendT_XKC, D_XCV), (St_XKV, D_XCV)

    xs = (W_NXCK, U_NXCV, kendT_NXKC, gend_NX)
    St_XKV, (S0_NXKV, D_NXCV) = jax.lax.scan(body, St_XKV, xs)
  else:  # W = 0: the writes β V are known up front
    D_NXCV = bv_NXCV
    S0_NXKV, St_XKV = _additive_scan(gend_NX if decays else None, dot(kendT_NXKC, D_NXCV), St_XKV)

  inter_NXCV = dot(q_NXCK, S0_NXKV)
  if decays:
    inter_NXCV = G_NXC[..., None] * inter_NXCV
  return inter_NXCV + dot(scores_NXCC, D_NXCV), St_XKV


def _oja_chunks(q_NXCK, k_NXCK, v_NXCV, beta_NXC, S_XVK, dot: Matmul):
  """Oja chunks on ``S [X, D_v, D_k]``: the delta construction with write-key ``v``."""
  C = q_NXCK.shape[2]
  vT_NXVC = _mT(v_NXCV)
  A_NXCC = beta_NXC[..., None] * dot(v_NXCV, vT_NXVC)
  T_NXCC = unit_lower_inverse(jnp.where(_causal(C, 4, strict=True), A_NXCC, 0.0), dot)
  W_NXCV = dot(T_NXCC, beta_NXC[..., None] * v_NXCV)
  U_NXCK = dot(T_NXCC, beta_NXC[..., None] * k_NXCK)

  def body(S_XVK, x):  # S_{n+1} = S_n + Vᵀ (U − W S_n)
    W_XCV, U_XCK, vT_XVC = x
    D_XCK = U_XCK - dot(W_XCV, S_XVK)
    return S_XVK + dot(vT_XVC, D_XCK), (S_XVK, D_XCK)

  S_XVK, (S0_NXVK, D_NXCK) = jax.lax.scan(body, S_XVK, (W_NXCV, U_NXCK, vT_NXVC))
  qd_NXCC = jnp.where(_causal(C, 4), dot(q_NXCK, _mT(D_NXCK)), 0.0)  # tril(Q Δᵀ)
  return dot(q_NXCK, _mT(S0_NXVK)) + dot(qd_NXCC, v_NXCV), S_XVK


# ----------------------------------------------------------------------------------------
# Dispatch over modes, batch and heads.


def _run(rule, mode, chunk_size, dot, q, k, v, beta, logg, S0):
  """``[B, T, H, ·]`` inputs (accumulation dtype) -> ``(o [B, T, H, D_v], S [B, H, D_v, D_k])``."""
  T = q.shape[1]
  if mode == "chunked" or (mode == "parallel" and rule in ("delta", "gated_delta")):
    # parallel delta rules: the UT form with one chunk spanning the sequence
    C = chunk_size if mode == "chunked" else T
    return chunked(q, k, v, beta, logg, S0, rule=rule, chunk_size=C, dot=dot)
  head = functools.partial(recurrent_head if mode == "recurrent" else parallel_head, rule=rule, dot=dot)
  t = 1  # per batch element, time-major [T, H, ...]: heads on axis 1
  lg = t if logg is not None else None
  over_heads = jax.vmap(head, in_axes=(t, t, t, t, lg, 0), out_axes=(t, 0))
  over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, 0, None if logg is None else 0, 0))
  return over_batch(q, k, v, beta, logg, S0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 3))
def _auto(rule, fwd_mode, chunk_size, dot, q, k, v, beta, logg, S0):
  """auto: the forward-fastest form when not differentiated, the chunked form's JVP when."""
  return _run(rule, fwd_mode, chunk_size, dot, q, k, v, beta, logg, S0)


@_auto.defjvp
def _auto_jvp(rule, fwd_mode, chunk_size, dot, primals, tangents):
  del fwd_mode
  return jax.jvp(functools.partial(_run, rule, "chunked", chunk_size, dot), primals, tangents)


def auto_forward_mode(platform: Optional[str] = None) -> str:
  """The form ``mode="auto"`` runs when no gradient is taken (see module docstring)."""
  platform = platform or jax.default_backend()
  return "recurrent" if platform == "cpu" else "chunked"


@functools.partial(jax.jit, static_argnames=("rule", "mode", "chunk_size", "normalize_keys", "dot"))
def _forward(q, k, v, beta, logg, S0, *, rule, mode, chunk_size, normalize_keys, dot):
  acc = jnp.promote_types(_acc_dtype(q, k, v), S0.dtype)  # as step(): a float64 state stays float64
  q, k, v, beta, S0 = (x.astype(acc) for x in (q, k, v, beta, S0))
  logg = logg.astype(acc) if logg is not None else None
  if normalize_keys:
    k = l2_normalize(k)
  if mode == "auto":
    return _auto(rule, auto_forward_mode(), chunk_size, dot, q, k, v, beta, logg, S0)
  return _run(rule, mode, chunk_size, dot, q, k, v, beta, logg, S0)


# ----------------------------------------------------------------------------------------
# Public API.


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _as_array(x):
  """Lists and Python numbers become arrays (so a list is not mistaken for a scalar)."""
  return x if x is None or isinstance(x, jax.Array) else jnp.asarray(x)


def _check_shape(name: str, x, want: tuple, layout: str):
  shape = shape_of(x)
  if shape != () and shape != want:
    raise ValueError(f"`{name}` must be a scalar or have shape [{layout}] = {want}, got {shape}.")


def _check_finite_values(name: str, x) -> None:
  if x is None or not _is_concrete(x):
    return
  a = np.asarray(x, np.float64)
  if not np.all(np.isfinite(a)):
    bad = a[~np.isfinite(a)].ravel()[:3].tolist()
    raise ValueError(f"`{name}` must be finite, got value(s) such as {bad}.")


def _check_decay_values(decay, name: str) -> None:
  """γ ∈ [0, 1] (decay=) when concrete."""
  if decay is None or not _is_concrete(decay):
    return
  d = np.asarray(decay, np.float64)
  ok = np.isfinite(d) & (d >= 0) & (d <= 1)
  if not np.all(ok):
    raise ValueError(f"`{name}` must lie in [0, 1], got value(s) such as {d[~ok].ravel()[:3].tolist()}.")


def _check_log_decay_values(log_decay, name: str) -> None:
  """log γ ∈ [−inf, 0] (log_decay=) when concrete."""
  if log_decay is None or not _is_concrete(log_decay):
    return
  d = np.asarray(log_decay, np.float64)
  ok = d <= 0  # False for NaN; −inf (γ = 0) is allowed
  if not np.all(ok):
    raise ValueError(f"`{name}` must be <= 0 (log γ with γ in [0, 1]; -inf is γ = 0), got value(s) "
                     f"such as {d[~ok].ravel()[:3].tolist()}.")


def _stability_slack(*dtypes) -> float:
  """Relative slack on β‖a‖² ≤ 2: the rounding of the inputs' dtype (3·eps, at least 1e-4).

  Keys L2-normalised in bfloat16 have ‖k‖² within ±1.6% of 1 (measured, D = 8 … 128), so
  3·eps = 2.3% lets β = 2 pass with them.
  """
  eps = max(float(jnp.finfo(d).eps) for d in dtypes if jnp.issubdtype(d, jnp.floating))
  return max(1e-4, 3.0 * eps)


def _check_stability(rule: str, beta, k, v, normalize_keys: bool) -> None:
  """Raises when concrete ``β_t‖a_t‖²`` leaves ``[0, 2]`` (a = k, or v for oja), or β is not finite."""
  _check_finite_values("beta", beta)
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
  if not np.all(np.isfinite(prod)):
    arg = "v" if rule == "oja" else "k"
    raise ValueError(f"`{arg}` must be finite for rule {rule!r} (it sets the erase factor), got a non-finite "
                     f"value in shape {shape_of(a)}.")
  slack = _stability_slack(jnp.result_type(a), jnp.result_type(1.0 if beta is None else beta))
  if np.any(prod < -slack) or np.any(prod > 2.0 * (1.0 + slack)):
    which, arg = ("‖v_t‖²", "v") if rule == "oja" else ("‖k_t‖²", "k")
    worst = float(prod.max()) if prod.max() > 2 else float(prod.min())
    raise ValueError(
        f"rule {rule!r} diverges unless 0 <= beta_t·{which} <= 2 for every token, got {worst:.4g} "
        f"(`beta` shape {shape_of(beta)}, `{arg}` shape {shape_of(a)}); "
        + ("normalise the values or lower beta." if rule == "oja"
           else "pass normalize_keys=True (or L2-normalise k) and keep beta in [0, 2].")
    )


def _decay_args(rule, decay, log_decay, names, want, layout):
  """Validates the decay / log-decay pair; returns the log-decay array or None."""
  d_name, l_name = names
  if rule in DECAY_RULES:
    if decay is None and log_decay is None:
      raise ValueError(f"rule {rule!r} needs `{d_name}` (γ in [0, 1]) or `{l_name}` (log γ <= 0), "
                       f"[{layout}] or a scalar.")
    if decay is not None and log_decay is not None:
      raise ValueError(f"pass `{d_name}` or `{l_name}`, not both.")
  elif decay is not None or log_decay is not None:
    given = d_name if decay is not None else l_name
    raise ValueError(f"`{given}` is only used by rules {list(DECAY_RULES)}, got it for rule {rule!r}.")
  if decay is not None:
    _check_shape(d_name, decay, want, layout)
    _check_decay_values(decay, d_name)
  if log_decay is not None:
    _check_shape(l_name, log_decay, want, layout)
    _check_log_decay_values(log_decay, l_name)


def _log_decay(decay, log_decay, acc, shape):
  if decay is not None:
    return log_of_decay(jnp.broadcast_to(jnp.asarray(decay, acc), shape))
  if log_decay is not None:
    return jnp.broadcast_to(jnp.asarray(log_decay, acc), shape)
  return None


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
    log_decay: Any = None,
    initial_state: Optional[jax.Array] = None,
    return_state: bool = False,
    normalize_keys: bool = False,
    precision: Any = "highest",
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
      ``T`` works (padded internally to the next multiple of the chunk).
    decay: ``γ`` in ``[0, 1]``, ``[B, T, H]`` or a scalar; or
    log_decay: ``log γ`` in ``[−inf, 0]`` (preferred: ``jax.nn.log_sigmoid(z)``). Exactly one
      of the two is required for ``decay`` and ``gated_delta``; both are rejected for the
      other rules.
    initial_state: ``S_0 [B, H, D_v, D_k]``; zeros when None.
    return_state: also return the final state ``S_T [B, H, D_v, D_k]``.
    normalize_keys: L2-normalise ``k`` before writing (the stability guard of the delta
      rules; for ``oja`` normalise ``v`` instead, see the module docstring).
    precision: matmul precision (:mod:`jaxmem.kernels.precision`); ``"highest"`` keeps
      float32 accuracy on every platform.

  Returns:
    ``o [B, T, H, D_v]`` in the dtype of ``v``, and ``S_T`` if ``return_state`` (in the
    dtype of ``initial_state``, else float32 — float64 for float64 inputs).

  Raises:
    ValueError: wrong ranks or mismatched batch/length/heads/key widths; bad ``rule``,
      ``mode``, ``chunk_size``, ``precision``; ``parallel`` with ``oja``; ``decay`` /
      ``log_decay`` missing, both given, given for a rule without decay, of the wrong
      shape, or (when concrete) out of range; ``beta``/``initial_state`` of the wrong
      shape; concrete ``beta`` not finite, or ``β‖k‖²`` (``β‖v‖²`` for oja) outside
      ``[0, 2]`` for the erasing rules.
  """
  check_choice("rule", rule, RULES)
  check_choice("mode", mode, MODES)
  chunk_size = check_positive_int("chunk_size", chunk_size)
  dot = matmul_for(precision)
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
  beta, decay, log_decay = _as_array(beta), _as_array(decay), _as_array(log_decay)
  if beta is not None:
    _check_shape("beta", beta, (B, T, H), "B, T, H")
  _decay_args(rule, decay, log_decay, ("decay", "log_decay"), (B, T, H), "B, T, H")
  if initial_state is not None:
    s = shape_of(initial_state)
    if s != (B, H, Dv, Dk):
      raise ValueError(
          f"`initial_state` must have shape [B, H, D_v, D_k] = {(B, H, Dv, Dk)}, got {s}."
      )
  _check_stability(rule, beta, k, v, normalize_keys)

  acc = _acc_dtype(q, k, v)
  if initial_state is not None:
    acc = jnp.promote_types(acc, jnp.result_type(initial_state))
  beta_BTH = jnp.ones((B, T, H), acc) if beta is None else jnp.broadcast_to(beta.astype(acc), (B, T, H))
  logg_BTH = _log_decay(decay, log_decay, acc, (B, T, H))
  S0 = jnp.zeros((B, H, Dv, Dk), acc) if initial_state is None else jnp.asarray(initial_state)
  o, S = _forward(q, k, v, beta_BTH, logg_BTH, S0, rule=rule, mode=mode, chunk_size=chunk_size,
                  normalize_keys=bool(normalize_keys), dot=dot)
  o = o.astype(v.dtype)
  if initial_state is not None:
    S = S.astype(S0.dtype)
  return (o, S) if return_state else o


def init_state(batch: int, heads: int, d_k: int, d_v: int, dtype=jnp.float32) -> jax.Array:
  """The empty memory ``S_0 = 0``, ``[batch, heads, d_v, d_k]``."""
  for name, n in (("batch", batch), ("heads", heads), ("d_k", d_k), ("d_v", d_v)):
    check_positive_int(name, n)
  return jnp.zeros((batch, heads, d_v, d_k), dtype)


def step(state, q_t, k_t, v_t, beta_t=None, decay_t=None, *, rule: str, log_decay_t=None,
         normalize_keys: bool = False, precision: Any = "highest"):
  """One token of inference: write ``(k_t, v_t)`` with ``rule``, then read ``o_t = S_t q_t``.

  Args:
    state: ``S_{t−1} [B, H, D_v, D_k]``.
    q_t, k_t: ``[B, H, D_k]``; v_t: ``[B, H, D_v]``.
    beta_t: ``[B, H]`` or a scalar (None → 1).
    decay_t: ``γ_t`` in ``[0, 1]``, or log_decay_t: ``log γ_t`` in ``[−inf, 0]``; ``[B, H]``
      or a scalar; exactly one is required for ``decay``/``gated_delta``.
    rule, normalize_keys, precision: as in :func:`associative_memory`.

  Returns:
    ``(S_t [B, H, D_v, D_k], o_t [B, H, D_v])`` — carry first, so ``step`` is a ``lax.scan``
    body as it is (the sequence form returns ``(o, S)``): ``S_t`` in the dtype of ``state`` (the
    update is computed in float32, or float64 for float64 inputs, and rounded back once,
    so a ``lax.scan`` carry keeps its dtype); ``o_t`` in the dtype of ``v_t``.
  """
  check_choice("rule", rule, RULES)
  dot = matmul_for(precision)
  B, H, Dv, Dk = check_rank("state", state, 4, "B, H, D_v, D_k")
  Bq, Hq, Dq = check_rank("q_t", q_t, 3, "B, H, D_k")
  Bk, Hk, Dkk = check_rank("k_t", k_t, 3, "B, H, D_k")
  Bv, Hv, Dvv = check_rank("v_t", v_t, 3, "B, H, D_v")
  check_equal("batch sizes", state=B, q_t=Bq, k_t=Bk, v_t=Bv)
  check_equal("numbers of heads", state=H, q_t=Hq, k_t=Hk, v_t=Hv)
  check_equal("key widths", state=Dk, q_t=Dq, k_t=Dkk)
  check_equal("value widths", state=Dv, v_t=Dvv)
  beta_t, decay_t, log_decay_t = _as_array(beta_t), _as_array(decay_t), _as_array(log_decay_t)
  if beta_t is not None:
    _check_shape("beta_t", beta_t, (B, H), "B, H")
  _decay_args(rule, decay_t, log_decay_t, ("decay_t", "log_decay_t"), (B, H), "B, H")
  _check_stability(rule, beta_t, k_t, v_t, normalize_keys)

  acc = jnp.promote_types(_acc_dtype(q_t, k_t, v_t), state.dtype)
  q, k, v = (x.astype(acc) for x in (q_t, k_t, v_t))
  if normalize_keys:
    k = l2_normalize(k)
  b = jnp.broadcast_to(jnp.asarray(1.0 if beta_t is None else beta_t, acc), (B, H))
  logg = _log_decay(decay_t, log_decay_t, acc, (B, H))
  g = jnp.ones((B, H), acc) if logg is None else jnp.exp(logg)
  update = jax.vmap(jax.vmap(functools.partial(_update, rule, dot=dot)))
  S = update(state.astype(acc), k, v, b, g)
  o = dot.einsum("bhvk,bhk->bhv", S, q)
  return S.astype(state.dtype), o.astype(v_t.dtype)


__all__ = [
    "DECAY_FLOOR", "MODES", "RULES", "associative_memory", "auto_forward_mode", "chunked",
    "chunked_head", "init_state", "l2_normalize", "log_of_decay", "parallel_head",
    "recurrent_head", "step", "unit_lower_inverse",
]
