"""Sparse slot memory: UniMatrix-SparsePointer's fixed set of key / value / token-id slots.

Liu Xiao (2026), "Associative-State Universal Transformers", arXiv:2604.25930,
UniMatrix-SparsePointer (jaxmem's summary: ``docs/papers/unimatrix.md``). The paper gives
the read and the write in words; this module pins them as below (decisions marked *).

Shapes: ``B`` batch, ``T`` tokens, ``N`` slots, ``D`` key (and query) width, ``V`` value
width, ``Z`` the pointer's vocabulary size (``vocab_size``). Per batch element the memory
holds ``N`` slots, each a key ``[D]``, a value ``[V]``, a token id (int32, ``-1`` while
empty), a strength (float32, ``0`` while empty), an age (int32) and a ``used`` flag.

Per token ``t`` with query ``q_t``, write key ``k_t``, write value ``u_t``, id ``x_t`` and
write gate ``g_t`` (1 without one), one :func:`step` is a read followed by a write, so the
read at ``t`` sees the writes of tokens ``< t`` only (causal by construction).

Cosine (*): ``cos(a, b) = a·b / sqrt((|a|² + ε)(|b|² + ε))`` with ``ε = COS_EPS``: finite
with finite gradients at zero vectors (a zero vector has cosine 0 with everything). Dot
products are elementwise products summed in float32, not matmuls, so they are float32 on
every platform (no bf16 matmul passes deciding a merge).

READ (``read``)::

    score_n = cos(q_t, key_n) / sqrt(D) + log(max(strength_n, STRENGTH_FLOOR))   (used n)
              (slot_memory's ``cos_scale`` replaces the paper's 1 / sqrt(D))
    kept    = the top_k used slots by score (all used slots if fewer)
    w_n     = softmax_{kept}(temperature · score)_n,  0 for slots not kept
    context = Σ_n w_n value_n,    pointer[z] = Σ_n w_n [id_n == z]     (pointer_logits)

With no used slot ``w = 0`` and ``context = 0``, values and gradients finite. Top-K ties
(*): equal scores keep the lower slot index (``lax.top_k``).

WRITE (``write``), nothing at all when ``g_t <= 0`` (a boolean gate False is 0)::

    best = argmax_{used n} cos(k_t, key_n)            (ties: lowest index)
    merge  if some slot is used and cos(k_t, key_best) > threshold (strictly):
        s = strength_best;  key ← (s·key + g·k_t)/(s + g);  value ← (s·value + g·u_t)/(s + g)
        strength ← s + g (``strength_update="accumulate"``) or g (``"gate"``);
        id ← x_t (the latest id wins);   age ← 0
    (with merge ids, ``slot_memory(..., merge_ids_BT=...)``: merge into the used slot last written
    with the same id instead, whatever the cosine; ``key_ids`` holds each slot's id)
    else fill the lowest-index empty slot, if any, or else evict the oldest used slot
    (largest age; ties: lowest index) and fill it the same way:
        key ← k_t;  value ← u_t;  id ← x_t;  strength ← g;  age ← 0;  used ← True

The merge (*) is a strength-weighted running mean of the slot's key and value and the new ones.
The paper does not say how a merge changes the strength (*). ``strength_update="gate"`` (the
default) sets it to the last write's gate (1 without a write gate), so strengths do not grow with
the number of writes and the read ranks slots by cosine, as the paper's score needs.
``strength_update="accumulate"`` adds the gate, ``s + g``: a slot merged ``n`` times with
``g = 1`` then holds the mean of its ``n + 1`` keys and values and strength ``n + 1``, and a slot
written ``n`` times (a filler token) gains ``log n`` over a slot written once, while the cosine
moves the paper's score ``cos/sqrt(D)`` by at most ``2/sqrt(D)``: once enough slots have
``log n > 2/sqrt(D)`` (``n = 2`` for ``D >= 9``) no query keeps a once-written slot in the top K
(``tests/kernels/test_slots.py``).

Ageing (*): every step, written or not, every used slot except the one written this step ages
by 1; so ``age`` counts the steps since the slot was last filled or merged, and two slots
never share an age unless an ``initial_state`` gives them one.

The discrete choices (which slots are kept, merge / fill / evict, the target slot) are
piecewise constant; everything else is differentiable in the queries, keys, values and
the write gate (through the strengths and the merge weights), in float32.

The same memory as a Flax layer belongs in ``jaxmem.models``; this module is pure JAX.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.checks import (
  check_choice,
  check_equal,
  check_finite_number,
  check_floating,
  check_positive_int,
  check_rank,
  is_concrete,
  shape_of,
)
from jaxmem.kernels.segments import check_segment_ids, segment_starts, where_rows

COS_EPS = 1e-6          # added to squared norms in the cosine
STRENGTH_FLOOR = 1e-30  # log(max(strength, floor)) in the read score
STRENGTH_UPDATES = ("accumulate", "gate")  # a merged slot's strength: s + g, or g (module docstring)


class SlotState(NamedTuple):
  """The slot memory of a batch; empty slots hold zeros, id -1, strength 0, age 0."""
  keys: jax.Array      # [B, N, D]
  values: jax.Array    # [B, N, V]
  ids: jax.Array       # [B, N] int32
  strength: jax.Array  # [B, N] float32
  age: jax.Array       # [B, N] int32
  used: jax.Array      # [B, N] bool
  key_ids: Optional[jax.Array] = None  # [B, N] int32 merge ids (slot_memory's merge_ids_BT), -1: none


class SlotReadout(NamedTuple):
  """What :func:`slot_memory` read at each token (before that token's write)."""
  context: jax.Array            # [B, T, V]
  weights: jax.Array            # [B, T, N]
  ids: jax.Array                # [B, T, N] slot ids at read time
  pointer: Optional[jax.Array]  # [B, T, Z] or None without vocab_size


def init(batch: int, n_slots: int, d_key: int, d_value: int, dtype=jnp.float32) -> SlotState:
  """An empty memory: ``N = n_slots`` slots per batch element, keys and values in ``dtype``."""
  for name, value in (("n_slots", n_slots), ("d_key", d_key), ("d_value", d_value)):
    check_positive_int(name, value)
  if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
    raise ValueError(f"`batch` must be a non-negative integer, got {batch!r}.")
  B, N = batch, n_slots
  return SlotState(
      keys=jnp.zeros((B, N, d_key), dtype), values=jnp.zeros((B, N, d_value), dtype),
      ids=jnp.full((B, N), -1, jnp.int32), strength=jnp.zeros((B, N), jnp.float32),
      age=jnp.zeros((B, N), jnp.int32), used=jnp.zeros((B, N), bool),
      key_ids=jnp.full((B, N), -1, jnp.int32))


# --------------------------------------------------------------------------------------
# Batched kernels. The target slot is chosen by one-hot masks (no gathers or scatters), so
# a write is a few elementwise ops over [B, N] and [B, N, D].
# --------------------------------------------------------------------------------------


def _unit(x):
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + COS_EPS)


