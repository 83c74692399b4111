"""Key/value pair streams for probing associative memories: pure samplers keyed by a PRNG key.

The memory probes of ``docs/papers/pavlovian.md`` store pairs in an associative matrix and
read them back; these functions draw what is stored. Shapes use ``B`` (trials or sequences),
``N`` (pairs), ``K`` / ``V`` (key / value width), ``L`` (stream length), ``R`` (independent runs).

* :func:`sample_pairs` — random unit keys (or one-hot keys) and random unit values (crosstalk and
  capacity of a memory written with continuous vectors).
* :func:`sample_chain` — multi-hop recall chains: item codes per layer and per-head key codes.
* :func:`sample_drift` — a drifting key→value map: fixed keys whose values are redrawn every period.
* :func:`sample_distinct`, :func:`sample_overwrite` — raw Gaussian keys (before a feature map ``φ``)
  with one-hot values, Schlag et al. 2021's two capacity settings (distinct keys; keys rewritten with
  new values, the latest one wanted).
* :func:`sample_symbol_streams` — the same two settings over a finite set of key and value symbols
  (ids, not vectors), for models that learn the keys (:mod:`jaxmem.experiments.pavlovian.trained_keys`);
  padded to a common symbol count so runs of different sizes stack on a leading run axis.
* :func:`order_blind_loss`, :func:`order_blind_floor` — the lowest loss any reader that ignores the
  write order (the sum rule) can reach on such streams.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp


def unit(x: jax.Array) -> jax.Array:
  """``x / ‖x‖₂`` over the last axis (no epsilon: for random Gaussian draws)."""
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def sample_pairs(key, trials: int, n: int, d_k: int, keys: str = "random") -> tuple[jax.Array, jax.Array]:
  """``trials`` sets of ``n`` pairs: keys ``[trials, n, d_k]`` (``keys="random"``: random unit vectors;
  ``"onehot"``: ``e_0 .. e_{n−1}``, needs ``n ≤ d_k``) and random unit values ``[trials, n, d_k]``."""
  kk, kv = jax.random.split(key)
  if keys == "onehot":
    if n > d_k:
      raise ValueError(f"one-hot keys need n <= d_k, got n={n}, d_k={d_k}.")
    k = jnp.broadcast_to(jnp.eye(n, d_k), (trials, n, d_k))
  elif keys == "random":
    k = unit(jax.random.normal(kk, (trials, n, d_k)))
  else:
    raise ValueError(f"keys must be 'random' or 'onehot', got {keys!r}.")
  return k, unit(jax.random.normal(kv, (trials, n, d_k)))


def sample_chain(key, trials: int, n: int, d_k: int, depth: int, heads: int) -> tuple[jax.Array, jax.Array]:
  """Multi-hop chains ``a_{0,i} → … → a_{depth,i}``: item value codes ``U [trials, depth + 1, n, d_k]``
  (layer ℓ's ``n`` items) and per-head key codes ``K [trials, depth, heads, n, d_k]`` (circuit ℓ, head h,
  item i), all random unit vectors."""
  ku, kk = jax.random.split(key)
  return (unit(jax.random.normal(ku, (trials, depth + 1, n, d_k))),
          unit(jax.random.normal(kk, (trials, depth, heads, n, d_k))))


def sample_drift(key, trials: int, m: int, d_k: int, period: int, n_periods: int):
  """A key→value map that changes every ``period`` steps, written one pair per step.

  ``m`` fixed random unit keys ``[trials, m, d_k]``; each key's value (random unit) is redrawn every
  period: ``values [trials, n_periods, m, d_k]``. At each of the ``T = period · n_periods`` steps one
  uniformly drawn key is written with its current value. Returns (keys ``[B, m, K]``, values
  ``[B, n_periods, m, V]``, stream keys ``[B, T, K]``, stream values ``[B, T, V]``), ``V = K = d_k``.
  """
  T = period * n_periods
  kk, kv, ki = jax.random.split(key, 3)
  keys_BMK = unit(jax.random.normal(kk, (trials, m, d_k)))
  vals_BPMV = unit(jax.random.normal(kv, (trials, n_periods, m, d_k)))
  which_BT = jax.random.randint(ki, (trials, T), 0, m)
  period_T = jnp.arange(T) // period
  k_BTK = jnp.take_along_axis(keys_BMK, which_BT[..., None], axis=1)
  v_BTV = vals_BPMV[jnp.arange(trials)[:, None], period_T[None, :], which_BT]
  return keys_BMK, vals_BPMV, k_BTK, v_BTV


def sample_distinct(key, trials: int, n: int, d_key: int) -> tuple[jax.Array, jax.Array]:
  """Distinct keys, one-hot values: raw keys ``[trials, n, d_key]`` with i.i.d. N(0, 1) entries (to go
  through a feature map), values ``[trials, n, n]`` one-hot of a random permutation of the ``n`` symbols
  (every pair has its own value)."""
  kk, kv = jax.random.split(key)
  k = jax.random.normal(kk, (trials, n, d_key))
  perm = jax.vmap(lambda kx: jax.random.permutation(kx, n))(jax.random.split(kv, trials))
  return k, jax.nn.one_hot(perm, n)


def sample_overwrite(key, trials: int, ms: Sequence[int], d_key: int, writes_per_key: int):
  """Overwriting keys, one-hot values: ``trials`` rows per pool size ``m`` in ``ms`` (``B = len(ms) ·
  trials`` rows, grouped by ``m``).

  A row has ``m`` raw pool keys (N(0, 1) entries, padded to ``M = max(ms)``) and a stream of
  ``writes_per_key · m`` steps, each writing a uniformly drawn pool key with a fresh uniformly drawn
  one-hot value over ``m`` symbols (one-hot width ``m``, zero-padded to ``M``), then β = 0 padding to
  ``L = writes_per_key · M``. Returns raw pool keys ``[B, M, d_key]``, key ids ``[B, L]``, values
  ``[B, L, M]``, β ``[B, L]`` (1 on a row's writes, 0 on its padding), latest values ``[B, M, M]``
  (each pool key's last written value) and written ``[B, M]`` (pool key written at least once).
  """
  M, L = max(ms), writes_per_key * max(ms)
  m_B = jnp.repeat(jnp.asarray(ms), trials)
  B = m_B.shape[0]
  kp, ki, kv = jax.random.split(key, 3)
  pool = jax.random.normal(kp, (B, M, d_key))
  ids = jnp.floor(jax.random.uniform(ki, (B, L)) * m_B[:, None]).astype(jnp.int32)
  vals = jnp.floor(jax.random.uniform(kv, (B, L)) * m_B[:, None]).astype(jnp.int32)
  active = jnp.arange(L)[None, :] < writes_per_key * m_B[:, None]
  v = jax.nn.one_hot(vals, M)
  hit_BLM = (ids[:, :, None] == jnp.arange(M)[None, None, :]) & active[:, :, None]
  last_BM = jnp.max(jnp.where(hit_BLM, jnp.arange(L)[None, :, None], -1), axis=1)
  target = jnp.take_along_axis(v, jnp.maximum(last_BM, 0)[:, :, None], axis=1)
  return pool, ids, v, active.astype(jnp.float32), target, last_BM >= 0


SETTINGS = ("distinct", "overwrite")


def sample_symbol_streams(key, S_R, P: int, setting: str, B: int, writes=2):
  """``B`` streams of (key symbol, value symbol) writes for each run ``r`` with ``S_R[r]`` key and value
  symbols, padded to ``P ≥ max S_R`` symbols so that runs stack (jit-able; ``S_R`` may be traced).

  ``"distinct"`` (Schlag et al. 2021's setting 1): length ``P``; the first ``S`` steps write every key
  once in random order, each with its own value (a random permutation of the ``S`` value symbols).
  ``"overwrite"`` (setting 2): length ``2P``; the first ``writes · S`` steps write a uniformly drawn key
  with a uniformly drawn value (both with replacement); a key's target is its latest value (the authors
  train on ``writes = 2`` and, in their code, evaluate on ``writes = 1``; ``writes`` ∈ {1, 2} may be
  traced: one shape for both). Later steps are padding (not written).

  Returns key ids, value ids ``[R, B, L]`` (int32), active ``[R, B, L]`` (float32: 1 on written steps),
  targets ``[R, B, P, P]`` (one-hot latest value of every key symbol) and queried ``[R, B, P]`` (key
  symbol written at least once).
  """
  R = S_R.shape[0]
  S_RBL = S_R[:, None, None]
  sym = jnp.arange(P)
  k1, k2 = jax.random.split(key)
  if setting == "distinct":
    L = P
    # uniform scores, +1 for the padding symbols: argsort puts a random permutation of 0..S−1 first
    perm = lambda k: jnp.argsort(jax.random.uniform(k, (R, B, P)) + (sym[None, None, :] >= S_RBL), axis=-1)
    ids, vals = perm(k1), perm(k2)
    active = jnp.broadcast_to(sym[None, None, :] < S_RBL, (R, B, L))
  elif setting == "overwrite":
    L = 2 * P
    draw = lambda k: jnp.floor(jax.random.uniform(k, (R, B, L)) * S_RBL).astype(jnp.int32)
    ids, vals = draw(k1), draw(k2)
    active = jnp.broadcast_to(jnp.arange(L)[None, None, :] < writes * S_RBL, (R, B, L))
  else:
    raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}.")
  hit = (ids[..., None] == sym[None, None, None, :]) & active[..., None]          # [R, B, L, P]
  last = jnp.max(jnp.where(hit, jnp.arange(L)[None, None, :, None], -1), axis=2)  # [R, B, P]
  y = jax.nn.one_hot(jnp.take_along_axis(vals, jnp.maximum(last, 0), axis=2), P)
  return ids.astype(jnp.int32), vals.astype(jnp.int32), active.astype(jnp.float32), y, last >= 0


def order_blind_loss(ids_BL, vals_BL, active_BL, y_BPV, queried_BP) -> jax.Array:
  """Loss of the best order-blind read on one run's streams (:func:`sample_symbol_streams` without the
  run axis; ``P`` key symbols, values ``< V``): a key's read is the mean of the values written to it,
  loss ``0.5‖y − mean‖²`` averaged over the queried keys. Scalar."""
  P, V = y_BPV.shape[1:]
  hit = (ids_BL[:, :, None] == jnp.arange(P)[None, None, :]) * active_BL[:, :, None]   # [B, L, P]
  counts_BPV = jnp.einsum("blp,blv->bpv", hit, jax.nn.one_hot(vals_BL, V))
  mean = counts_BPV / jnp.maximum(jnp.sum(counts_BPV, axis=-1, keepdims=True), 1.0)
  w = queried_BP.astype(mean.dtype)
  return jnp.sum(w * 0.5 * jnp.sum((y_BPV - mean) ** 2, axis=-1)) / jnp.maximum(jnp.sum(w), 1.0)


@functools.partial(jax.jit, static_argnames=("S", "B"))
def _order_blind_floor(key, writes, *, S: int, B: int):
  data = sample_symbol_streams(key, jnp.asarray([S]), S, "overwrite", B, writes)
  return order_blind_loss(*(x[0] for x in data))


def order_blind_floor(key, S: int, B: int, writes: int = 2) -> float:
  """Lowest expected loss any order-blind reader can reach in the "overwrite" setting with ``S`` symbols,
  measured on ``B`` sampled streams (``writes · S`` writes each).

  The sum rule's memory ``Σ_t v_t φ(k_t)ᵀ`` (and its denominator) is a sum over the multiset of written
  pairs, so its read cannot depend on write order; the latest value of a key written c times is then
  equally likely to be any of its c values, and the best such read is their mean
  (:func:`order_blind_loss`)."""
  return float(_order_blind_floor(key, writes, S=S, B=B))


__all__ = ["SETTINGS", "order_blind_floor", "order_blind_loss", "sample_chain", "sample_distinct",
           "sample_drift", "sample_overwrite", "sample_pairs", "sample_symbol_streams", "unit"]
