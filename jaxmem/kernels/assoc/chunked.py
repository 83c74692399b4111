"""Chunked form: intra-chunk parallel (UT / WY transform) + ``lax.scan`` over chunks.

Inputs ``q, k [B, T, H, D_k]``, ``v [B, T, H, D_v]``, ``β, log γ [B, T, H]``, state
``S [B, H, D_v, D_k]``; chunks of ``C`` rows. In the key×value layout ``S̃ = Sᵀ`` a gated
delta chunk (Yang et al. 2024, arXiv 2406.06484; decays as in Gated DeltaNet) is::

    A = tril(diag(β) (K Kᵀ ⊙ Γ), −1),   T = (I + A)^{-1}       (:func:`unit_lower_inverse`)
    W = T diag(β G) K,   U = T diag(β) V,   Δ = U − W S̃_0
    O = diag(G) Q S̃_0 + (tril(Q Kᵀ) ⊙ Γ) Δ,   S̃_C = G_C S̃_0 + (diag(G_C / G) K)ᵀ Δ

``Γ_ti = Π_{i<s≤t} γ_s``, ``G_t = Π_{s≤t} γ_s``; delta is ``G = 1``, decay ``W = 0``, hebb
both. Oja (and gated_oja, Oja after a decay) is the same construction on ``S [D_v, D_k]`` with keys and
values swapped as write-key / write-value. ``T`` not a multiple of ``C`` is padded with ``β = 0``, zero
q/k/v, ``γ = 1``. Derivation, padding rule and measurements: ``jaxmem/kernels/assoc/README.md``.

Tested: ``tests/kernels/test_assoc.py::test_every_mode_matches_numpy_loop_with_initial_state``
and ``::test_chunked_grouping_and_chunk_sizes`` (equal to the float64 loop for every rule,
chunk size and grouping), ``::test_unit_lower_inverse_matches_numpy``,
``test_assoc_numerics.py::test_chunked_pads_to_the_next_chunk_only``,
``test_assoc_vs_fla.py::test_chunked_delta_equals_fla_naive_chunkwise``.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxmem.checks import check_choice, check_positive_int
from jaxmem.kernels.assoc.common import DECAY_RULES, HIGHEST, OJA_RULES, RULES, causal, decay_mask, eye, mT
from jaxmem.kernels.precision import Matmul

# The per-chunk algebra is written on chunk-major arrays ``[N, X, C, D]`` (chunk, head,
# row in chunk, feature) with the heads (batch × heads, flattened into X) as a matmul
# batch axis rather than through ``vmap``, so the scan over chunks slices every per-chunk
# tensor without transposes. The sequence is processed as a ``lax.scan`` over groups of
# ``G`` chunks read straight from the ``[B, T, H, D]`` inputs (plus one shorter group for
# the remaining ``N mod G`` chunks): each step lays its group out chunk-major, does all
# state-free work (Gram matrices, triangular inverse, W, U, reads) as batched matmuls
# over the group's chunks, and runs the inner scan that carries the state chunk to
# chunk. Temporaries are one group's worth (≈ _GROUP_BYTES per tensor) instead of
# whole-sequence ``[N, X, C, C]`` tensors, which the OS re-faults on every call
# (measurements: jaxmem/kernels/assoc/README.md). The group step is rematerialised
# (``jax.checkpoint``) for the backward pass.

_GROUP_BYTES = 1 << 19


def chunked_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, *, rule: str, chunk_size: int,
                 dot: Matmul = HIGHEST):
  """One head, intra-chunk parallel + ``lax.scan`` over chunks; returns ``(o [T, D_v], S_T [D_v, D_k])``."""
  add = lambda x: None if x is None else x[None, :, None]  # [T, ...] -> [1, T, 1, ...]
  o_BTHV, S_BHVK = chunked_scan(add(q_TK), add(k_TK), add(v_TV), add(beta_T), add(logg_T),
                           S_VK[None, None], rule=rule, chunk_size=chunk_size, dot=dot)
  return o_BTHV[0, :, 0], S_BHVK[0, 0]


def chunked_scan(q_BTHK, k_BTHK, v_BTHV, beta_BTH, logg_BTH, S_BHVK, *, rule: str, chunk_size: int,
            group: Optional[int] = None, dot: Matmul = HIGHEST, sequences=None):
  """Chunked form on ``[B, T, H, ·]`` -> ``(o [B, T, H, D_v], S_T [B, H, D_v, D_k])``.

  ``T`` is padded at the end to a multiple of ``C = min(chunk_size, T)`` with ``β = 0``,
  zero q/k/v and log-decay 0 (``γ = 1``), which leave the state unchanged; the output is
  sliced back to ``T``. The ``N`` chunks run as a scan over ``N // G`` groups of ``G``
  (``group``, or from :data:`_GROUP_BYTES`) plus one group of the last ``N mod G``.
  Inputs in the accumulation dtype; no argument checks.

  ``sequences = (load [N], store [N], states [M, H, D_v, D_k])`` (``B = 1``; the chunk layout of
  :mod:`jaxmem.kernels.assoc.varlen`, where no chunk holds two sequences): chunk ``j`` starts from
  ``states[load[j]]`` where ``load[j] < M``, else from the state the previous chunk left, and the state after
  chunk ``j`` is sequence ``store[j]``'s final state where ``store[j] < M``. A third output then holds the
  ``M`` final states ``[M, H, D_v, D_k]`` (zeros for a sequence no chunk stores, e.g. an empty one).
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
  if sequences is not None and (B != 1 or sequences[0].shape != (N,) or sequences[1].shape != (N,)):
    raise ValueError(f"chunked_scan: per-sequence states need B = 1 and one load and store index per chunk "
                     f"({N} chunks), got B = {B} and {sequences[0].shape}, {sequences[1].shape}.")
  # oja runs on S [D_v, D_k]; the delta rules on the key×value layout S̃ = Sᵀ
  layout = (lambda S: S) if rule in OJA_RULES else mT  # S [.., D_v, D_k] <-> the rule's carry layout
  if sequences is not None:
    M = sequences[2].shape[0]
    states_MXAB = layout(sequences[2].reshape((M, X, Dv, Dk)).astype(q_BTHK.dtype))

  def to_groups(x, ng, g):  # [B, ng·g·C, H, ...] -> [ng, B, g·C, H, ...] ([ng, g·C, H, ...] when B = 1)
    if squeeze:
      return x.reshape((ng, g * C) + x.shape[2:])
    return jnp.moveaxis(x.reshape((B, ng, g * C) + x.shape[2:]), 1, 0)

  def make_step(g):
    def chunk_major(x):  # one group [B, g·C, H, ...] (or [g·C, H, ...]) -> [g, X, C, ...]
      x = x.reshape((B, g, C, H) + x.shape[2 if squeeze else 3:])
      x = jnp.moveaxis(x, (1, 0, 3, 2), (0, 1, 2, 3))
      return x.reshape((g, X, C) + x.shape[4:])  # from [g, B, H, C, ...]

    def step(carry, xs):
      xs, seq = (xs[:5], None) if sequences is None else (xs[:5], xs[5:] + (states_MXAB,))
      q, k, v, beta, logg = (None if x is None else chunk_major(x) for x in xs)
      if rule in OJA_RULES:
        o_GXCV, carry = _oja_chunks(q, k, v, beta, logg if rule == "gated_oja" else None, carry, dot, seq)
      else:
        o_GXCV, carry = _delta_chunks(q, k, v, beta, logg, carry, rule=rule, dot=dot, seq=seq)
      o = jnp.moveaxis(o_GXCV.reshape((g, B, H, C, Dv)), (0, 1, 2, 3), (1, 0, 3, 2))
      return carry, o.reshape((B, g * C, H, Dv))

    # remat: the backward pass recomputes a group's intermediates from its inputs and
    # carry instead of storing them all (less memory; timings in jaxmem/kernels/assoc/README.md)
    return jax.checkpoint(step, prevent_cse=False)

  xs = []
  for x in (q_BTHK, k_BTHK, v_BTHV, beta_BTH, logg_BTH):
    if x is not None and n_pad:
      x = jnp.pad(x, [(0, 0), (0, n_pad)] + [(0, 0)] * (x.ndim - 2))
    xs.append(x)
  carry = layout(S_BHVK.reshape((X, Dv, Dk)))
  L = n_full * G * C
  main = tuple(None if x is None else to_groups(x if rem == 0 else x[:, :L], n_full, G) for x in xs)
  tail = tuple(None if x is None else (x[0, L:] if squeeze else x[:, L:]) for x in xs)
  if sequences is not None:  # the per-chunk indices ride along with the chunks; the final states in the carry
    main += tuple(i[:n_full * G].reshape((n_full, G)) for i in sequences[:2])
    tail += tuple(i[n_full * G:] for i in sequences[:2])
    carry = (carry, jnp.zeros_like(states_MXAB))
  carry, o_NgBLHV = jax.lax.scan(make_step(G), carry, main)
  o_BTHV = jnp.moveaxis(o_NgBLHV, 0, 1).reshape((B, L, H, Dv))
  if rem:  # the last N mod G chunks: one shorter group (no padding to a whole group)
    carry, o_tail = make_step(rem)(carry, tail)
    o_BTHV = jnp.concatenate([o_BTHV, o_tail], axis=1)
  S_XAB, finals = (carry, None) if sequences is None else carry
  S_BHVK = layout(S_XAB).reshape((B, H, Dv, Dk))
  if sequences is None:
    return o_BTHV[:, :T], S_BHVK
  return o_BTHV[:, :T], S_BHVK, layout(finals).reshape(sequences[2].shape)