def _cosines(a_BD, keys_BND):
  return jnp.sum(_unit(keys_BND) * _unit(a_BD)[:, None, :], axis=-1)


def _read(state: SlotState, query_BD, top_k: int, temperature: float, cos_scale: Optional[float] = None):
  N, D = state.keys.shape[1:]
  used_BN = state.used
  scale = 1.0 / math.sqrt(D) if cos_scale is None else cos_scale
  score_BN = (_cosines(query_BD, state.keys) * scale
              + jnp.log(jnp.maximum(state.strength, STRENGTH_FLOOR)))
  _, top_BK = jax.lax.top_k(jnp.where(used_BN, score_BN, -jnp.inf), top_k)  # ties: lower index
  kept_BN = jnp.any(top_BK[:, :, None] == jnp.arange(N)[None, None, :], axis=1) & used_BN
  logits_BN = temperature * score_BN
  # softmax over the kept slots only; every branch finite so that no gradient is NaN
  top_B1 = jnp.max(jnp.where(kept_BN, logits_BN, -jnp.inf), axis=1, keepdims=True)
  top_B1 = jax.lax.stop_gradient(jnp.where(jnp.any(kept_BN, axis=1, keepdims=True), top_B1, 0.0))
  e_BN = jnp.where(kept_BN, jnp.exp(jnp.where(kept_BN, logits_BN, top_B1) - top_B1), 0.0)
  total_B1 = jnp.sum(e_BN, axis=1, keepdims=True)
  w_BN = e_BN / jnp.where(total_B1 > 0, total_B1, 1.0)
  context_BV = jnp.sum(w_BN[:, :, None] * state.values.astype(jnp.float32), axis=1)
  return context_BV, w_BN


