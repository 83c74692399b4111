"""Algorithmic memory tasks: copy, repeat copy, associative recall, priority sort.

Every generator is a pure function of a ``jax.random`` key and static (Python ``int`` /
``float``) size arguments, so it runs under ``jax.jit(..., static_argnames=...)`` and gives
the same batch for the same key. Batches are **batch-major** and rectangular:
``observations [B, T, C_in]``, ``targets [B, T, C_out]``, ``mask [B, T]`` (all float32),
with a fixed total length ``T`` computed from the *maximum* sizes; each example samples its
own length and is zero-padded to ``T`` (padding has mask 0). Bits are i.i.d. Bernoulli(1/2).

Specifications followed (each generator's docstring pins its channels and timing):

* copy, associative recall, priority sort: Graves, Wayne & Danihelka (2014), "Neural Turing
  Machines", arXiv:1410.5401, sections 4.1, 4.3, 4.5. The paper fixes the tasks, not the
  channel layout; the layouts here are this library's.
* repeat copy: DeepMind's ``dnc/repeat_copy.py`` (github.com/google-deepmind/dnc), whose
  channel layout and timing are reproduced exactly; see :func:`repeat_copy` for the two
  differences (batch-major, padding to a static length).

Their loss and metric (:func:`~jaxmem.train.losses.masked_sigmoid_cross_entropy`, summed over channels as
DeepMind's, and :func:`~jaxmem.train.losses.bit_error_rate`) are in :mod:`jaxmem.train.losses`.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxmem.checks import check_finite_number, check_positive_int


class TaskBatch(NamedTuple):
  """One batch of an algorithmic task (all float32, batch-major)."""
  observations: jax.Array  # [B, T, C_in]
  targets: jax.Array       # [B, T, C_out]
  mask: jax.Array          # [B, T]; 1 where the target counts (the response), 0 elsewhere


# ----------------------------------------------------------------------------- arguments


def _check_nonnegative_int(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError(f"`{name}` must be a non-negative integer, got {value!r}.")
  return value


def _check_range(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
  if lo > hi:
    raise ValueError(f"`{lo_name}` ({lo}) must be <= `{hi_name}` ({hi}).")


def _check_key(key: Any) -> None:
  """Accepts a typed key (``jax.random.key``) or a raw ``uint32[2]`` key (``PRNGKey``)."""
  dtype = getattr(key, "dtype", None)
  if dtype is None:
    raise ValueError(f"`key` must be a jax.random key, got {type(key).__name__}.")
  if jnp.issubdtype(dtype, jax.dtypes.prng_key):
    if key.shape != ():
      raise ValueError(f"`key` must be a single key (shape ()), got shape {key.shape}.")
  elif dtype != jnp.uint32 or key.shape != (2,):
    raise ValueError(f"`key` must be a jax.random key, got dtype {dtype} and shape {key.shape}.")


def _bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  return jax.random.bernoulli(key, 0.5, shape).astype(jnp.float32)


def _gather_rows(x_NC: jax.Array, idx_T: jax.Array, on_T: jax.Array) -> jax.Array:
  """``out[t] = x[idx[t]]`` where ``on[t]``, else 0; ``idx`` is clipped into range."""
  rows_TC = x_NC[jnp.clip(idx_T, 0, x_NC.shape[0] - 1)]
  return jnp.where(on_T[:, None], rows_TC, 0.0)


def _one_channel(on_T: jax.Array, value: jax.Array | float, n_channels: int, channel: int) -> jax.Array:
  """``[T, n_channels]`` that is ``value`` on ``channel`` where ``on``, 0 elsewhere."""
  col_T = jnp.where(on_T, value, 0.0).astype(jnp.float32)
  onehot_C = (jnp.arange(n_channels) == channel).astype(jnp.float32)
  return col_T[:, None] * onehot_C[None, :]


# ----------------------------------------------------------------------------------- copy

# Each public generator validates its (static) arguments in Python, then calls a jitted
# `_<task>_batch` with them as static arguments: one compilation per configuration, also
# when called eagerly, and inlined when the caller jits.


def copy_task(key: jax.Array, *, batch_size: int, num_bits: int, min_length: int,
              max_length: int) -> TaskBatch:
  """NTM copy (Graves et al. 2014, sec. 4.1): read a bit pattern, then write it back.

  Per example, ``L ~ U{min_length, ..., max_length}`` and a pattern ``P [L, num_bits]``.
  With ``T = 2 * max_length + 1``::

      observations [B, T, num_bits + 1]   channels 0..num_bits-1: bits
                                          channel  num_bits:      delimiter flag
      targets      [B, T, num_bits]
      mask         [B, T]

      t in [0, L)         observation bits = P[t]
      t = L               observation delimiter = 1 (bits 0)
      t in [L+1, 2L+1)    observation 0; target = P[t - L - 1]; mask = 1
      t >= 2L + 1         padding (all 0, mask 0)

  Targets are 0 and mask is 0 outside the response region.
  """
  _check_key(key)
  check_positive_int("batch_size", batch_size)
  check_positive_int("num_bits", num_bits)
  check_positive_int("min_length", min_length)
  check_positive_int("max_length", max_length)
  _check_range("min_length", min_length, "max_length", max_length)
  return _copy_batch(key, batch_size=batch_size, num_bits=num_bits, min_length=min_length,
                     max_length=max_length)


@functools.partial(jax.jit, static_argnames=("batch_size", "num_bits", "min_length", "max_length"))
def _copy_batch(key, *, batch_size, num_bits, min_length, max_length):
  T = 2 * max_length + 1

  def one(key):
    k_len, k_bits = jax.random.split(key)
    L = jax.random.randint(k_len, (), min_length, max_length + 1)
    pattern_Lb = _bits(k_bits, (max_length, num_bits))
    t = jnp.arange(T)
    respond_T = (t >= L + 1) & (t < 2 * L + 1)
    obs_bits_Tb = _gather_rows(pattern_Lb, t, t < L)
    obs_TC = jnp.concatenate([obs_bits_Tb, jnp.zeros((T, 1), jnp.float32)], axis=1)
    obs_TC = obs_TC + _one_channel(t == L, 1.0, num_bits + 1, num_bits)
    targ_Tb = _gather_rows(pattern_Lb, t - L - 1, respond_T)
    return obs_TC, targ_Tb, respond_T.astype(jnp.float32)

  return TaskBatch(*jax.vmap(one)(jax.random.split(key, batch_size)))


# ---------------------------------------------------------------------------- repeat copy


def repeat_copy(key: jax.Array, *, batch_size: int, num_bits: int, min_length: int, max_length: int,
                min_repeats: int, max_repeats: int, norm_max: float) -> TaskBatch:
  """Repeat copy, as DeepMind's ``dnc/repeat_copy.py`` (``RepeatCopy._build``).

  Per example, ``L ~ U{min_length..max_length}``, ``R ~ U{min_repeats..max_repeats}`` and a
  pattern ``P [L, num_bits]``; its own length is ``L (R + 1) + 3``, padded to the static
  ``T = max_length (max_repeats + 1) + 3``::

      observations [B, T, num_bits + 2]   channels 0..num_bits-1: bits
                                          channel  num_bits:      start flag
                                          channel  num_bits + 1:  repeat count R / norm_max
      targets      [B, T, num_bits + 1]   channels 0..num_bits-1: bits
                                          channel  num_bits:      end marker
      mask         [B, T]

      t = 0                    observation start flag = 1
      t in [1, L]              observation bits = P[t - 1]
      t = L + 1                observation repeat channel = R / norm_max
      t in [L+2, L+2+LR)       observation 0; target bits = P[(t - L - 2) mod L]; mask 1
      t = L + 2 + LR           observation 0; target end marker = 1;              mask 1
      t > L + 2 + LR           padding (all 0, mask 0)

  So the mask covers exactly the ``L R + 1`` response steps, end marker included; this is
  DeepMind's layout step for step. Differences from their generator: tensors are
  batch-major ``[B, T, ...]`` (theirs are time-major ``[T, B, ...]``), and every batch is
  padded to the static ``T`` above (theirs to the longest example drawn in that batch), so
  that the function jits; the padding is zeros with mask 0 in both. ``min_repeats = 0`` is
  allowed (target = the end marker alone), as in theirs.
  """
  _check_key(key)
  check_positive_int("batch_size", batch_size)
  check_positive_int("num_bits", num_bits)
  check_positive_int("min_length", min_length)
  check_positive_int("max_length", max_length)
  _check_range("min_length", min_length, "max_length", max_length)
  _check_nonnegative_int("min_repeats", min_repeats)
  _check_nonnegative_int("max_repeats", max_repeats)
  _check_range("min_repeats", min_repeats, "max_repeats", max_repeats)
  norm = check_finite_number("norm_max", norm_max, positive=True)
  return _repeat_copy_batch(key, batch_size=batch_size, num_bits=num_bits, min_length=min_length,
                            max_length=max_length, min_repeats=min_repeats, max_repeats=max_repeats,
                            norm=norm)


@functools.partial(jax.jit, static_argnames=("batch_size", "num_bits", "min_length", "max_length",
                                             "min_repeats", "max_repeats", "norm"))
def _repeat_copy_batch(key, *, batch_size, num_bits, min_length, max_length, min_repeats, max_repeats, norm):
  T = max_length * (max_repeats + 1) + 3
  C_in, C_out = num_bits + 2, num_bits + 1

  def one(key):
    k_len, k_rep, k_bits = jax.random.split(key, 3)
    L = jax.random.randint(k_len, (), min_length, max_length + 1)
    R = jax.random.randint(k_rep, (), min_repeats, max_repeats + 1)
    pattern_Lb = _bits(k_bits, (max_length, num_bits))
    t = jnp.arange(T)
    start, end = L + 2, L + 2 + L * R  # response steps [start, end], end = end marker
    obs_bits_Tb = _gather_rows(pattern_Lb, t - 1, (t >= 1) & (t <= L))
    obs_TC = jnp.concatenate([obs_bits_Tb, jnp.zeros((T, 2), jnp.float32)], axis=1)
    obs_TC = obs_TC + _one_channel(t == 0, 1.0, C_in, num_bits)
    obs_TC = obs_TC + _one_channel(t == L + 1, R.astype(jnp.float32) / norm, C_in, num_bits + 1)
    targ_bits_Tb = _gather_rows(pattern_Lb, (t - start) % L, (t >= start) & (t < end))
    targ_TC = jnp.concatenate([targ_bits_Tb, jnp.zeros((T, 1), jnp.float32)], axis=1)
    targ_TC = targ_TC + _one_channel(t == end, 1.0, C_out, num_bits)
    mask_T = ((t >= start) & (t <= end)).astype(jnp.float32)
    return obs_TC, targ_TC, mask_T

  return TaskBatch(*jax.vmap(one)(jax.random.split(key, batch_size)))


# --------------------------------------------------------------------- associative recall


def associative_recall(key: jax.Array, *, batch_size: int, num_bits: int = 6, item_length: int = 3,
                       min_items: int = 2, max_items: int = 6) -> TaskBatch:
  """NTM associative recall (Graves et al. 2014, sec. 4.3): given a query item, recall the next.

  Per example, ``N ~ U{min_items..max_items}`` items ``I_0..I_{N-1}``, each ``K = item_length``
  vectors of ``num_bits`` bits, and a query index ``q ~ U{0..N-2}``. With ``S = N (K + 1)``
  and the static ``T = max_items (K + 1) + 2 K + 2``::

      observations [B, T, num_bits + 2]   channels 0..num_bits-1: bits
                                          channel  num_bits:      item delimiter
                                          channel  num_bits + 1:  query delimiter
      targets      [B, T, num_bits]
      mask         [B, T]

      t = i (K+1)                    item delimiter = 1            (i = 0..N-1)
      t = i (K+1) + 1 + k            bits = I_i[k]                  (k = 0..K-1)
      t = S                          query delimiter = 1
      t in [S+1, S+K]                bits = I_q[t - S - 1]
      t = S + K + 1                  query delimiter = 1
      t in [S+K+2, S+2K+2)           observation 0; target = I_{q+1}[t - S - K - 2]; mask 1
      t >= S + 2K + 2                padding (all 0, mask 0)

  The NTM paper fixes the task (items bounded by delimiters, 3 x 6-bit items, 2-6 items); the
  channel layout is this library's. Unlike a plain i.i.d. draw, the ``N`` items of an
  example are **distinct** (rejection-sampled), so the answer is always unambiguous; this
  needs ``2 ** (num_bits * item_length) >= max_items``.
  """
  _check_key(key)
  check_positive_int("batch_size", batch_size)
  check_positive_int("num_bits", num_bits)
  check_positive_int("item_length", item_length)
  check_positive_int("min_items", min_items)
  check_positive_int("max_items", max_items)
  if min_items < 2:
    raise ValueError(f"`min_items` must be >= 2 (the query needs a following item), got {min_items}.")
  _check_range("min_items", min_items, "max_items", max_items)
  if num_bits * item_length < 31 and 2 ** (num_bits * item_length) < max_items:
    raise ValueError(
        f"`max_items` ({max_items}) exceeds the {2 ** (num_bits * item_length)} distinct items of "
        f"`num_bits` * `item_length` = {num_bits * item_length} bits.")
  return _associative_recall_batch(key, batch_size=batch_size, num_bits=num_bits, item_length=item_length,
                                   min_items=min_items, max_items=max_items)


@functools.partial(jax.jit, static_argnames=("batch_size", "num_bits", "item_length", "min_items", "max_items"))
def _associative_recall_batch(key, *, batch_size, num_bits, item_length, min_items, max_items):
  K, M = item_length, max_items
  T = M * (K + 1) + 2 * K + 2
  C_in = num_bits + 2

  def one(key):
    k_n, k_q, k_items = jax.random.split(key, 3)
    N = jax.random.randint(k_n, (), min_items, max_items + 1)
    q = jax.random.randint(k_q, (), 0, N - 1)
    valid_M = jnp.arange(M) < N
    pairs_MM = valid_M[:, None] & valid_M[None, :] & ~jnp.eye(M, dtype=bool)

    def draw(i):
      return jax.random.bernoulli(jax.random.fold_in(k_items, i), 0.5, (M, K * num_bits))

    def has_duplicate(state):
      items_MF = state[1]
      same_MM = jnp.all(items_MF[:, None, :] == items_MF[None, :, :], axis=-1)
      return jnp.any(same_MM & pairs_MM)

    _, items_MF = jax.lax.while_loop(has_duplicate, lambda s: (s[0] + 1, draw(s[0] + 1)), (0, draw(0)))
    vectors_Vb = items_MF.astype(jnp.float32).reshape(M * K, num_bits)  # row i*K + k = I_i[k]
    t = jnp.arange(T)
    S = N * (K + 1)
    in_items, slot = t < S, t % (K + 1)
    item_bits_Tb = _gather_rows(vectors_Vb, (t // (K + 1)) * K + slot - 1, in_items & (slot > 0))
    query_bits_Tb = _gather_rows(vectors_Vb, q * K + t - S - 1, (t >= S + 1) & (t <= S + K))
    obs_TC = jnp.concatenate([item_bits_Tb + query_bits_Tb, jnp.zeros((T, 2), jnp.float32)], axis=1)
    obs_TC = obs_TC + _one_channel(in_items & (slot == 0), 1.0, C_in, num_bits)
    obs_TC = obs_TC + _one_channel((t == S) | (t == S + K + 1), 1.0, C_in, num_bits + 1)
    respond_T = (t >= S + K + 2) & (t < S + 2 * K + 2)
    targ_Tb = _gather_rows(vectors_Vb, (q + 1) * K + t - S - K - 2, respond_T)
    return obs_TC, targ_Tb, respond_T.astype(jnp.float32)

  return TaskBatch(*jax.vmap(one)(jax.random.split(key, batch_size)))


# -------------------------------------------------------------------------- priority sort


def priority_sort(key: jax.Array, *, batch_size: int, num_bits: int, num_inputs: int = 20,
                  num_outputs: int = 16) -> TaskBatch:
  """NTM priority sort (Graves et al. 2014, sec. 4.5): output the highest-priority vectors in order.

  Per example, ``num_inputs`` (``n``) random vectors ``X_i`` with priorities ``p_i ~ U[-1, 1]``;
  the target is the ``num_outputs`` (``m``) vectors of highest priority, sorted by descending
  priority. Lengths are fixed (as in the paper: 20 in, 16 out); ``T = n + 1 + m``::

      observations [B, T, num_bits + 2]   channels 0..num_bits-1: bits
                                          channel  num_bits:      priority p_i
                                          channel  num_bits + 1:  delimiter flag
      targets      [B, T, num_bits]
      mask         [B, T]

      t in [0, n)          observation bits = X_t, priority = p_t
      t = n                observation delimiter = 1
      t in [n+1, n+1+m)    observation 0; target = X_{σ(t-n-1)}; mask 1

  where ``σ`` orders the inputs by descending priority. The paper fixes the task; the channel
  layout (priority on its own channel, a delimiter before the response) is this library's.
  """
  _check_key(key)
  check_positive_int("batch_size", batch_size)
  check_positive_int("num_bits", num_bits)
  check_positive_int("num_inputs", num_inputs)
  check_positive_int("num_outputs", num_outputs)
  _check_range("num_outputs", num_outputs, "num_inputs", num_inputs)
  return _priority_sort_batch(key, batch_size=batch_size, num_bits=num_bits, num_inputs=num_inputs,
                              num_outputs=num_outputs)


@functools.partial(jax.jit, static_argnames=("batch_size", "num_bits", "num_inputs", "num_outputs"))
def _priority_sort_batch(key, *, batch_size, num_bits, num_inputs, num_outputs):
  n, m = num_inputs, num_outputs
  T = n + 1 + m
  C_in = num_bits + 2

  def one(key):
    k_bits, k_pri = jax.random.split(key)
    x_nb = _bits(k_bits, (n, num_bits))
    p_n = jax.random.uniform(k_pri, (n,), jnp.float32, -1.0, 1.0)
    order_n = jnp.argsort(-p_n, stable=True)
    t = jnp.arange(T)
    inputs_T = t < n
    obs_bits_Tb = _gather_rows(x_nb, t, inputs_T)
    pri_T = jnp.where(inputs_T, p_n[jnp.clip(t, 0, n - 1)], 0.0)
    obs_TC = jnp.concatenate([obs_bits_Tb, pri_T[:, None], jnp.zeros((T, 1), jnp.float32)], axis=1)
    obs_TC = obs_TC + _one_channel(t == n, 1.0, C_in, num_bits + 1)
    respond_T = t >= n + 1
    targ_Tb = _gather_rows(x_nb, order_n[jnp.clip(t - n - 1, 0, m - 1)], respond_T)
    return obs_TC, targ_Tb, respond_T.astype(jnp.float32)

  return TaskBatch(*jax.vmap(one)(jax.random.split(key, batch_size)))