_BASE_INVERSE = 8  # blocks up to this size: forward substitution row by row


def unit_lower_inverse(A_XCC, dot: Matmul = HIGHEST):
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
  eye_XCC = jnp.broadcast_to(eye(C, 3, A_XCC.dtype), A_XCC.shape)
  rows = [eye_XCC[:, 0, :]]
  for i in range(1, C):  # static, C <= 8: the rows of one small block, not time steps
    T_prev = jnp.stack(rows, axis=1)  # [X, i, C]
    rows.append(eye_XCC[:, i, :] - jnp.sum(A_XCC[:, i, :i, None] * T_prev, axis=1))
  return jnp.stack(rows, axis=1)


def _scan_chunks(body, carry, xs, seq):
  """``lax.scan`` of ``body: (state, x) -> (state', out)`` over a group's chunks -> ``(carry, outs)``.

  With ``seq = (load [N], store [N], states [M, X, A, B])`` the carry is ``(state, finals [M, X, A, B])``: a
  chunk with ``load < M`` starts from ``states[load]`` instead of the carried state, and the state after a chunk
  with ``store < M`` is added to ``finals[store]`` (zeros until then: each sequence ends in one chunk). Reverse
  mode then only reads the finals' cotangent at each step and accumulates the states' in place; a buffer
  overwritten in the carry was copied whole at every step of the backward scan, and the state after every
  chunk as an output costs a whole-sequence temporary (XLA:CPU).
  """
  if seq is None:
    return jax.lax.scan(body, carry, xs)
  load, store, states = seq
  M = states.shape[0]

  def with_sequences(carry, x):
    (St, finals), (ld, st, x) = carry, x
    St = jnp.where(ld < M, jax.lax.dynamic_index_in_dim(states, jnp.minimum(ld, M - 1), keepdims=False), St)
    St, out = body(St, x)
    return (St, finals.at[st].add(St, mode="drop")), out

  return jax.lax.scan(with_sequences, carry, (load, store, xs))