def _write(state: SlotState, key_BD, value_BV, id_B, gate_B, threshold: float,
           strength_update: str = "gate", merge_id_B=None) -> SlotState:
  N = state.keys.shape[1]
  used_BN = state.used
  slot_1N = jnp.arange(N)[None, :]
  g_B1 = gate_B.astype(jnp.float32)[:, None]
  write_B1 = g_B1 > 0
  if merge_id_B is None:  # the paper's merge: the most similar used key, if its cosine is above threshold
    cos_BN = jnp.where(used_BN, _cosines(key_BD, state.keys), -jnp.inf)
    best_B1 = jnp.argmax(cos_BN, axis=1, keepdims=True)  # first maximum: lowest index
    merge_B1 = write_B1 & (jnp.max(cos_BN, axis=1, keepdims=True) > threshold)  # -inf: none used
    key_ids = state.key_ids
  else:  # merge by id: the used slot last written with the same merge id (at most one holds it)
    same_BN = used_BN & (state.key_ids == merge_id_B.astype(jnp.int32)[:, None])
    best_B1 = jnp.argmax(same_BN, axis=1, keepdims=True)
    merge_B1 = write_B1 & jnp.any(same_BN, axis=1, keepdims=True)
  empty_B1 = jnp.argmax(~used_BN, axis=1, keepdims=True)  # lowest-index empty slot
  oldest_B1 = jnp.argmax(jnp.where(used_BN, state.age, -1), axis=1, keepdims=True)  # ties: lowest
  target_B1 = jnp.where(merge_B1, best_B1,
                        jnp.where(jnp.any(~used_BN, axis=1, keepdims=True), empty_B1, oldest_B1))
  sel_BN = (slot_1N == target_B1) & write_B1

  pick = lambda x_BN: jnp.sum(jnp.where(sel_BN, x_BN, 0), axis=1, keepdims=True)
  pick_rows = lambda x_BNX: jnp.sum(jnp.where(sel_BN[:, :, None], x_BNX.astype(jnp.float32), 0.0), axis=1)
  s_B1 = pick(state.strength)
  denom_B1 = jnp.where(merge_B1, s_B1 + g_B1, 1.0)
  mean = lambda old, new: (s_B1 * old + g_B1 * new.astype(jnp.float32)) / denom_B1
  key_BD_new = jnp.where(merge_B1, mean(pick_rows(state.keys), key_BD), key_BD.astype(jnp.float32))
  value_BV_new = jnp.where(merge_B1, mean(pick_rows(state.values), value_BV),
                           value_BV.astype(jnp.float32))
  strength_B1 = jnp.where(merge_B1, s_B1 + g_B1, g_B1) if strength_update == "accumulate" else g_B1

  if merge_id_B is not None:
    key_ids = jnp.where(sel_BN, merge_id_B.astype(jnp.int32)[:, None], state.key_ids)
  put_rows = lambda new_BX, old_BNX: jnp.where(sel_BN[:, :, None], new_BX[:, None, :].astype(old_BNX.dtype),
                                               old_BNX)
  return SlotState(
      keys=put_rows(key_BD_new, state.keys),
      values=put_rows(value_BV_new, state.values),
      ids=jnp.where(sel_BN, id_B.astype(jnp.int32)[:, None], state.ids),
      strength=jnp.where(sel_BN, strength_B1, state.strength),
      age=jnp.where(sel_BN, 0, jnp.where(used_BN, state.age + 1, state.age)),
      used=used_BN | sel_BN, key_ids=key_ids)


# jitted entry points (the options are static) so that eager calls reuse one compilation
_read_jit = jax.jit(_read, static_argnums=(2, 3))
_write_jit = jax.jit(_write, static_argnums=(5, 6))


