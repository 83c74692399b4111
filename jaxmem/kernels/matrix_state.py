"""Matrix-state recurrence of the UniMatrix mixers: gated average of outer, diagonal and symmetric updates.

UniMatrix (Liu Xiao 2026, "Associative-State Universal Transformers", arXiv:2604.25930; jaxmem's
summary: ``docs/papers/unimatrix.md``). Per head a square state ``S [S, S]`` (``[B, H, S, S]``
batched), inputs ``q, k, v, d [B, T, H, S]``, gate ``ρ [B, T, H]`` (one scalar per head and token)
or ``[B, T, H, S]`` (one per state channel, below), mixture ``w = (w_o, w_d, w_s)`` (nonnegative,
summing to 1; ``[H, 3]`` or ``[B, T, H, 3]``)::

    U_t = w_o · k_t v_tᵀ + w_d · Diag(d_t) + w_s · ½(k_t v_tᵀ + v_t k_tᵀ)
    S_t = ρ_t S_{t−1} + (1 − ρ_t) U_t           (then S_t ← S_t / max(1, σ_max(S_t)) if spectral_norm)
    o_t = S_t q_t                                (read after write)

Per-channel retention (``ρ_t ∈ [0, 1]^S``) decays the state's *columns*, the index the read
contracts with the query::

    S_t = S_{t−1} Diag(ρ_t) + U_t Diag(1 − ρ_t),   i.e.   S_t[i, j] = ρ_tj S_{t−1}[i, j] + (1 − ρ_tj) U_t[i, j]

Why columns: with ``S = k vᵀ`` and ``S q = k (v · q)`` the column index is the key side of the
associative-memory view (keys ``v``, values ``k``), and a decay on the key side is Gated Linear
Attention's (Yang et al. 2024, "Gated Linear Attention Transformers with Hardware-Efficient
Training", arXiv:2312.06635: ``S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ`` in its ``[d_k, d_v]`` layout,
read ``S_tᵀ q_t``; ours is its transpose). Such a decay can be absorbed into the query and the keys,
``o_t = S_0 Diag(G_t) q_t + Σ_{i≤t} U_i Diag(β_i ⊙ Γ_ti) q_t`` with ``β_i = 1 − ρ_i``,
``Γ_ti = Π_{i<s≤t} ρ_s`` and ``G_t = Π_{s≤t} ρ_s`` taken per channel, so the chunked form stays
query-key scores times values, and each query channel reads memories of its own time scale.
Neither this nor a row decay keeps the symmetric update's state symmetric (``S Diag(ρ)`` is not;
``Diag(√ρ) S Diag(√ρ)`` would be, a different model). ``ρ`` equal across channels is the
per-head gate.

UniMatrix-Core is ``w = (1, 0, 0)`` (``mix=None``); UniMatrix-Discovery uses all three terms and
spectral normalisation. The paper's orientation is kept: ``S = k vᵀ``, so ``S q = k (v · q)``. The
paper's text writes Core's update as the plain sum ``S_t = S_{t−1} + k vᵀ``; its released code uses
the gated average above, which jaxmem follows.

Reuse of the associative memory (:mod:`jaxmem.kernels.assoc`), per-head gates. Unrolled, with ``β_t = 1 − ρ_t``,
``Γ_ti = Π_{i<s≤t} ρ_s`` and ``G_t = Π_{s≤t} ρ_s``::

    S_t = G_t S_0 + Σ_{i≤t} Γ_ti β_i U_i

which is linear in ``U``. Writing ``U_i = (w_o + w_s/2) k vᵀ + (w_s/2) v kᵀ + w_d Diag(d)`` splits
``S_t = A_t + B_t + Diag(h_t)`` into three decaying associative memories, each the ``decay`` rule
``S_t = γ_t S_{t−1} + β_t value_t key_tᵀ`` of :func:`jaxmem.kernels.assoc.associative_memory`
(state ``Σ value keyᵀ [D_value, D_key]``, read ``S q``) with ``γ = ρ``:

* ``A_t = G_t S_0 + Σ Γ_ti β_i (w_o + w_s/2)_i k_i v_iᵀ``: key ``v``, value ``k``, initial state
  ``S_0``; its read ``A_t q_t`` is the outer term's ``k (v · q)`` plus half the symmetric one.
* ``B_t = Σ Γ_ti β_i (w_s/2)_i v_i k_iᵀ``: key ``k``, value ``v``; its read ``B_t q_t`` gives the
  symmetric term's other half ``v (k · q)``, since ``½(k vᵀ + v kᵀ) q = ½(k (v·q) + v (k·q))``.
* ``h_t = Σ Γ_ti β_i (w_d)_i d_i [S]``: a memory with key and query ``e_1`` (the first unit
  vector) and value ``d``, whose state ``Σ d e_1ᵀ`` holds ``h_t`` in its first column and whose
  read ``(h_t e_1ᵀ) e_1`` is ``h_t`` itself; the diagonal term reads ``Diag(h_t) q_t = h_t ⊙ q_t``.
  (One-dimensional keys and queries equal to 1 are the same memory; ``e_1`` keeps the key width
  ``S``, so that all three memories run as one call with ``3H`` heads stacked on the head axis:
  one fused scan for ``S``-times redundant work on the diagonal's heads.)

So ``o_t = A_t q_t + B_t q_t + h_t ⊙ q_t`` and ``S_T = A_T + B_T + Diag(h_T)``. ``mode="chunked"``
runs the stacked memories in the associative memory's chunked form (Yang et al. 2024, "Gated
Linear Attention Transformers with Hardware-Efficient Training", arXiv:2312.06635): per chunk of
rows ``Q, K, V`` with incoming state ``M_0`` (key × value layout), ``O = diag(G) Q M_0 +
(Q Kᵀ ⊙ Γ) diag(β) V`` and a ``lax.scan`` carrying the state from chunk to chunk.
With per-channel gates ``mode="chunked"`` is GLA's chunked form written for this state (one
``S × S`` state, all update terms at once): per chunk of ``C`` rows (``t, i`` counted from its
start) with log-decays ``ℓ_t = log ρ_t [S]`` and ``β_t = −expm1(ℓ_t)``, the chunk-local pairwise
decays ``Γ_ti = exp(Σ_{i<s≤t} ℓ_s) [S]`` (``[C, C, S]``, 0 for ``i > t``; segment sums of
:func:`jaxmem.kernels.segsum.segsum`: no cumulative sums subtracted, every exponent ``≤ 0``),
``G_t = exp(Σ_{s≤t} ℓ_s)`` and ``E_i = exp(Σ_{i<s≤C} ℓ_s)``::

    o_t = S_0 (G_t ⊙ q_t) + Σ_{i≤t} U_i (β_i ⊙ Γ_ti ⊙ q_t)
        = S_0 (G_t ⊙ q_t) + Σ_{i≤t} [a_ti k_i + b_ti v_i] + (Σ_{i≤t} w_d,i β_i ⊙ Γ_ti ⊙ d_i) ⊙ q_t
    a_ti = (w_o + w_s/2)_i Σ_j q_tj Γ_tij β_ij v_ij,   b_ti = (w_s/2)_i Σ_j q_tj Γ_tij β_ij k_ij
    S_C = S_0 Diag(G_C) + Σ_i U_i Diag(β_i ⊙ E_i)

(GLA's "secondary chunking" computes the same ``[C, C, S]`` scores in float32 for sub-chunks;
at UniMatrix's ``S = 16`` one level suffices) with a ``lax.scan`` carrying ``S`` from chunk to
chunk, each chunk's step rematerialised for the backward pass.
``mode="recurrent"`` is a ``lax.scan`` over tokens of the literal update above (all heads and
batch elements at once). ``mode="auto"`` is ``recurrent`` with ``spectral_norm``; otherwise a
``jax.custom_jvp`` that runs the forward-fastest form when not differentiated
(:func:`jaxmem.kernels.assoc.auto_forward_mode`: recurrent on CPU — 1.4–1.8× the chunked forward in
``jaxmem bench unimatrix`` — chunked on accelerators) and the chunked form's JVP when it is.

Decays are taken in log space: ``log_rho = log ρ ∈ [−inf, 0]`` (e.g. ``jax.nn.log_sigmoid(z)``)
with ``1 − ρ = −expm1(log ρ)`` (accurate as ``ρ → 1``), or ``rho = ρ ∈ [0, 1]`` with ``1 − ρ``
computed directly and ``log ρ`` as :func:`jaxmem.kernels.assoc.log_of_decay`. ``ρ = 1``
freezes the state; ``ρ = 0`` makes it ``U_t``; values and gradients are finite at both ends.

Packed sequences (``segment_ids [B, T]``, :mod:`jaxmem.kernels.segments`): the state empties before the
first token of every segment but a row's first (which continues ``initial_state``), and that token's update
keeps its own gate, ``S_t = (1 − ρ_t) U_t`` (so a reset is not ``ρ_t = 0``, which would make the write
weight 1); padding (id 0) leaves the state unchanged and reads 0. Every form does it through the gates,
with ``β = 1 − ρ`` taken from the given gate first: at a start the decay of the state before it is 0
(``ρ = 0`` in the recurrent update ``ρ S + β U``, ``log ρ = −inf`` in the chunked forms' decay products
``Γ, G, E`` only), at padding ``ρ = 1``, ``log ρ = 0``, ``β = 0``, all exact; with spectral normalisation
the recurrent form also skips padding tokens (the normalisation is not the identity on a state outside the
unit ball). With per-head gates these are the associative memory's own segment gates for its ``γ = ρ``.

Spectral normalisation (Discovery): ``S ← S / max(1, σ_max(S))`` shrinks the state onto the unit
spectral-norm ball and leaves it unchanged inside (Miyato, Kataoka, Koyama & Yoshida 2018,
"Spectral Normalization for Generative Adversarial Networks", arXiv:1802.05957, divide weights by
``σ_max`` itself). It is nonlinear in ``S`` and so breaks the linearity the chunked form rests on:
it is available in ``mode="recurrent"`` only. ``σ_max`` is exact here (the largest singular value
from ``jnp.linalg.svd(S, compute_uv=False)``) rather than Miyato et al.'s power iteration: the
states are small (the paper uses ``S = 16``). Its derivative is JAX's rule for singular values alone,
``dσ_1 = u_1ᵀ dS v_1`` with the singular vectors the SVD returns, which has no
``1 / (σ_i² − σ_j²)`` terms: it is finite at ``S = 0`` and at repeated singular values (there a
subgradient).

Numerics: every form accumulates in float32 (float64 for float64 inputs); ``o`` has the dtype of
``v``; the final state the dtype of ``initial_state`` (the accumulation dtype when none is given).
Non-finite inputs: the chunked form multiplies masked (future) entries of a chunk by 0, so a NaN
or inf at a later token of the same chunk makes earlier outputs NaN (``0 · inf``), as in every
matmul-based parallel form; the recurrent form is strictly causal even then. Finite inputs (the
UniMatrix mixer's ``tanh`` projections) are causal in every form (``tests/models/test_unimatrix.py``).

Tested (``tests/kernels/test_matrix_state.py``): recurrent == chunked == an independent float64
numpy loop of the equations above (Core and Discovery, both mixture shapes, odd ``T`` and ``S``,
with an initial state); gradients of the two forms equal, and equal to finite differences of the
float64 loop; :func:`step` over a sequence == the sequence form; spectral normalisation against
exact ``σ_max`` (and ``σ_max(S_t) ≤ 1``); ``ρ ∈ {0, 1}``; Core == a direct call of the associative
memory's ``decay`` rule. Per-channel gates (``test_per_channel_*``): recurrent == chunked == the
float64 loop (its column-by-column update) for Core and Discovery's mix, ``B = 2``, ``T = 11`` with
chunks of 4, ``S = 5``, an initial state, gates from near 0 to near 1 and exactly 0 and 1 in some
channels; gradients of both forms equal and equal to finite differences; :func:`step` == the
recurrent form == the loop with spectral normalisation; gates equal across channels == the per-head
gate in both forms; the matmul precision carried by every product. Packed sequences
(``test_packed_*``): a packed batch (three segments and padding inside one in row 0, leading padding in
row 1, an initial state) == each segment run alone, values, final states and gradients w.r.t. every input,
in every mode, per-head and per-channel gates, and with spectral normalisation.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.arrays import device_array
from jaxmem.checks import (
  check_choice,
  check_equal,
  check_floating,
  check_positive_int,
  check_rank,
  is_concrete,
  shape_of,
)
from jaxmem.kernels.assoc import associative_memory, auto_forward_mode, log_of_decay
from jaxmem.kernels.assoc.common import decay_mask
from jaxmem.kernels.precision import Matmul, matmul_for
from jaxmem.kernels.segments import check_segment_ids, segment_starts

MODES = ("auto", "recurrent", "chunked")
MIX_TERMS = ("outer", "diag", "sym")  # order of the last axis of ``mix``
MIX_SUM_TOL = 1e-5  # |Σ w − 1| allowed for concrete mixtures


# ----------------------------------------------------------------------------------------
# Spectral normalisation.


def _acc_dtype(*xs) -> Any:
  return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


def _max_singular_value(S_XSS: jax.Array) -> jax.Array:
  # singular values only: their JVP is diag(Uᵀ dS V), finite at S = 0 (see the module docstring)
  return jnp.linalg.svd(S_XSS, compute_uv=False)[..., 0]


def _spectral_normalize(S_XSS: jax.Array) -> jax.Array:
  sigma_X = _max_singular_value(S_XSS)
  return S_XSS / jnp.maximum(sigma_X, 1.0)[..., None, None]


def max_singular_value(S: jax.Array) -> jax.Array:
  """Exact ``σ_max`` over the last two axes: ``[..., M, N] -> [...]`` (float32 at least).

  Differentiable everywhere without NaN, ``S = 0`` included (module docstring).
  """
  _check_rank_at_least("S", S, 2)
  S = jnp.asarray(S)
  return _max_singular_value(S.astype(_acc_dtype(S)))


def spectral_normalize(S: jax.Array) -> jax.Array:
  """``S / max(1, σ_max(S))`` over the last two axes (``[..., M, N]``, dtype kept).

  The Discovery variant's shrinking of the state onto the unit spectral-norm ball (after Miyato
  et al. 2018, arXiv:1802.05957, with exact ``σ_max``); finite gradients everywhere, ``S = 0`` included.
  """
  _check_rank_at_least("S", S, 2)
  S = jnp.asarray(S)
  return _spectral_normalize(S.astype(_acc_dtype(S))).astype(S.dtype)


def _check_rank_at_least(name: str, x: Any, rank: int) -> tuple[int, ...]:
  shape = shape_of(x)
  if len(shape) < rank:
    raise ValueError(f"`{name}` must have at least {rank} dimensions [..., M, N], got shape {shape}.")
  return shape


# ----------------------------------------------------------------------------------------
# The update (one token) and the two sequence forms. Inputs in the accumulation dtype.


def _diag(x_XS: jax.Array) -> jax.Array:
  """``Diag(x)`` over the last axis: ``[..., S] -> [..., S, S]``."""
  n = x_XS.shape[-1]
  eye = jnp.eye(n, dtype=x_XS.dtype).reshape((1,) * (x_XS.ndim - 1) + (n, n))
  return x_XS[..., :, None] * eye


def _on_columns(g):
  """A gate ``[B, H]`` (per head) or ``[B, H, S]`` (per channel: scales the state's columns) as
  ``[B, H, 1, 1]`` or ``[B, H, 1, S]``."""
  return g[..., None, None] if g.ndim == 2 else g[..., None, :]


def _write(S_BHSS, k_BHS, v_BHS, rho_BH, beta_BH, w_BH3, d_BHS, spectral_norm: bool):
  """``S_t = ρ S_{t−1} + (1 − ρ) U_t`` (then spectral normalisation); ``beta = 1 − ρ``; with
  per-channel gates ``[B, H, S]``, ``S_{t−1} Diag(ρ) + U_t Diag(1 − ρ)``."""
  kv_BHSS = k_BHS[..., :, None] * v_BHS[..., None, :]  # k vᵀ: elementwise, exact
  if w_BH3 is None:
    U_BHSS = kv_BHSS
  else:
    w_o, w_d, w_s = (w_BH3[..., i, None, None] for i in range(3))
    U_BHSS = w_o * kv_BHSS + w_s * (0.5 * (kv_BHSS + jnp.swapaxes(kv_BHSS, -1, -2)))
    if d_BHS is not None:
      U_BHSS = U_BHSS + w_d * _diag(d_BHS)
  S_BHSS = _on_columns(rho_BH) * S_BHSS + _on_columns(beta_BH) * U_BHSS
  return _spectral_normalize(S_BHSS) if spectral_norm else S_BHSS


def _recurrent(q, k, v, rho, beta, w, d, S0, *, spectral_norm: bool, dot: Matmul, hold=None):
  """``lax.scan`` over tokens of :func:`_write` then the read; ``[B, T, H, ·]`` -> ``(o, S_T)``.

  ``hold [B, T]`` (booleans, or None): where False the token is skipped and the state passes unchanged
  (packed sequences' padding under spectral normalisation, which is not the identity on a state outside
  the unit ball, such as an initial state before leading padding)."""
  time_major = lambda x: None if x is None else jnp.moveaxis(x, 1, 0)

  def body(S_BHSS, xs):
    q_BHS, k_BHS, v_BHS, rho_BH, beta_BH, w_BH3, d_BHS, hold_B = xs
    S_new = _write(S_BHSS, k_BHS, v_BHS, rho_BH, beta_BH, w_BH3, d_BHS, spectral_norm)
    S_BHSS = S_new if hold_B is None else jnp.where(hold_B[:, None, None, None], S_new, S_BHSS)
    return S_BHSS, dot.einsum("bhij,bhj->bhi", S_BHSS, q_BHS)  # read after write

  xs = tuple(time_major(x) for x in (q, k, v, rho, beta, w, d, hold))
  S_BHSS, o_TBHS = jax.lax.scan(body, S0, xs)
  return jnp.moveaxis(o_TBHS, 0, 1), S_BHSS


def _chunked(q, k, v, beta, logr, w, d, S0, *, chunk_size: int, dot: Matmul):
  """The three decaying associative memories of the module docstring, each in chunked form
  (per-channel gates ``[B, T, H, S]``: :func:`_chunked_channel`)."""
  if logr.ndim == 4:
    return _chunked_channel(q, k, v, beta, logr, w, d, S0, chunk_size=chunk_size, dot=dot)
  memory = functools.partial(associative_memory, rule="decay", mode="chunked", chunk_size=chunk_size,
                             return_state=True, precision=dot.precision)
  if w is None:  # Core: A alone (key v, value k)
    return memory(q, v, k, beta, log_decay=logr, initial_state=S0)
  B, T, H, S = q.shape
  w_o, w_d, w_s = w[..., 0], w[..., 1], w[..., 2]
  qs, keys, values, betas = [q, q], [v, k], [k, v], [beta * (w_o + 0.5 * w_s), beta * (0.5 * w_s)]
  if d is not None:  # h: key and query e_1 (one-hot), value d; column 0 of its state is h
    e1_BTHS = jnp.broadcast_to(jnp.eye(1, S, dtype=q.dtype), (B, T, H, S))
    qs, keys, values, betas = qs + [e1_BTHS], keys + [e1_BTHS], values + [d], betas + [beta * w_d]
  n = len(qs)
  S0s = [S0] + [jnp.zeros_like(S0)] * (n - 1)
  cat = functools.partial(jnp.concatenate, axis=2)  # the memories stacked on the head axis
  o_BTXS, S_BXSS = memory(cat(qs), cat(keys), cat(values), cat(betas), log_decay=cat([logr] * n),
                          initial_state=jnp.concatenate(S0s, axis=1))
  o_BTHS = o_BTXS[:, :, :H] + o_BTXS[:, :, H:2 * H]
  S_BHSS = S_BXSS[:, :H] + S_BXSS[:, H:2 * H]
  if d is not None:
    h_BTHS, h_BHS = o_BTXS[:, :, 2 * H:], S_BXSS[:, 2 * H:, :, 0]
    o_BTHS = o_BTHS + h_BTHS * q
    S_BHSS = S_BHSS + _diag(h_BHS)
  return o_BTHS, S_BHSS


def _chunked_channel(q, k, v, beta, logr, w, d, S0, *, chunk_size: int, dot: Matmul):
  """Per-channel gates: GLA's chunked form on the one state ``S [B, H, S, S]`` (module docstring).

  ``U_i Diag(β_i) = c_i k_i (β_i ⊙ v_i)ᵀ + c'_i v_i (β_i ⊙ k_i)ᵀ + Diag(w_d,i β_i ⊙ d_i)`` with
  ``c = w_o + w_s/2``, ``c' = w_s/2`` (Core: ``c = 1``, no other term): the vectors ``a_v, a_k, a_d``
  below are its column weights, the pairwise decays ``Γ [C, C, S]`` act on them per channel.
  ``T`` is padded to whole chunks with ``log ρ = 0`` and zero writes, which leave ``S`` unchanged.
  Packed sequences arrive as gates (:func:`_segment_gates`): ``log ρ = −inf`` at a segment's start in the
  decays ``Γ, G, E`` (nothing before it reaches it or later tokens) with its ``β`` kept.
  """
  B, T, H, S = q.shape
  X, C = B * H, min(chunk_size, T)
  N = -(-T // C)
  col = lambda c_BTH: c_BTH[..., None]
  if w is None:
    a_v, a_k, a_d = beta * v, None, None
  else:
    w_o, w_d, w_s = w[..., 0], w[..., 1], w[..., 2]
    a_v, a_k = col(w_o + 0.5 * w_s) * beta * v, col(0.5 * w_s) * beta * k
    a_d = None if d is None else col(w_d) * beta * d

  def chunk_major(x):  # [B, T, H, S] -> [N, X, C, S], zero-padded to N·C rows
    if x is None:
      return None
    x = jnp.pad(x, ((0, 0), (0, N * C - T), (0, 0), (0, 0)))
    return jnp.transpose(x.reshape(B, N, C, H, S), (1, 0, 3, 2, 4)).reshape(N, X, C, S)

  def step(S_XSS, xs):
    q_XCS, k_XCS, v_XCS, av_XCS, ak_XCS, ad_XCS, logr_XCS = xs
    # Γ_ti (0 for i > t), G_t, E_i = G_C / G_i, G_C per channel, from segment sums (exponents ≤ 0)
    M_XSCC, G_XSC, E_XSC, Gend_XS = decay_mask(jnp.swapaxes(logr_XCS, -1, -2))
    M_XCCS = jnp.moveaxis(M_XSCC, 1, -1)  # [X, t, i, S]
    G_XCS, E_XCS = jnp.swapaxes(G_XSC, -1, -2), jnp.swapaxes(E_XSC, -1, -2)
    o_XCS = dot.einsum("xij,xtj->xti", S_XSS, G_XCS * q_XCS)  # S_0 (G_t ⊙ q_t)
    qM_XCCS = q_XCS[:, :, None, :] * M_XCCS  # q_tj Γ_tij, elementwise in the accumulation dtype
    o_XCS = o_XCS + dot(dot.einsum("xtij,xij->xti", qM_XCCS, av_XCS), k_XCS)
    S_XSS = S_XSS * Gend_XS[:, None, :] + dot.einsum("xir,xij->xrj", k_XCS, av_XCS * E_XCS)
    if ak_XCS is not None:
      o_XCS = o_XCS + dot(dot.einsum("xtij,xij->xti", qM_XCCS, ak_XCS), v_XCS)
      S_XSS = S_XSS + dot.einsum("xir,xij->xrj", v_XCS, ak_XCS * E_XCS)
    if ad_XCS is not None:
      o_XCS = o_XCS + jnp.sum(M_XCCS * ad_XCS[:, None, :, :], axis=2) * q_XCS
      S_XSS = S_XSS + _diag(jnp.sum(ad_XCS * E_XCS, axis=1))
    return S_XSS, o_XCS

  xs = tuple(chunk_major(x) for x in (q, k, v, a_v, a_k, a_d, logr))
  # remat: the backward pass recomputes a chunk's [X, C, C, S] decays instead of storing every chunk's
  S_XSS, o_NXCS = jax.lax.scan(jax.checkpoint(step, prevent_cse=False), S0.reshape(X, S, S), xs)
  o_BTHS = jnp.transpose(o_NXCS.reshape(N, B, H, C, S), (1, 0, 3, 2, 4)).reshape(B, N * C, H, S)
  return o_BTHS[:, :T], S_XSS.reshape(B, H, S, S)


def _gates(rho, log_rho, acc, shape):
  """``(ρ, 1 − ρ, log ρ)`` broadcast to ``shape``, from whichever of rho / log_rho is given."""
  if log_rho is not None:
    logr = jnp.broadcast_to(jnp.asarray(log_rho, acc), shape)
    return jnp.exp(logr), -jnp.expm1(logr), logr
  r = jnp.broadcast_to(jnp.asarray(rho, acc), shape)
  return r, 1.0 - r, log_of_decay(r)


def _segment_gates(segment_ids_BT, rho, beta, logr):
  """Packed sequences as gates (:mod:`jaxmem.kernels.segments`); returns ``(ρ, β, log ρ, valid [B, T])``.

  At a segment's first token (a row's first segment excepted) the state before it is decayed by 0: ``ρ = 0``
  and ``log ρ = −inf`` enter the decay products only, while the write keeps the given ``β = 1 − ρ`` (computed
  before), so ``S_t = 0 · S_{t−1} + β_t U_t`` exactly as a run from the empty state. Padding neither decays
  nor writes: ``ρ = 1``, ``log ρ = 0``, ``β = 0``. This is the associative memory's own rule for
  ``segment_ids`` (a decay of 0 at a start with ``β`` kept; padding ``β = 0``, ``log γ = 0``) applied to its
  ``γ = ρ``, so the per-head chunked form passes these gates to it unchanged.
  """
  start_BT, valid_BT = segment_starts(segment_ids_BT)
  start, valid = (m.reshape(m.shape + (1,) * (rho.ndim - 2)) for m in (start_BT, valid_BT))
  rho = jnp.where(start, 0.0, jnp.where(valid, rho, 1.0))
  logr = jnp.where(start, -jnp.inf, jnp.where(valid, logr, 0.0))
  return rho, jnp.where(valid, beta, 0.0), logr, valid_BT


@functools.partial(jax.jit, static_argnames=("mode", "chunk_size", "spectral_norm", "dot"))
def _forward(q, k, v, rho, log_rho, d, mix, S0, segment_ids, *, mode, chunk_size, spectral_norm, dot):
  acc = jnp.promote_types(_acc_dtype(q, k, v), S0.dtype)
  q, k, v, S0 = (x.astype(acc) for x in (q, k, v, S0))
  d = None if d is None else d.astype(acc)
  B, T, H, S = q.shape
  channel = jnp.ndim(rho if log_rho is None else log_rho) == 4  # else per head: [B, T, H] or a scalar
  rho, beta, logr = _gates(rho, log_rho, acc, (B, T, H, S) if channel else (B, T, H))  # [B, T, H(, S)]
  w_BTH3 = None if mix is None else jnp.broadcast_to(mix.astype(acc), (B, T, H, 3))
  valid_BT = None
  if segment_ids is not None:  # packed sequences: resets and padding as gates (_segment_gates)
    rho, beta, logr, valid_BT = _segment_gates(segment_ids, rho, beta, logr)
  if mode == "recurrent":
    # padding under spectral normalisation is skipped outright: its gates make the update 1 · S + 0 · U,
    # but S / max(1, σ_max(S)) would still act on a state outside the unit ball
    o, S_T = _recurrent(q, k, v, rho, beta, w_BTH3, d, S0, spectral_norm=spectral_norm, dot=dot,
                        hold=valid_BT if spectral_norm else None)
  elif mode == "auto":  # (spectral_norm resolved to "recurrent" before)
    o, S_T = _auto(auto_forward_mode(), chunk_size, dot, q, k, v, rho, beta, logr, w_BTH3, d, S0)
  else:
    o, S_T = _chunked(q, k, v, beta, logr, w_BTH3, d, S0, chunk_size=chunk_size, dot=dot)
  if valid_BT is not None:
    o = jnp.where(valid_BT[:, :, None, None], o, 0.0)  # padding reads 0
  return o, S_T


def _by_mode(mode, chunk_size, dot, q, k, v, rho, beta, logr, w, d, S0):
  if mode == "recurrent":
    return _recurrent(q, k, v, rho, beta, w, d, S0, spectral_norm=False, dot=dot)
  return _chunked(q, k, v, beta, logr, w, d, S0, chunk_size=chunk_size, dot=dot)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _auto(fwd_mode, chunk_size, dot, q, k, v, rho, beta, logr, w, d, S0):
  """auto: the forward-fastest form when not differentiated, the chunked form's JVP when (as
  :func:`jaxmem.kernels.assoc.associative_memory`'s ``auto``)."""
  return _by_mode(fwd_mode, chunk_size, dot, q, k, v, rho, beta, logr, w, d, S0)