def _additive_scan(gend_NX, X_NXKV, carry, seq=None):
  """hebb / decay across chunks: ``S̃_{n+1} = G_C S̃_n + X_n`` (``G_C = 1`` when None).

  The per-chunk contributions ``X_n = K̂ᵀ (β ⊙ V)`` do not depend on the state, so they
  are computed for all chunks at once and the sequential part is elementwise. Returns
  (``S̃_n`` before each chunk ``[N, X, K, V]``, the carry after the last; ``seq``: :func:`_scan_chunks`).
  """
  if gend_NX is None:
    carry, S0_NXKV = _scan_chunks(lambda St, X_: (St + X_, St), carry, X_NXKV, seq)
  else:
    body = lambda St, x: (x[0][:, None, None] * St + x[1], St)
    carry, S0_NXKV = _scan_chunks(body, carry, (gend_NX, X_NXKV), seq)
  return S0_NXKV, carry


def _delta_chunks(q_NXCK, k_NXCK, v_NXCV, beta_NXC, logg_NXC, carry, *, rule: str, dot: Matmul, seq=None):
  """hebb / delta / decay / gated_delta on ``N`` chunks (one group), state ``S̃ = Sᵀ [X, K, V]``.

  The UT / WY construction of the module docstring (the chunked form of ``docs/papers/pavlovian.md``,
  with the decays of Gated DeltaNet entering as ``Γ`` and ``G``); returns ``(O [N, X, C, V], S̃_N)``, the carry
  ``(S̃_N, final states)`` with per-sequence states ``seq`` (:func:`_scan_chunks`).
  """
  C = q_NXCK.shape[2]
  decays, erases = rule in DECAY_RULES, rule in ("delta", "gated_delta")
  bv_NXCV = beta_NXC[..., None] * v_NXCV
  scores_NXCC = dot(q_NXCK, mT(k_NXCK))
  if decays:
    # Γ_ti = Π_{i<s≤t} γ_s (0 for i > t), G_t = Π_{s≤t} γ_s, G_C / G_i: segment sums, no subtraction
    gamma_NXCC, G_NXC, kend_NXC, gend_NX = decay_mask(logg_NXC)
    kend_NXCK = kend_NXC[..., None] * k_NXCK  # (G_C / G_i) k_i
    scores_NXCC = scores_NXCC * gamma_NXCC  # (Q Kᵀ) ⊙ Γ
  else:
    kend_NXCK = k_NXCK
    scores_NXCC = jnp.where(causal(C, 4), scores_NXCC, 0.0)  # tril(Q Kᵀ)
  kendT_NXKC = mT(kend_NXCK)

  if erases:
    A_NXCC = beta_NXC[..., None] * dot(k_NXCK, mT(k_NXCK))
    A_NXCC = jnp.where(causal(C, 4, strict=True), A_NXCC * gamma_NXCC if decays else A_NXCC, 0.0)
    T_NXCC = unit_lower_inverse(A_NXCC, dot)
    bk_NXCK = beta_NXC[..., None] * k_NXCK
    W_NXCK = dot(T_NXCC, G_NXC[..., None] * bk_NXCK if decays else bk_NXCK)  # W = T diag(βG) K
    U_NXCV = dot(T_NXCC, bv_NXCV)  # U = T diag(β) V
    if not decays:
      gend_NX = jnp.ones(q_NXCK.shape[:2], q_NXCK.dtype)

    def body(St_XKV, x):  # the sequential part: two small matmuls per chunk
      W_XCK, U_XCV, kendT_XKC, gend_X = x
      D_XCV = U_XCV - dot(W_XCK, St_XKV)  # the effective writes V' = U − W S̃
      return gend_X[:, None, None] * St_XKV + dot(kendT_XKC, D_XCV), (St_XKV, D_XCV)

    xs = (W_NXCK, U_NXCV, kendT_NXKC, gend_NX)
    carry, (S0_NXKV, D_NXCV) = _scan_chunks(body, carry, xs, seq)
  else:  # W = 0: the writes β V are known up front
    D_NXCV = bv_NXCV
    S0_NXKV, carry = _additive_scan(gend_NX if decays else None, dot(kendT_NXKC, D_NXCV), carry, seq)

  inter_NXCV = dot(q_NXCK, S0_NXKV)
  if decays:
    inter_NXCV = G_NXC[..., None] * inter_NXCV
  return inter_NXCV + dot(scores_NXCC, D_NXCV), carry