@functools.partial(jax.jit, static_argnums=(6, 7, 8, 9, 10, 11))
def _scan(state, queries_BTD, keys_BTD, values_BTV, ids_BT, gate_BT, top_k, threshold, temperature,
          vocab_size, cos_scale=None, strength_update="gate", merge_ids_BT=None, segment_ids_BT=None):
  time_major = lambda x: None if x is None else jnp.swapaxes(x, 0, 1)
  if segment_ids_BT is None:
    starts = None
  else:  # packed rows: the memory empties at each segment start; a padding token changes nothing
    starts = segment_starts(segment_ids_BT)
    B, N, D = state.keys.shape
    empty = init(B, N, D, state.values.shape[2])
    empty = jax.tree.map(lambda e, x: e.astype(x.dtype), empty._replace(
        key_ids=None if state.key_ids is None else empty.key_ids), state)

  def one_token(state, inputs):
    q_BD, k_BD, v_BV, x_B, g_B, m_B, s = inputs
    if s is not None:
      start_B, valid_B = s
      state = where_rows(start_B, empty, state)
    context_BV, w_BN = _read(state, q_BD, top_k, temperature, cos_scale)
    new = _write(state, k_BD, v_BV, x_B, g_B, threshold, strength_update, m_B)
    if s is not None:
      new = where_rows(valid_B, new, state)
      context_BV, w_BN = (jnp.where(valid_B[:, None], x, 0.0) for x in (context_BV, w_BN))
    return new, (context_BV, w_BN, state.ids)

  xs = tuple(map(time_major, (queries_BTD, keys_BTD, values_BTV, ids_BT, gate_BT, merge_ids_BT)))
  xs = xs + (None if starts is None else tuple(map(time_major, starts)),)
  final, (context_TBV, w_TBN, ids_TBN) = jax.lax.scan(one_token, state, xs)
  weights_BTN, slot_ids_BTN = time_major(w_TBN), time_major(ids_TBN)
  pointer = None if vocab_size is None else _pointer(weights_BTN, slot_ids_BTN, vocab_size)
  readout = SlotReadout(context=time_major(context_TBV).astype(values_BTV.dtype),
                        weights=weights_BTN, ids=slot_ids_BTN, pointer=pointer)
  return readout, final


def _pointer(weights_BN, ids_BN, vocab_size: int):
  *lead, N = weights_BN.shape
  w_MN = jnp.reshape(weights_BN, (-1, N)).astype(jnp.float32)
  i_MN = jnp.reshape(ids_BN, (-1, N))
  valid_MN = (i_MN >= 0) & (i_MN < vocab_size)
  rows_M1 = jnp.arange(w_MN.shape[0])[:, None]
  out_MZ = jnp.zeros((w_MN.shape[0], vocab_size), jnp.float32).at[
      rows_M1, jnp.where(valid_MN, i_MN, 0)].add(jnp.where(valid_MN, w_MN, 0.0))
  return jnp.reshape(out_MZ, (*lead, vocab_size)).astype(weights_BN.dtype)


# --------------------------------------------------------------------------------------
# Boundary checks.
# --------------------------------------------------------------------------------------



def _check_ids(name: str, ids, vocab_size: Optional[int]) -> None:
  dtype = getattr(ids, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"`{name}` must hold integer token ids, got dtype {dtype}.")
  if is_concrete(ids) and ids.size:
    lo, hi = int(np.min(np.asarray(ids))), int(np.max(np.asarray(ids)))
    if lo < 0 or (vocab_size is not None and hi >= vocab_size):
      allowed = "be non-negative" if vocab_size is None else f"lie in [0, vocab_size={vocab_size})"
      raise ValueError(f"`{name}` must {allowed}, got values in [{lo}, {hi}].")


def _check_gate(name: str, gate, shape: tuple[int, ...]) -> None:
  check_rank(name, gate, len(shape), ", ".join("BT"[: len(shape)]))
  if tuple(gate.shape) != shape:
    raise ValueError(f"`{name}` must have shape {shape}, got {tuple(gate.shape)}.")
  if not (gate.dtype == jnp.bool_ or jnp.issubdtype(gate.dtype, jnp.floating)):
    raise ValueError(f"`{name}` must be boolean or floating-point, got dtype {gate.dtype}.")
  if is_concrete(gate) and gate.size and gate.dtype != jnp.bool_:
    g = np.asarray(gate, np.float64)
    bad = ~((g >= 0) & (g <= 1))   # NaN is bad too
    if bad.any():
      raise ValueError(f"`{name}` must lie in [0, 1] (a write gate), got values such as {g[bad][:3].tolist()}.")


def _check_options(*, top_k=None, n_slots=None, threshold=None, temperature=None):
  if n_slots is not None:
    check_positive_int("n_slots", n_slots)
  if top_k is not None:
    check_positive_int("top_k", top_k)
    if n_slots is not None and top_k > n_slots:
      raise ValueError(f"`top_k` must be at most `n_slots` ({n_slots}), got {top_k}.")
  if threshold is not None:
    threshold = check_finite_number("threshold", threshold)
    if not -1.0 <= threshold <= 1.0:
      raise ValueError(f"`threshold` must lie in [-1, 1] (a cosine), got {threshold!r}.")
  if temperature is not None:
    temperature = check_finite_number("temperature", temperature, positive=True)
  return threshold, temperature