@_auto.defjvp
def _auto_jvp(fwd_mode, chunk_size, dot, primals, tangents):
  del fwd_mode
  return jax.jvp(functools.partial(_by_mode, "chunked", chunk_size, dot), primals, tangents)


# ----------------------------------------------------------------------------------------
# Argument checks.



def _as_array(x):
  return x if x is None or isinstance(x, jax.Array) else device_array(x)


def _check_gate(rho, log_rho, names: tuple[str, str], wants: tuple[tuple, tuple],
                layouts: tuple[str, str]) -> None:
  """Exactly one of ρ / log ρ, a scalar or of one of the shapes ``wants`` (per head, per channel),
  in range when concrete."""
  r_name, l_name = names
  shapes = " or ".join(f"[{layout}] = {want}" for layout, want in zip(layouts, wants, strict=True))
  if (rho is None) == (log_rho is None):
    raise ValueError(f"pass exactly one of `{r_name}` (ρ in [0, 1]) or `{l_name}` (log ρ <= 0), "
                     f"{shapes} or a scalar; got {'both' if rho is not None else 'neither'}.")
  name, x = (r_name, rho) if rho is not None else (l_name, log_rho)
  shape = shape_of(x)
  if shape not in ((),) + tuple(wants):
    raise ValueError(f"`{name}` must be a scalar or have shape {shapes} (one gate per head, or per head "
                     f"and state channel), got {shape}.")
  if not is_concrete(x):
    return
  a = np.asarray(x, np.float64)
  ok = (a >= 0) & (a <= 1) if rho is not None else a <= 0  # False for NaN; log ρ = −inf allowed
  if not np.all(ok):
    what = "lie in [0, 1]" if rho is not None else "be <= 0 (log ρ with ρ in [0, 1]; -inf is ρ = 0)"
    raise ValueError(f"`{name}` must {what}, got value(s) such as {a[~ok].ravel()[:3].tolist()}.")