def _oja_chunks(q_NXCK, k_NXCK, v_NXCV, beta_NXC, logg_NXC, carry, dot: Matmul, seq=None):
  """oja / gated_oja chunks on ``S [X, D_v, D_k]``: the (gated) delta construction with write-key ``v``.

  ``S_t = γ_t (I − β_t v_t v_tᵀ) S_{t−1} + β_t v_t k_tᵀ`` (``γ = 1`` when ``logg_NXC`` is None)::

      A = tril(diag(β) (V Vᵀ ⊙ Γ), −1),  T = (I + A)^{-1},  W = T diag(β G) V,  U = T diag(β) K
      Δ = U − W S_0,   S_C = G_C S_0 + (diag(G_C / G) V)ᵀ Δ,   O = diag(G) Q S_0ᵀ + ((Q Δᵀ) ⊙ Γ) V

  Returns ``(O [N, X, C, V], carry)``; the carry as in :func:`_delta_chunks`.
  """
  C = q_NXCK.shape[2]
  decays = logg_NXC is not None
  A_NXCC = beta_NXC[..., None] * dot(v_NXCV, mT(v_NXCV))
  if decays:
    gamma_NXCC, G_NXC, kend_NXC, gend_NX = decay_mask(logg_NXC)
    A_NXCC = A_NXCC * gamma_NXCC
  T_NXCC = unit_lower_inverse(jnp.where(causal(C, 4, strict=True), A_NXCC, 0.0), dot)
  bv_NXCV = beta_NXC[..., None] * v_NXCV
  W_NXCV = dot(T_NXCC, G_NXC[..., None] * bv_NXCV if decays else bv_NXCV)
  U_NXCK = dot(T_NXCC, beta_NXC[..., None] * k_NXCK)
  vendT_NXVC = mT(kend_NXC[..., None] * v_NXCV if decays else v_NXCV)
  if not decays:
    gend_NX = jnp.ones(q_NXCK.shape[:2], q_NXCK.dtype)

  def body(S_XVK, x):  # S_{n+1} = G_C S_n + (diag(G_C / G) V)ᵀ (U − W S_n)
    W_XCV, U_XCK, vendT_XVC, gend_X = x
    D_XCK = U_XCK - dot(W_XCV, S_XVK)
    return gend_X[:, None, None] * S_XVK + dot(vendT_XVC, D_XCK), (S_XVK, D_XCK)

  carry, (S0_NXVK, D_NXCK) = _scan_chunks(body, carry, (W_NXCV, U_NXCK, vendT_NXVC, gend_NX), seq)
  qd_NXCC = dot(q_NXCK, mT(D_NXCK))  # Q Δᵀ, masked by Γ (decays) or tril
  qd_NXCC = qd_NXCC * gamma_NXCC if decays else jnp.where(causal(C, 4), qd_NXCC, 0.0)
  inter_NXCV = dot(q_NXCK, mT(S0_NXVK))
  if decays:
    inter_NXCV = G_NXC[..., None] * inter_NXCV
  return inter_NXCV + dot(qd_NXCC, v_NXCV), carry
