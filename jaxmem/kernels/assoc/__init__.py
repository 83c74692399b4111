"""Associative matrix memory: Hebb, delta, Oja and decaying (gated) updates, read ``S q``.

The Pavlovian reading of attention (``docs/papers/pavlovian.md``): keys are conditioned stimuli,
values unconditioned stimuli, and the forward pass binds them into a matrix that a query reads.
State ``S [D_v, D_k]`` per head ("US × CS"; ``[B, H, D_v, D_k]`` batched), **read after write**
``o_t = S_t q_t``; ``q, k [B, T, H, D_k]``, ``v [B, T, H, D_v]``, ``beta, decay [B, T, H]``.

Rules (``rule=``), ``β_t`` the write strength, ``γ_t ∈ [0, 1]`` the decay:

* ``hebb``: ``S_t = S_{t−1} + β_t v_t k_tᵀ`` — linear attention (Katharopoulos et al. 2020,
  "Transformers are RNNs"; Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly
  Fast Weight Programmers")
* ``delta``: ``S_t = S_{t−1} + β_t (v_t − S_{t−1} k_t) k_tᵀ`` — DeltaNet (Schlag et al. 2021)
* ``oja``: ``S_t = S_{t−1} + β_t (v_t k_tᵀ − v_t v_tᵀ S_{t−1})`` — Oja 1982, "Simplified neuron
  model as a principal component analyzer", with the US as post-synaptic signal
* ``decay``: ``S_t = γ_t S_{t−1} + β_t v_t k_tᵀ`` — RetNet (Sun et al. 2023) / gated linear attention
* ``gated_delta``: ``S_t = γ_t S_{t−1} + β_t (v_t − γ_t S_{t−1} k_t) k_tᵀ`` — Gated DeltaNet
  (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta Rule")
* ``gated_oja``: ``S_t = γ_t S_{t−1} + β_t (v_t k_tᵀ − γ_t v_t v_tᵀ S_{t−1})`` — Oja after a decay (fla's
  ``gated_oja_rule`` with one decay per head)

Grouped value heads: ``v [B, T, HV, D_v]`` with ``HV`` a multiple of the ``H`` heads of ``q, k`` (fla's
"GVA"); value head ``j`` reads and writes with key / query head ``j // (HV / H)``; ``beta``, decays and
the state have ``HV`` heads.

Packed sequences: ``segment_ids [B, T]`` (:mod:`jaxmem.kernels.segments`): the memory empties at the first
token of every segment but a row's first (which continues ``initial_state``), padding (id 0) writes
nothing and reads 0. Every form does it by a decay of 0 at those tokens (``log γ = −inf``, exact in every
form; rules without a decay run as their decaying twin, e.g. delta as gated_delta with ``γ = 1``).

fla's varlen form: ``cu_seqlens [N + 1]`` (``B = 1``, sequence ``n`` the tokens ``cu[n]:cu[n + 1]``); without
states a segment per sequence, with ``initial_state [N, H, D_v, D_k]`` or ``return_state`` a state per sequence,
each computed as if alone in one pass over the packed row (:mod:`.varlen`; chunked, recurrent and auto).

Forms (``mode=``; equal up to float rounding, tested). ``recurrent``: ``lax.scan`` of the literal
update (:mod:`.recurrent`; also the inference pair :func:`init` / :func:`step`). ``parallel``:
masked quadratic form, one UT chunk for delta (:mod:`.parallel`). ``chunked``: the UT / WY transform
of Yang et al. 2024 (:mod:`.chunked`). ``auto``: chunked when differentiated or on accelerators,
recurrent for a forward-only CPU call (a ``jax.custom_jvp``).

========= ===== ===== ===== ===== =========== =========
mode      hebb  delta oja   decay gated_delta gated_oja
========= ===== ===== ===== ===== =========== =========
recurrent yes   yes   yes   yes   yes         yes
parallel  yes   yes   no    yes   yes         no
chunked   yes   yes   yes   yes   yes         yes
========= ===== ===== ===== ===== =========== =========

Decays: ``log_decay = log γ ∈ [−inf, 0]`` (e.g. ``jax.nn.log_sigmoid(z)``) or ``decay = γ ∈ [0, 1]``
(read as ``log max(γ, 1e-30)``, :func:`log_of_decay`); values and gradients are finite on the whole
range; concrete values outside it raise ``ValueError``.
Stability: the erasing rules (``ERASE_RULES``) need ``0 ≤ β_t‖a_t‖² ≤ 2`` with ``a = k`` (``v`` for
oja and gated_oja); concrete violations raise ``ValueError``; under ``jit`` only construction guards it
(``normalize_keys=True`` for the delta rules; normalise ``v`` for the Oja rules).

Derivations and measurements: ``jaxmem/kernels/assoc/README.md``.
"""