def _check_mix(mix, d, names: tuple[str, str], wants: tuple[tuple, tuple], layouts: tuple[str, str]) -> None:
  """``mix`` of one of the shapes ``wants``, a valid mixture when concrete; ``d`` given when needed."""
  m_name, d_name = names
  if mix is None:
    if d is not None:
      raise ValueError(f"`{d_name}` is the diagonal term's input and is only used with `{m_name}` "
                       f"(weights in {MIX_TERMS} order); got `{d_name}` with {m_name}=None (Core).")
    return
  shape = shape_of(mix)
  if shape not in wants:
    raise ValueError(f"`{m_name}` must have shape [{layouts[0]}] = {wants[0]} or [{layouts[1]}] = "
                     f"{wants[1]} (weights in {MIX_TERMS} order), got {shape}.")
  if not is_concrete(mix):
    if d is None:
      raise ValueError(f"`{d_name}` is required with a traced `{m_name}` (its diagonal weight cannot be "
                       f"checked to be 0); pass `{d_name}`.")
    return
  w = np.asarray(mix, np.float64)
  if not np.all(np.isfinite(w)) or np.any(w < 0):
    bad = w[~(np.isfinite(w) & (w >= 0))].ravel()[:3].tolist()
    raise ValueError(f"`{m_name}` must be nonnegative mixture weights, got value(s) such as {bad}.")
  err = np.abs(w.sum(-1) - 1.0)
  if np.any(err > MIX_SUM_TOL):
    raise ValueError(f"`{m_name}` weights must sum to 1 over the last axis (within {MIX_SUM_TOL}; pass "
                     f"softmax outputs), got sums such as {w.sum(-1).ravel()[err > MIX_SUM_TOL][:3].tolist()}.")
  if d is None and np.any(w[..., 1] != 0):
    raise ValueError(f"`{d_name}` is required: `{m_name}` gives the diagonal term Diag(d) a nonzero weight.")