def check_state(state, *, batch=None, n_slots=None, d_key=None, d_value=None) -> tuple[int, int, int, int]:
  """Validates a :class:`SlotState` (field shapes, dtypes, and the sizes given); returns
  ``(B, N, D, V)``. Raises ``ValueError`` naming the field."""
  if not isinstance(state, SlotState):
    raise ValueError(f"`state` must be a SlotState, got {type(state).__name__}.")
  B, N, D = check_rank("state.keys", state.keys, 3, "B, N, D")
  V = check_rank("state.values", state.values, 3, "B, N, V")[2]
  for name in ("ids", "strength", "age", "used"):
    shape = check_rank(f"state.{name}", getattr(state, name), 2, "B, N")
    if shape != (B, N):
      raise ValueError(f"`state.{name}` must have shape {(B, N)} like state.keys, got {shape}.")
  if tuple(state.values.shape[:2]) != (B, N):
    raise ValueError(
        f"`state.values` must start with {(B, N)} like state.keys, got {tuple(state.values.shape)}.")
  for name, want in (("ids", jnp.integer), ("age", jnp.integer), ("strength", jnp.floating)):
    if not jnp.issubdtype(getattr(state, name).dtype, want):
      raise ValueError(f"`state.{name}` has dtype {getattr(state, name).dtype}, expected {want.__name__}.")
  if state.used.dtype != jnp.bool_:
    raise ValueError(f"`state.used` must be boolean, got dtype {state.used.dtype}.")
  given = dict(batch=batch, n_slots=n_slots, d_key=d_key, d_value=d_value)
  for (name, want), got in zip(given.items(), (B, N, D, V), strict=True):
    if want is not None and want != got:
      raise ValueError(f"mismatched {name}: state has {got}, the inputs need {want}.")
  return B, N, D, V


# --------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------


def read(state: SlotState, query_BD, *, top_k: int = 4, temperature: float = 8.0):
  """Top-K cosine read of the used slots (module docstring, READ).

  Args:
    state: the memory, ``N`` slots of keys ``[B, N, D]``.
    query_BD: ``[B, D]`` queries.
    top_k: slots kept per read (``<= N``); fewer when fewer are used.
    temperature: the softmax's inverse temperature over the scores.

  Returns:
    ``(context_BV, weights_BN)``: the read ``[B, V]`` (dtype of ``state.values``) and the
    float32 weights ``[B, N]`` (0 outside the kept slots; all 0 for an empty memory).
  """
  B, N, D, _ = check_state(state)
  shape = check_rank("query_BD", query_BD, 2, "B, D")
  check_equal("batch sizes", query_BD=shape[0], state=B)
  check_equal("key widths", query_BD=shape[1], state=D)
  check_floating(query_BD=query_BD)
  _, temperature = _check_options(top_k=top_k, n_slots=N, temperature=temperature)
  context_BV, w_BN = _read_jit(state, query_BD, top_k, temperature)
  return context_BV.astype(state.values.dtype), w_BN


def write(state: SlotState, key_BD, value_BV, id_B, *, gate_B=None, threshold: float = 0.85,
          strength_update: str = "gate") -> SlotState:
  """Merge / fill / evict write of one token per batch element (module docstring, WRITE).

  Args:
    state: the memory.
    key_BD: ``[B, D]`` write keys; value_BV: ``[B, V]`` write values.
    id_B: ``[B]`` integer token ids (``>= 0``) stored with the write.
    gate_B: ``[B]`` write gate in ``[0, 1]`` (float or bool); None writes with ``g = 1``.
      ``g <= 0`` writes nothing (the used slots still age).
    threshold: merge when the best cosine with a used key is strictly above it.
    strength_update: a merged slot's strength: ``"accumulate"`` (``s + g``) or ``"gate"`` (``g``);
      module docstring, WRITE.

  Returns:
    the new :class:`SlotState`.
  """
  B, N, D, V = check_state(state)
  kshape = check_rank("key_BD", key_BD, 2, "B, D")
  vshape = check_rank("value_BV", value_BV, 2, "B, V")
  ishape = check_rank("id_B", id_B, 1, "B")
  check_equal("batch sizes", key_BD=kshape[0], value_BV=vshape[0], id_B=ishape[0], state=B)
  check_equal("key widths", key_BD=kshape[1], state=D)
  check_equal("value widths", value_BV=vshape[1], state=V)
  check_floating(key_BD=key_BD, value_BV=value_BV)
  _check_ids("id_B", id_B, None)
  if gate_B is not None:
    _check_gate("gate_B", gate_B, (B,))
  threshold, _ = _check_options(threshold=threshold)
  check_choice("strength_update", strength_update, STRENGTH_UPDATES)
  gate_B = jnp.ones((B,), jnp.float32) if gate_B is None else jnp.asarray(gate_B, jnp.float32)
  return _write_jit(state, key_BD, value_BV, id_B, gate_B, threshold, strength_update)