from __future__ import annotations

import functools
import math
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
from jaxmem.kernels.assoc.chunked import chunked_head, chunked_scan, unit_lower_inverse
from jaxmem.kernels.assoc.common import DECAY_RULES, ERASE_RULES, MODES, OJA_RULES, RULES, WITH_DECAY, acc_dtype
from jaxmem.kernels.assoc.parallel import parallel_head
from jaxmem.kernels.assoc.recurrent import recurrent_head, update
from jaxmem.kernels.assoc.varlen import sequences_forward
from jaxmem.kernels.precision import matmul_for
from jaxmem.kernels.segments import (
  check_cu_seqlens,
  check_segment_ids,
  cu_seqlens_to_segment_ids,
  segment_starts,
)

_NORM_EPS = 1e-6
# decay= values below this are read as it (log-space kernels; see log_of_decay)
DECAY_FLOOR = 1e-30


def l2_normalize(x: jax.Array) -> jax.Array:
  """``x / ‖x‖₂`` over the last axis (``+ 1e-6`` under the root): the ``normalize_keys`` guard."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _NORM_EPS)


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


# ----------------------------------------------------------------------------------------
# Dispatch over modes, batch and heads.


def _run(rule, mode, chunk_size, dot, q, k, v, beta, logg, S0, cu=None):
  """``[B, T, H, ·]`` inputs (accumulation dtype) -> ``(o [B, T, H, D_v], S [B, H, D_v, D_k])``; with ``cu``
  (``cu_seqlens``, ``B = 1``) ``S0`` and ``S`` are the per-sequence states ``[N, H, D_v, D_k]``
  (:mod:`.varlen`)."""
  if cu is not None:
    return sequences_forward(rule, mode, chunk_size, q, k, v, beta, logg, S0, cu, dot=dot)
  T = q.shape[1]
  if mode == "chunked" or (mode == "parallel" and rule in ("delta", "gated_delta")):
    # parallel delta rules: the UT form with one chunk spanning the sequence
    C = chunk_size if mode == "chunked" else T
    return chunked_scan(q, k, v, beta, logg, S0, rule=rule, chunk_size=C, dot=dot)
  head = functools.partial(recurrent_head if mode == "recurrent" else parallel_head, rule=rule, dot=dot)
  t = 1  # per batch element, time-major [T, H, ...]: heads on axis 1
  lg = t if logg is not None else None
  over_heads = jax.vmap(head, in_axes=(t, t, t, t, lg, 0), out_axes=(t, 0))
  over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, 0, None if logg is None else 0, 0))
  return over_batch(q, k, v, beta, logg, S0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 3))
def _auto(rule, fwd_mode, chunk_size, dot, q, k, v, beta, logg, S0, cu=None):
  """auto: the forward-fastest form when not differentiated, the chunked form's JVP when."""
  return _run(rule, fwd_mode, chunk_size, dot, q, k, v, beta, logg, S0, cu)


@_auto.defjvp
def _auto_jvp(rule, fwd_mode, chunk_size, dot, primals, tangents):
  del fwd_mode
  return jax.jvp(functools.partial(_run, rule, "chunked", chunk_size, dot), primals, tangents)


def auto_forward_mode(platform: Optional[str] = None) -> str:
  """The form ``mode="auto"`` runs when no gradient is taken: ``recurrent`` on CPU, else ``chunked``.

  The rule and the measurements behind it: ``jaxmem/kernels/assoc/README.md``.
  """
  platform = platform or jax.default_backend()
  return "recurrent" if platform == "cpu" else "chunked"


@functools.partial(jax.jit,
                   static_argnames=("rule", "mode", "chunk_size", "normalize_keys", "dot", "sequences"))