def _resolve_mode(mode: str, spectral_norm: bool) -> str:
  check_choice("mode", mode, MODES)
  if mode == "auto":
    return "recurrent" if spectral_norm else "auto"
  if mode == "chunked" and spectral_norm:
    raise ValueError(
        "`spectral_norm=True` needs mode='recurrent' (or 'auto'): S / max(1, σ_max(S)) is nonlinear in "
        "S, and the chunked form rests on the state being a linear (decayed) sum of the updates.")
  return mode


# ----------------------------------------------------------------------------------------
# Public API.


def matrix_state(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    rho: Any = None,
    *,
    log_rho: Any = None,
    d: Optional[jax.Array] = None,
    mix: Optional[jax.Array] = None,
    mode: str = "auto",
    chunk_size: int = 64,
    spectral_norm: bool = False,
    initial_state: Optional[jax.Array] = None,
    return_state: bool = False,
    precision: Any = "highest",
    segment_ids: Optional[jax.Array] = None,
):
  """Multi-head UniMatrix state ``S_t = ρ_t S_{t−1} + (1 − ρ_t) U_t``, read ``o_t = S_t q_t``.

  Args:
    q: queries ``[B, T, H, S]``.
    k: keys ``[B, T, H, S]`` (the state's row side: ``S = k vᵀ``).
    v: values ``[B, T, H, S]``.
    rho: gate ``ρ ∈ [0, 1]``, ``[B, T, H]`` (per head), ``[B, T, H, S]`` (per state channel:
      ``S_t = S_{t−1} Diag(ρ_t) + U_t Diag(1 − ρ_t)``, module docstring) or a scalar; or
    log_rho: ``log ρ ∈ [−inf, 0]`` of the same shapes (preferred: ``jax.nn.log_sigmoid(z)``).
      Exactly one is required.
    d: diagonal-update inputs ``[B, T, H, S]``; required when ``mix`` gives the diagonal a
      nonzero weight (or is traced), rejected with ``mix=None``.
    mix: None (Core: outer update only) or mixture weights ``[H, 3]`` or ``[B, T, H, 3]`` in
      ``(outer, diag, sym)`` order, already softmaxed (nonnegative, summing to 1).
    mode: ``"auto" | "recurrent" | "chunked"``; ``auto`` is ``recurrent`` with ``spectral_norm``,
      else the fastest form forward and the chunked form's derivatives (module docstring).
    chunk_size: chunk length of the chunked form (any ``T`` works).
    spectral_norm: after each update ``S_t ← S_t / max(1, σ_max(S_t))`` (exact ``σ_max``);
      recurrent form only.
    initial_state: ``S_0 [B, H, S, S]``; zeros when None.
    return_state: also return the final state ``S_T [B, H, S, S]``.
    precision: matmul precision (:mod:`jaxmem.kernels.precision`).
    segment_ids: ``[B, T]`` integers, packed sequences (:mod:`jaxmem.kernels.segments`): the state empties
      before the first token of each segment after a row's first (that token's update keeps its own ``ρ``:
      ``S_t = (1 − ρ_t) U_t``), and padding (0) leaves the state unchanged and reads 0. ``initial_state``
      is the state before a row's first segment and the final state the one after its last token. Every
      mode and gate kind; None (default): one sequence per row.

  Returns:
    ``o [B, T, H, S]`` in the dtype of ``v``, and ``S_T`` if ``return_state`` (dtype of
    ``initial_state``, else float32 — float64 for float64 inputs).

  Raises:
    ValueError: wrong ranks, mismatched batch / length / heads / state dims, ``T == 0``;
      non-floating ``q``, ``k``, ``v``, ``d`` or ``initial_state``;
      unknown ``mode``, bad ``chunk_size`` or ``precision``; ``spectral_norm`` with
      ``mode="chunked"``; both or neither of ``rho`` / ``log_rho``, wrong shape, or (concrete)
      ``rho`` outside ``[0, 1]`` / ``log_rho > 0``; ``mix`` of the wrong shape or (concrete)
      not a mixture; ``d`` missing when needed, given without ``mix``, or of the wrong shape;
      ``initial_state`` of the wrong shape; ``segment_ids`` not ``[B, T]`` integers (or negative, when
      concrete).
  """
  mode = _resolve_mode(mode, bool(spectral_norm))
  chunk_size = check_positive_int("chunk_size", chunk_size)
  dot = matmul_for(precision)
  B, T, H, S = check_rank("q", q, 4, "B, T, H, S")
  Bk, Tk, Hk, Sk = check_rank("k", k, 4, "B, T, H, S")
  Bv, Tv, Hv, Sv = check_rank("v", v, 4, "B, T, H, S")
  check_equal("batch sizes", q=B, k=Bk, v=Bv)
  check_equal("lengths", q=T, k=Tk, v=Tv)
  check_equal("numbers of heads", q=H, k=Hk, v=Hv)
  check_equal("state dims", q=S, k=Sk, v=Sv)
  if T == 0:
    raise ValueError(f"`q` must have at least one time step, got shape {shape_of(q)}.")
  rho, log_rho, d, mix = (_as_array(x) for x in (rho, log_rho, d, mix))
  _check_gate(rho, log_rho, ("rho", "log_rho"), ((B, T, H), (B, T, H, S)), ("B, T, H", "B, T, H, S"))
  if d is not None and shape_of(d) != (B, T, H, S):
    raise ValueError(f"`d` must have shape [B, T, H, S] = {(B, T, H, S)}, got {shape_of(d)}.")
  _check_mix(mix, d, ("mix", "d"), ((H, 3), (B, T, H, 3)), ("H, 3", "B, T, H, 3"))
  if initial_state is not None and shape_of(initial_state) != (B, H, S, S):
    raise ValueError(f"`initial_state` must have shape [B, H, S, S] = {(B, H, S, S)}, "
                     f"got {shape_of(initial_state)}.")
  check_floating(q=q, k=k, v=v, d=d, initial_state=initial_state)
  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, B, T)

  acc = _acc_dtype(q, k, v)
  if initial_state is not None:
    acc = jnp.promote_types(acc, jnp.result_type(initial_state))
  S0 = jnp.zeros((B, H, S, S), acc) if initial_state is None else jnp.asarray(initial_state)
  o, S_T = _forward(q, k, v, rho, log_rho, d, mix, S0, segment_ids, mode=mode,
                    chunk_size=chunk_size if mode != "recurrent" else None,  # no retrace per chunk_size
                    spectral_norm=bool(spectral_norm), dot=dot)
  o = o.astype(v.dtype)
  if initial_state is not None:
    S_T = S_T.astype(S0.dtype)
  return (o, S_T) if return_state else o