def step(state: SlotState, query_BD, key_BD, value_BV, id_B, *, gate_B=None, top_k: int = 4,
         threshold: float = 0.85, temperature: float = 8.0, strength_update: str = "gate"):
  """One token: :func:`read` with ``query_BD``, then :func:`write`.

  Returns:
    ``(new_state, (context_BV, weights_BN))``.
  """
  out = read(state, query_BD, top_k=top_k, temperature=temperature)
  return write(state, key_BD, value_BV, id_B, gate_B=gate_B, threshold=threshold,
               strength_update=strength_update), out


def pointer_logits(weights_BN, ids_BN, vocab_size: int):
  """Pointer-logit fusion: ``pointer[..., z] = Σ_n w[..., n] [id[..., n] == z]``.

  A scatter-add of the read weights at the slots' token ids; repeated ids add up, and ids
  outside ``[0, vocab_size)`` (empty slots hold -1) contribute nothing. The model
  multiplies the result by its gate and adds it to its logits.

  Args:
    weights_BN: ``[..., N]`` read weights (any leading axes, e.g. ``[B, N]`` or ``[B, T, N]``).
    ids_BN: integer ids of the same shape.
    vocab_size: ``Z``.

  Returns:
    ``[..., Z]`` in the dtype of ``weights_BN`` (float32 accumulation).
  """
  check_positive_int("vocab_size", vocab_size)
  wshape = shape_of(weights_BN)
  if not wshape:
    raise ValueError("`weights_BN` must have at least one axis [..., N], got a scalar.")
  if shape_of(ids_BN) != wshape:
    raise ValueError(f"`ids_BN` must have the shape of `weights_BN` {wshape}, got {shape_of(ids_BN)}.")
  check_floating(weights_BN=weights_BN)
  dtype = getattr(ids_BN, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"`ids_BN` must hold integer token ids, got dtype {dtype}.")
  return _pointer(jnp.asarray(weights_BN), jnp.asarray(ids_BN), vocab_size)