def _forward(q, k, v, beta, decay, log_decay, S0, segment_ids, cu, *, rule, mode, chunk_size, normalize_keys,
             dot, sequences):
  """The whole computation of :func:`associative_memory` after its checks, in one compiled program
  (defaults, broadcasts and casts included: outside ``jit`` each would compile a program of its own).
  ``sequences``: ``cu`` with a state per sequence (``S0`` ``[N, H, D_v, D_k]``); ``cu`` without is a segment
  per sequence."""
  B, T, H, Dv = v.shape  # H: the value heads (HV); q and k may have a divisor of it
  Dk = q.shape[-1]
  if q.shape[2] != H:  # grouped value heads: key / query head j serves value heads j·g .. j·g + g − 1
    q, k = (jnp.repeat(x, H // q.shape[2], axis=2) for x in (q, k))
  acc = acc_dtype(q, k, v)
  if S0 is not None:
    acc = jnp.promote_types(acc, S0.dtype)  # as step(): a float64 state stays float64
  o_dtype, S_dtype = v.dtype, acc if S0 is None else S0.dtype
  beta = jnp.ones((B, T, H), acc) if beta is None else jnp.broadcast_to(beta.astype(acc), (B, T, H))
  logg = _log_decay(decay, log_decay, acc, (B, T, H))
  S0 = jnp.zeros((cu.shape[0] - 1 if sequences else B, H, Dv, Dk), acc) if S0 is None else S0
  q, k, v, S0 = (x.astype(acc) for x in (q, k, v, S0))
  if normalize_keys:
    k = l2_normalize(k)
  if cu is not None and not sequences:
    segment_ids = cu_seqlens_to_segment_ids(cu, T)
  if sequences:
    cu = cu.astype(jnp.int32)
    form, fwd_mode = (_auto, auto_forward_mode()) if mode == "auto" else (_run, mode)
    o, S = form(rule, fwd_mode, chunk_size, dot, q, k, v, beta, logg, S0, cu)
    return o.astype(o_dtype), S.astype(S_dtype)
  if segment_ids is not None:
    # a boundary is a decay of 0 (exact in every form); padding neither decays nor writes, and reads 0
    start, valid = (m[..., None] for m in segment_starts(segment_ids))
    rule = WITH_DECAY[rule]
    logg = jnp.zeros((B, T, H), acc) if logg is None else logg
    logg = jnp.where(start, -jnp.inf, jnp.where(valid, logg, 0.0))
    beta = jnp.where(valid, beta, 0.0)
  if mode == "auto":
    o, S = _auto(rule, auto_forward_mode(), chunk_size, dot, q, k, v, beta, logg, S0)
  else:
    o, S = _run(rule, mode, chunk_size, dot, q, k, v, beta, logg, S0)
  if segment_ids is not None:
    o = jnp.where(valid[..., None], o, 0.0)
  return o.astype(o_dtype), S.astype(S_dtype)


# ----------------------------------------------------------------------------------------
# Public API.



def check_grouped_heads(key_heads: int, value_heads: int) -> None:
  """Grouped value heads: the ``q`` / ``k`` heads must divide the ``v`` heads (``ValueError`` otherwise)."""
  if key_heads < 1 or value_heads % key_heads:
    raise ValueError(f"`v` has {value_heads} heads, which the {key_heads} heads of `q` and `k` must divide "
                     "(grouped value heads: each key head serves HV / H value heads).")


def _as_array(x):
  """Lists and Python numbers become arrays (so a list is not mistaken for a scalar)."""
  return x if x is None or isinstance(x, jax.Array) else device_array(x)


def _check_shape(name: str, x, want: tuple, layout: str):
  shape = shape_of(x)
  if shape != () and shape != want:
    raise ValueError(f"`{name}` must be a scalar or have shape [{layout}] = {want}, got {shape}.")


def _check_finite_values(name: str, x) -> None:
  if x is None or not is_concrete(x):
    return
  a = np.asarray(x, np.float64)
  if not np.all(np.isfinite(a)):
    bad = a[~np.isfinite(a)].ravel()[:3].tolist()
    raise ValueError(f"`{name}` must be finite, got value(s) such as {bad}.")


def _check_decay_values(decay, name: str) -> None:
  """γ ∈ [0, 1] (decay=) when concrete."""
  if decay is None or not is_concrete(decay):
    return
  d = np.asarray(decay, np.float64)
  ok = np.isfinite(d) & (d >= 0) & (d <= 1)
  if not np.all(ok):
    raise ValueError(f"`{name}` must lie in [0, 1], got value(s) such as {d[~ok].ravel()[:3].tolist()}.")


def _check_log_decay_values(log_decay, name: str) -> None:
  """log γ ∈ [−inf, 0] (log_decay=) when concrete."""
  if log_decay is None or not is_concrete(log_decay):
    return
  d = np.asarray(log_decay, np.float64)
  ok = d <= 0  # False for NaN; −inf (γ = 0) is allowed
  if not np.all(ok):
    raise ValueError(f"`{name}` must be <= 0 (log γ with γ in [0, 1]; -inf is γ = 0), got value(s) "
                     f"such as {d[~ok].ravel()[:3].tolist()}.")


@functools.lru_cache(maxsize=None)
def _stability_slack(*dtypes) -> float:
  """Relative slack on β‖a‖² ≤ 2: the rounding of the inputs' dtype (3·eps, at least 1e-4).

  Keys L2-normalised in bfloat16 have ‖k‖² within a few eps of 1 (jaxmem/kernels/assoc/README.md), so
  3·eps = 2.3% lets β = 2 pass with them. """
  eps = max(float(jnp.finfo(d).eps) for d in dtypes if jnp.issubdtype(d, jnp.floating))
  return max(1e-4, 3.0 * eps)


@functools.partial(jax.jit, static_argnames=("unit",))
def _erase_range(beta, a, *, unit: bool):
  """``[min, max]`` of ``β_t‖a_t‖²`` (``‖a‖² = 1`` when ``unit``) and whether ``β`` and ``a`` are all finite, as
  one float32 (float64 under x64) vector: one small program and one read-back for the eager checks of device
  arrays, where converting them to float64 numpy arrays costs more than the call itself."""
  acc = jnp.promote_types(jnp.result_type(a, beta), jnp.float32)
  a, beta = a.astype(acc), jnp.asarray(beta, acc)
  sq = jnp.ones(a.shape[:-1], acc) if unit else jnp.sum(a * a, axis=-1)
  if beta.ndim and sq.ndim and beta.shape[-1] != sq.shape[-1]:  # grouped value heads: a key head per group
    sq = jnp.repeat(sq, beta.shape[-1] // sq.shape[-1], axis=-1)
  prod = jnp.where(beta == 0, 0.0, beta * sq)  # β = 0 writes nothing, whatever ‖a‖² (an overflow included)
  finite = lambda x: jnp.all(jnp.isfinite(x)).astype(acc)
  return jnp.stack([jnp.min(prod), jnp.max(prod), finite(beta), 1.0 if unit else finite(a)])


def _dtype(x):
  return x.dtype if hasattr(x, "dtype") else jnp.result_type(x)


# check_stability reduces device arrays of at least this many elements on the device (one small program and a
# read-back of four numbers); smaller ones in numpy, where the program's dispatch and wait would cost more
_DEVICE_CHECK_SIZE = 1 << 15


def _erase_range_numpy(beta, a, unit: bool):
  """:func:`_erase_range` in numpy: in the inputs' precision (at least float32; its rounding, ``D·eps``, is far
  below the slack of :func:`_stability_slack`) when every product is finite, else again in float64, so that a
  finite ``a`` whose square overflows float32 is reported as divergence, not as a non-finite input."""
  b = np.asarray(1.0 if beta is None else beta)
  a_np = np.asarray(a)
  for dtype in (np.promote_types(np.result_type(a_np, b), np.float32), np.float64):
    bb = b.astype(dtype, copy=False)
    if unit:
      sq = np.ones(a_np.shape[:-1], dtype)
    else:
      aa = a_np.astype(dtype, copy=False)
      sq = np.einsum("...i,...i->...", aa, aa)
    if bb.ndim and sq.ndim and bb.shape[-1] != sq.shape[-1]:  # grouped value heads: a key head per group
      sq = np.repeat(sq, bb.shape[-1] // sq.shape[-1], axis=-1)
    prod = bb * sq
    lo, hi = float(np.min(prod)), float(np.max(prod))
    if math.isfinite(lo) and math.isfinite(hi):
      return lo, hi, True, True
  return lo, hi, bool(np.all(np.isfinite(b))), unit or bool(np.all(np.isfinite(sq)))


def check_stability(rule: str, beta, k, v, normalize_keys: bool) -> None:
  """Raises when concrete ``β_t‖a_t‖²`` leaves ``[0, 2]`` (a = k, or v for the Oja rules), or β is not finite
  (``beta`` ``[.., H]`` or a scalar; ``k`` may have a divisor of ``H`` heads). Tracers are not checked.

  Large device arrays are reduced on the device (:func:`_erase_range`), the rest in numpy
  (:func:`_erase_range_numpy`); both raise the same errors."""
  a = v if rule in OJA_RULES else k
  if rule not in ERASE_RULES or not (is_concrete(beta) and is_concrete(a)):
    _check_finite_values("beta", beta)
    return
  unit = bool(normalize_keys) and rule not in OJA_RULES
  if isinstance(a, jax.Array) and a.size >= _DEVICE_CHECK_SIZE:
    lo, hi, beta_ok, a_ok = (float(x) for x in np.asarray(_erase_range(1.0 if beta is None else beta, a,
                                                                       unit=unit)))
  else:
    lo, hi, beta_ok, a_ok = _erase_range_numpy(beta, a, unit)
  if not beta_ok:
    _check_finite_values("beta", beta)  # raises, naming the values
  if not a_ok:
    arg = "v" if rule in OJA_RULES else "k"
    raise ValueError(f"`{arg}` must be finite for rule {rule!r} (it sets the erase factor), got a non-finite "
                     f"value in shape {shape_of(a)}.")
  slack = _stability_slack(_dtype(a), _dtype(1.0 if beta is None else beta))
  if lo < -slack or hi > 2.0 * (1.0 + slack):
    which, arg = ("‖v_t‖²", "v") if rule in OJA_RULES else ("‖k_t‖²", "k")
    worst = hi if hi > 2 else lo
    raise ValueError(
        f"rule {rule!r} diverges unless 0 <= beta_t·{which} <= 2 for every token, got {worst:.4g} "
        f"(`beta` shape {shape_of(beta)}, `{arg}` shape {shape_of(a)}); "
        + ("normalise the values or lower beta." if rule in OJA_RULES
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
    segment_ids: Optional[jax.Array] = None,
    cu_seqlens: Any = None,
):
  """Multi-head associative matrix memory (write with ``rule``, read ``o_t = S_t q_t``).

  ``H`` below is the number of value heads; ``q`` and ``k`` have ``H`` heads or a divisor of ``H``
  (grouped value heads, see the module docstring).

  Args:
    q: queries ``[B, T, H, D_k]`` (or ``[B, T, H / g, D_k]``).
    k: keys ``[B, T, H, D_k]`` (the same number of heads as ``q``).
    v: values ``[B, T, H, D_v]``.
    beta: write strengths ``[B, T, H]`` or a scalar; None means 1.
    rule: ``"hebb" | "delta" | "oja" | "decay" | "gated_delta" | "gated_oja"`` (equations in the
    module docstring). mode: ``"auto" | "recurrent" | "parallel" | "chunked"``; ``parallel`` is not
      available for ``oja`` and ``gated_oja``.
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
    segment_ids: ``[B, T]`` integers, packed sequences (:mod:`jaxmem.kernels.segments`): the memory
      empties at the first token of each segment after a row's first, and padding (0) writes nothing
      and reads 0. ``initial_state`` is the state before a row's first segment and the final state the
      state after its last token.
    cu_seqlens: ``[N + 1]`` integers (a list or an array), ``B = 1``: the row holds ``N`` sequences, sequence
      ``n`` the tokens ``cu_seqlens[n]:cu_seqlens[n + 1]`` (fla's varlen form). Without ``initial_state`` and
      ``return_state`` it is a segment per sequence (as ``segment_ids``). With either, each sequence has its
      own state: ``initial_state`` and the returned state are ``[N, H, D_v, D_k]`` (zeros when None), each
      sequence computed as if alone, in one pass over the packed row (``jaxmem/kernels/assoc/varlen.py``;
      modes ``chunked``, ``recurrent`` and ``auto``). Concrete values must rise from 0 to ``T``; traced ones
      are not checked.

  Returns:
    ``o [B, T, H, D_v]`` in the dtype of ``v``, and ``S_T`` if ``return_state`` (in the
    dtype of ``initial_state``, else float32 — float64 for float64 inputs; ``[N, H, D_v, D_k]``, a state per
    sequence, with ``cu_seqlens``).

  Raises:
    ValueError: wrong ranks or mismatched batch/length/heads/key widths; non-floating
      ``q``, ``k``, ``v`` or ``initial_state``; a number of value heads that the key heads do not
      divide; ``segment_ids`` not ``[B, T]`` integers (or negative, when concrete); bad ``rule``,
      ``mode``, ``chunk_size``, ``precision``; ``parallel`` with ``oja``; ``decay`` /
      ``log_decay`` missing, both given, given for a rule without decay, of the wrong
      shape, or (when concrete) out of range; ``beta``/``initial_state`` of the wrong
      shape; concrete ``beta`` not finite, or ``β‖k‖²`` (``β‖v‖²`` for oja) outside
      ``[0, 2]`` for the erasing rules; ``cu_seqlens`` not ``[N + 1]`` integers rising from 0 to ``T`` (when
      concrete), with ``B > 1`` or with ``segment_ids``, or with per-sequence states in mode ``parallel``.
  """
  check_choice("rule", rule, RULES)
  check_choice("mode", mode, MODES)
  chunk_size = check_positive_int("chunk_size", chunk_size)
  dot = matmul_for(precision)
  B, T, Hq, Dk = check_rank("q", q, 4, "B, T, H, D_k")
  Bk, Tk, Hk, Dkk = check_rank("k", k, 4, "B, T, H, D_k")
  Bv, Tv, H, Dv = check_rank("v", v, 4, "B, T, H, D_v")
  check_equal("batch sizes", q=B, k=Bk, v=Bv)
  check_equal("lengths", q=T, k=Tk, v=Tv)
  check_equal("numbers of heads", q=Hq, k=Hk)
  check_grouped_heads(Hq, H)
  check_equal("key widths", q=Dk, k=Dkk)
  if T == 0:
    raise ValueError(f"`q` must have at least one time step, got shape {shape_of(q)}.")
  if mode == "parallel" and rule in OJA_RULES:
    raise ValueError(
        f"mode='parallel' is not available for rule={rule!r} (no masked quadratic form); use "
        "mode='chunked' (chunk_size=T gives the one-chunk form) or 'recurrent'."
    )
  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, B, T)
  sequences = False
  if cu_seqlens is not None:
    if segment_ids is not None:
      raise ValueError("pass `cu_seqlens` (B = 1) or `segment_ids` [B, T], not both.")
    if B != 1:
      raise ValueError(f"with `cu_seqlens` the batch size must be 1 (sequences packed along T), got B = {B}.")
    cu_seqlens = check_cu_seqlens(cu_seqlens, T)
    sequences = initial_state is not None or bool(return_state)
    if sequences and mode == "parallel":
      raise ValueError("`cu_seqlens` with a state per sequence runs in mode 'chunked', 'recurrent' or 'auto', "
                       "not 'parallel'.")
  beta, decay, log_decay = _as_array(beta), _as_array(decay), _as_array(log_decay)
  if beta is not None:
    _check_shape("beta", beta, (B, T, H), "B, T, H")
  _decay_args(rule, decay, log_decay, ("decay", "log_decay"), (B, T, H), "B, T, H")
  if initial_state is not None:
    s = shape_of(initial_state)
    want = (shape_of(cu_seqlens)[0] - 1 if sequences else B, H, Dv, Dk)
    if s != want:
      raise ValueError(f"`initial_state` must have shape [{'N' if sequences else 'B'}, H, D_v, D_k] = {want}, "
                       f"got {s}.")
  check_floating(q=q, k=k, v=v, initial_state=initial_state)
  check_stability(rule, beta, k, v, normalize_keys)

  S0 = None if initial_state is None else _as_array(initial_state)
  o, S = _forward(q, k, v, beta, decay, log_decay, S0, segment_ids, cu_seqlens, rule=rule, mode=mode,
                  chunk_size=chunk_size, normalize_keys=bool(normalize_keys), dot=dot, sequences=sequences)
  return (o, S) if return_state else o


def init(batch: int, heads: int, d_k: int, d_v: int, dtype=jnp.float32) -> jax.Array:
  """The empty memory ``S_0 = 0``, ``[batch, heads, d_v, d_k]``: the first ``state`` of :func:`step`."""
  for name, n in (("batch", batch), ("heads", heads), ("d_k", d_k), ("d_v", d_v)):
    check_positive_int(name, n)
  return jnp.zeros((batch, heads, d_v, d_k), dtype)


def step(state, q_t, k_t, v_t, beta_t=None, decay_t=None, *, rule: str, log_decay_t=None,
         normalize_keys: bool = False, precision: Any = "highest"):
  """One token of inference: write ``(k_t, v_t)`` with ``rule``, then read ``o_t = S_t q_t``.

  Args:
    state: ``S_{t−1} [B, H, D_v, D_k]``.
    q_t, k_t: ``[B, H, D_k]`` (or ``[B, H / g, D_k]``: grouped value heads); v_t: ``[B, H, D_v]``.
    beta_t: ``[B, H]`` or a scalar (None → 1). decay_t: ``γ_t`` in ``[0, 1]``, or log_decay_t: ``log γ_t`` in
    ``[−inf, 0]``; ``[B, H]``
      or a scalar; exactly one is required for ``decay`` / ``gated_delta`` / ``gated_oja``.
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
  check_equal("numbers of heads", state=H, v_t=Hv)
  check_equal("numbers of heads", q_t=Hq, k_t=Hk)
  check_grouped_heads(Hq, H)
  check_equal("key widths", state=Dk, q_t=Dq, k_t=Dkk)
  check_equal("value widths", state=Dv, v_t=Dvv)
  check_floating(state=state, q_t=q_t, k_t=k_t, v_t=v_t)
  beta_t, decay_t, log_decay_t = _as_array(beta_t), _as_array(decay_t), _as_array(log_decay_t)
  if beta_t is not None:
    _check_shape("beta_t", beta_t, (B, H), "B, H")
  _decay_args(rule, decay_t, log_decay_t, ("decay_t", "log_decay_t"), (B, H), "B, H")
  check_stability(rule, beta_t, k_t, v_t, normalize_keys)
  return _step(state, q_t, k_t, v_t, beta_t, decay_t, log_decay_t, rule=rule,
               normalize_keys=bool(normalize_keys), dot=dot)


@functools.partial(jax.jit, static_argnames=("rule", "normalize_keys", "dot"))
def _step(state, q_t, k_t, v_t, beta_t, decay_t, log_decay_t, *, rule, normalize_keys, dot):
  """The computation of :func:`step` after its checks, one compiled program (op by op, an eager step
  dispatched some fifty small computations)."""
  B, H = state.shape[:2]
  acc = jnp.promote_types(acc_dtype(q_t, k_t, v_t), state.dtype)
  q, k, v = (x.astype(acc) for x in (q_t, k_t, v_t))
  if q.shape[1] != H:
    q, k = (jnp.repeat(x, H // q.shape[1], axis=1) for x in (q, k))
  if normalize_keys:
    k = l2_normalize(k)
  b = jnp.broadcast_to(jnp.asarray(1.0 if beta_t is None else beta_t, acc), (B, H))
  logg = _log_decay(decay_t, log_decay_t, acc, (B, H))
  g = jnp.ones((B, H), acc) if logg is None else jnp.exp(logg)
  write = jax.vmap(jax.vmap(functools.partial(update, rule, dot=dot)))
  S = write(state.astype(acc), k, v, b, g)
  o = dot.einsum("bhvk,bhk->bhv", S, q)
  return S.astype(state.dtype), o.astype(v_t.dtype)


__all__ = [
    "DECAY_FLOOR", "DECAY_RULES", "ERASE_RULES", "MODES", "OJA_RULES", "RULES", "WITH_DECAY",
    "associative_memory", "auto_forward_mode", "check_grouped_heads", "check_stability", "chunked_head",
    "chunked_scan", "init", "l2_normalize", "log_of_decay", "parallel_head", "recurrent_head", "step",
    "unit_lower_inverse", "update",
]