def init(batch: int, heads: int, state_dim: int, dtype=jnp.float32) -> jax.Array:
  """The empty state ``S_0 = 0 [batch, heads, state_dim, state_dim]``: the first ``state`` of :func:`step`."""
  for name, n in (("batch", batch), ("heads", heads), ("state_dim", state_dim)):
    check_positive_int(name, n)
  return jnp.zeros((batch, heads, state_dim, state_dim), dtype)


def step(state, q_t, k_t, v_t, rho_t=None, *, log_rho_t=None, d_t=None, mix_t=None,
         spectral_norm: bool = False, precision: Any = "highest"):
  """One token: ``S_t = ρ_t S_{t−1} + (1 − ρ_t) U_t`` (spectral normalisation optional), ``o_t = S_t q_t``.

  Args:
    state: ``S_{t−1} [B, H, S, S]``.
    q_t, k_t, v_t: ``[B, H, S]``.
    rho_t: ``ρ_t ∈ [0, 1]``, or log_rho_t: ``log ρ_t ≤ 0``; ``[B, H]``, ``[B, H, S]`` (per channel)
      or a scalar, exactly one.
    d_t: ``[B, H, S]``, required when ``mix_t`` weights the diagonal (as in :func:`matrix_state`).
    mix_t: None (Core) or weights ``[H, 3]`` or ``[B, H, 3]`` in ``(outer, diag, sym)`` order.
    spectral_norm, precision: as in :func:`matrix_state`.

  Returns:
    ``(S_t [B, H, S, S], o_t [B, H, S])`` — carry first, so ``step`` is a ``lax.scan`` body;
    ``S_t`` in the dtype of ``state`` (computed in float32 at least), ``o_t`` in that of ``v_t``.

  Raises:
    ValueError: as :func:`matrix_state`, for the per-token shapes.
  """
  dot = matmul_for(precision)
  B, H, S, S2 = check_rank("state", state, 4, "B, H, S, S")
  Bq, Hq, Sq = check_rank("q_t", q_t, 3, "B, H, S")
  Bk, Hk, Sk = check_rank("k_t", k_t, 3, "B, H, S")
  Bv, Hv, Sv = check_rank("v_t", v_t, 3, "B, H, S")
  check_equal("batch sizes", state=B, q_t=Bq, k_t=Bk, v_t=Bv)
  check_equal("numbers of heads", state=H, q_t=Hq, k_t=Hk, v_t=Hv)
  check_equal("state dims", state_rows=S, state_cols=S2, q_t=Sq, k_t=Sk, v_t=Sv)
  rho_t, log_rho_t, d_t, mix_t = (_as_array(x) for x in (rho_t, log_rho_t, d_t, mix_t))
  _check_gate(rho_t, log_rho_t, ("rho_t", "log_rho_t"), ((B, H), (B, H, S)), ("B, H", "B, H, S"))
  if d_t is not None and shape_of(d_t) != (B, H, S):
    raise ValueError(f"`d_t` must have shape [B, H, S] = {(B, H, S)}, got {shape_of(d_t)}.")
  _check_mix(mix_t, d_t, ("mix_t", "d_t"), ((H, 3), (B, H, 3)), ("H, 3", "B, H, 3"))
  check_floating(state=state, q_t=q_t, k_t=k_t, v_t=v_t, d_t=d_t)

  acc = jnp.promote_types(_acc_dtype(q_t, k_t, v_t), state.dtype)
  q, k, v = (x.astype(acc) for x in (q_t, k_t, v_t))
  gate_shape = (B, H, S) if jnp.ndim(rho_t if log_rho_t is None else log_rho_t) == 3 else (B, H)
  rho_BH, beta_BH, _ = _gates(rho_t, log_rho_t, acc, gate_shape)  # [B, H] or [B, H, S]
  w_BH3 = None if mix_t is None else jnp.broadcast_to(mix_t.astype(acc), (B, H, 3))
  d = None if d_t is None else d_t.astype(acc)
  S_BHSS = _write(state.astype(acc), k, v, rho_BH, beta_BH, w_BH3, d, bool(spectral_norm))
  o_BHS = dot.einsum("bhij,bhj->bhi", S_BHSS, q)
  return S_BHSS.astype(state.dtype), o_BHS.astype(v_t.dtype)


__all__ = [
    "MIX_SUM_TOL", "MIX_TERMS", "MODES", "init", "matrix_state", "max_singular_value",
    "spectral_normalize", "step",
]