def slot_memory(queries_BTD, keys_BTD, values_BTV, ids_BT, *, n_slots: int, top_k: int = 4,
                threshold: float = 0.85, temperature: float = 8.0, write_gate_BT=None,
                vocab_size: Optional[int] = None, initial_state: Optional[SlotState] = None,
                return_state: bool = False, cos_scale: Optional[float] = None,
                strength_update: str = "gate", merge_ids_BT=None, segment_ids=None):
  """The slot memory run over a sequence: per token a read, then a write (``lax.scan``).

  Args:
    queries_BTD: ``[B, T, D]`` read queries.
    keys_BTD: ``[B, T, D]`` write keys (the paper: the embedding of the previous token).
    values_BTV: ``[B, T, V]`` write values (the paper: the embedding of the token).
    ids_BT: ``[B, T]`` integer token ids written with each value.
    n_slots: ``N``.
    top_k: slots kept per read (``<= n_slots``).
    threshold: merge cosine threshold in ``[-1, 1]``.
    temperature: the read softmax's inverse temperature (finite, > 0).
    write_gate_BT: ``[B, T]`` write gate in ``[0, 1]`` (float or bool); None: always write.
    vocab_size: ``Z``; when given the readout includes the pointer ``[B, T, Z]`` and the
      ids must lie in ``[0, Z)``.
    initial_state: a :class:`SlotState` to start from; None: :func:`init` with keys and
      values in ``promote_types(dtype of keys/values, float32)``.
    return_state: also return the final state.
    cos_scale: the cosine's weight in the score, ``score = cos_scale · cos + log(strength)``;
      None is the paper's ``1 / √D`` (finite and > 0 otherwise).
    strength_update: a merged slot's strength, ``"accumulate"`` (``s + g``) or ``"gate"`` (``g``);
      module docstring, WRITE.
    merge_ids_BT: ``[B, T]`` integer ids ``>= 0`` deciding merges instead of the key cosine: a
      write merges into the used slot last written with the same merge id, else fills or evicts
      (``threshold`` is then unused; slots of an ``initial_state`` without ``key_ids`` never
      match). UniMatrix passes the key's token id ``x_{t−1}``, so that two tokens whose key
      embeddings grow similar keep separate slots. None: the paper's cosine merge.
    segment_ids: ``[B, T]`` integers, packed sequences (:mod:`jaxmem.kernels.segments`): the memory empties
      at the first token of every segment but a row's first (which continues ``initial_state``); a padding
      token reads nothing (context, weights and pointer 0) and changes nothing (no write, no ageing).

  Returns:
    :class:`SlotReadout` (context in the dtype of ``values_BTV``), and with
    ``return_state`` the tuple ``(readout, final_state)``.

  Raises:
    ValueError: ranks or sizes that disagree, non-float queries / keys / values, non-integer
      ids, concrete ids outside ``[0, vocab_size)`` (or negative), ``n_slots`` / ``top_k`` /
      ``vocab_size`` not positive integers, ``top_k > n_slots``, ``threshold`` outside
      ``[-1, 1]``, ``temperature`` not finite and positive, a malformed ``initial_state``.
  """
  B, T, D = check_rank("queries_BTD", queries_BTD, 3, "B, T, D")
  kshape = check_rank("keys_BTD", keys_BTD, 3, "B, T, D")
  vshape = check_rank("values_BTV", values_BTV, 3, "B, T, V")
  ishape = check_rank("ids_BT", ids_BT, 2, "B, T")
  check_equal("batch sizes", queries_BTD=B, keys_BTD=kshape[0], values_BTV=vshape[0], ids_BT=ishape[0])
  check_equal("sequence lengths", queries_BTD=T, keys_BTD=kshape[1], values_BTV=vshape[1], ids_BT=ishape[1])
  check_equal("key widths", queries_BTD=D, keys_BTD=kshape[2])
  V = vshape[2]
  if D == 0 or V == 0:
    raise ValueError(f"key and value widths must be positive, got D={D}, V={V}.")
  check_floating(queries_BTD=queries_BTD, keys_BTD=keys_BTD, values_BTV=values_BTV)
  threshold, temperature = _check_options(
      top_k=top_k, n_slots=n_slots, threshold=threshold, temperature=temperature)
  if vocab_size is not None:
    check_positive_int("vocab_size", vocab_size)
  if cos_scale is not None:
    cos_scale = check_finite_number("cos_scale", cos_scale, positive=True)
  check_choice("strength_update", strength_update, STRENGTH_UPDATES)
  _check_ids("ids_BT", ids_BT, vocab_size)
  if write_gate_BT is not None:
    _check_gate("write_gate_BT", write_gate_BT, (B, T))
  if merge_ids_BT is not None:
    if check_rank("merge_ids_BT", merge_ids_BT, 2, "B, T") != (B, T):
      raise ValueError(f"`merge_ids_BT` must have shape [B, T] = {(B, T)}, got {shape_of(merge_ids_BT)}.")
    _check_ids("merge_ids_BT", merge_ids_BT, None)
  if initial_state is None:
    dtype = jnp.promote_types(jnp.result_type(keys_BTD, values_BTV), jnp.float32)
    initial_state = init(B, n_slots, D, V, dtype)
  else:
    check_state(initial_state, batch=B, n_slots=n_slots, d_key=D, d_value=V)
    if merge_ids_BT is not None and initial_state.key_ids is None:
      initial_state = initial_state._replace(key_ids=jnp.full((B, n_slots), -1, jnp.int32))

  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, B, T)
  gate_BT = (jnp.ones((B, T), jnp.float32) if write_gate_BT is None
             else jnp.asarray(write_gate_BT, jnp.float32))
  readout, final = _scan(initial_state, queries_BTD, keys_BTD, values_BTV, ids_BT, gate_BT,
                         top_k, threshold, temperature, vocab_size, cos_scale, strength_update,
                         merge_ids_BT, segment_ids)
  return (readout, final) if return_state else readout
