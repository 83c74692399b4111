"""Multi-query associative recall (MQAR), as specified by Zoology.

Arora, Eyuboglu et al. (2023), "Zoology: Measuring and improving recall in efficient
language models"; the generator's specification follows HazyResearch/zoology
``zoology/data/multiquery_ar.py`` (rewritten here in JAX, pure and jit-able):

* ``num_kv_pairs`` distinct keys from ``[1, vocab_size // 2)`` and distinct values from
  ``[vocab_size // 2, vocab_size)``, laid out first as ``k₁ v₁ k₂ v₂ …``;
* the rest of the sequence holds each key once more, as a query, at even offsets
  ``2·gap`` after the context, with the gaps drawn without replacement from
  ``p(g) ∝ a·(g+1)^(a−1)``, ``g = 0 … space−1``, ``space = (T − 2·num_kv_pairs) / 2``
  (``power_a = a``; small ``a`` concentrates queries close to the context, real-text-like
  recency; ``a = 1`` is uniform);
* the target at a query position is its key's value (next-token prediction); every other
  position has mask 0;
* with ``random_non_queries`` the remaining zero tokens are replaced by random tokens.

Returns ``MQARBatch(inputs [B, T] int32, targets [B, T] int32, mask [B, T] float32)``.

:func:`multihop_recall` extends MQAR to ``hops``-step chains (``x → y → z`` for two hops):
the context lists every link of ``num_chains`` chains as a ``key value`` pair in random
order, and a query for a chain's first item must answer its last — the answer of one
recall is the query of the next, the multi-hop associative reasoning of the Pavlovian
paper's depth–width claim (``docs/papers/pavlovian.md``, result 2).

:func:`mqar_stream` and :func:`multihop_stream` are resumable streams of either: the batch at
position ``p`` of seed ``s`` is the generator's batch for ``fold_in(key(s), p)``
(:class:`~jaxmem.data.KeyedBatches`), as dicts of numpy arrays ``inputs / targets / mask``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxmem.checks import check_finite_number, check_positive_int
from jaxmem.data.batches import KeyedBatches


class MQARBatch(NamedTuple):
  inputs: jax.Array   # [B, T] int32
  targets: jax.Array  # [B, T] int32, meaningful where mask == 1
  mask: jax.Array     # [B, T] float32, 1 at query positions


def mqar(key: jax.Array, *, batch_size: int, vocab_size: int = 8192, seq_len: int = 64,
         num_kv_pairs: int = 8, power_a: float = 0.01, random_non_queries: bool = True) -> MQARBatch:
  """A batch of MQAR sequences (see the module docstring for the layout)."""
  check_positive_int("batch_size", batch_size)
  check_positive_int("vocab_size", vocab_size)
  check_positive_int("seq_len", seq_len)
  check_positive_int("num_kv_pairs", num_kv_pairs)
  a = check_finite_number("power_a", power_a, positive=True)
  if seq_len % 2:
    raise ValueError(f"`seq_len` must be even, got {seq_len}.")
  if vocab_size <= seq_len:
    raise ValueError(f"`vocab_size` ({vocab_size}) must exceed `seq_len` ({seq_len}).")
  if 4 * num_kv_pairs > seq_len:
    raise ValueError(f"`num_kv_pairs` ({num_kv_pairs}) needs seq_len >= 4 * num_kv_pairs, got {seq_len}.")
  if num_kv_pairs > vocab_size // 2 - 1:
    raise ValueError(f"`num_kv_pairs` ({num_kv_pairs}) exceeds the {vocab_size // 2 - 1} available keys.")
  return _mqar(key, batch_size=batch_size, vocab_size=vocab_size, seq_len=seq_len,
               num_kv_pairs=num_kv_pairs, power_a=a, random_non_queries=bool(random_non_queries))


@functools.partial(jax.jit, static_argnames=("batch_size", "vocab_size", "seq_len", "num_kv_pairs",
                                             "power_a", "random_non_queries"))
def _mqar(key, *, batch_size, vocab_size, seq_len, num_kv_pairs, power_a, random_non_queries):
  half = vocab_size // 2
  context = 2 * num_kv_pairs
  space = (seq_len - context) // 2
  g = jnp.arange(space, dtype=jnp.float32)
  p = power_a * (g + 1.0) ** (power_a - 1.0)
  p = p / p.sum()

  def one(key):
    k_keys, k_vals, k_gaps, k_fill = jax.random.split(key, 4)
    keys = 1 + jax.random.choice(k_keys, half - 1, (num_kv_pairs,), replace=False)
    values = half + jax.random.choice(k_vals, vocab_size - half, (num_kv_pairs,), replace=False)
    gaps = jax.random.choice(k_gaps, space, (num_kv_pairs,), replace=False, p=p)
    tokens = jnp.zeros((seq_len,), jnp.int32)
    tokens = tokens.at[jnp.arange(num_kv_pairs) * 2].set(keys).at[jnp.arange(num_kv_pairs) * 2 + 1].set(values)
    query_pos = context + 2 * gaps
    tokens = tokens.at[query_pos].set(keys)
    targets = jnp.zeros((seq_len,), jnp.int32).at[query_pos].set(values)
    mask = jnp.zeros((seq_len,), jnp.float32).at[query_pos].set(1.0)
    if random_non_queries:
      noise = jax.random.randint(k_fill, (seq_len,), 0, vocab_size)
      tokens = jnp.where(tokens == 0, noise, tokens)
    return tokens.astype(jnp.int32), targets, mask

  return MQARBatch(*jax.vmap(one)(jax.random.split(key, batch_size)))


def multihop_recall(key: jax.Array, *, batch_size: int, vocab_size: int = 256, seq_len: int = 64,
                    num_chains: int = 4, hops: int = 2, random_non_queries: bool = True) -> MQARBatch:
  """A batch of multi-hop recall sequences.

  Each sequence draws ``num_chains`` chains ``c_{i,0} → c_{i,1} → … → c_{i,hops}`` of
  distinct tokens from ``[1, vocab_size)`` (all ``num_chains·(hops+1)`` tokens distinct).
  Layout:

  * context: the ``num_chains·hops`` links ``(c_{i,j}, c_{i,j+1})`` in a random order, each
    as two adjacent tokens ``key value`` (positions ``0 … 2·num_chains·hops − 1``);
  * queries: each chain's first token ``c_{i,0}`` once, at even offsets ``2·gap`` after the
    context with the gaps drawn uniformly without replacement; the target there is the
    chain's last token ``c_{i,hops}``; the mask is 1 only at query positions;
  * every other position is 0, or with ``random_non_queries`` a random token.

  ``hops=1`` is MQAR with keys and values from one vocabulary.
  """
  check_positive_int("batch_size", batch_size)
  check_positive_int("vocab_size", vocab_size)
  check_positive_int("seq_len", seq_len)
  check_positive_int("num_chains", num_chains)
  check_positive_int("hops", hops)
  if seq_len % 2:
    raise ValueError(f"`seq_len` must be even, got {seq_len}.")
  context = 2 * num_chains * hops
  if context + 2 * num_chains > seq_len:
    raise ValueError(f"`seq_len` ({seq_len}) must hold the {context}-token context and {num_chains} queries "
                     f"at even offsets: seq_len >= 2·num_chains·(hops + 1) = {context + 2 * num_chains}.")
  if num_chains * (hops + 1) > vocab_size - 1:
    raise ValueError(f"`vocab_size` ({vocab_size}) must exceed num_chains·(hops + 1) = "
                     f"{num_chains * (hops + 1)} distinct chain tokens.")
  return _multihop(key, batch_size=batch_size, vocab_size=vocab_size, seq_len=seq_len,
                   num_chains=num_chains, hops=hops, random_non_queries=bool(random_non_queries))


@functools.partial(jax.jit, static_argnames=("batch_size", "vocab_size", "seq_len", "num_chains", "hops",
                                             "random_non_queries"))
def _multihop(key, *, batch_size, vocab_size, seq_len, num_chains, hops, random_non_queries):
  n_links = num_chains * hops
  context = 2 * n_links
  space = (seq_len - context) // 2

  def one(key):
    k_nodes, k_order, k_gaps, k_fill = jax.random.split(key, 4)
    nodes = 1 + jax.random.choice(k_nodes, vocab_size - 1, (num_chains * (hops + 1),), replace=False)
    nodes = nodes.reshape(num_chains, hops + 1)
    links = jnp.stack([nodes[:, :-1].reshape(-1), nodes[:, 1:].reshape(-1)], axis=-1)  # [n_links, 2]
    links = links[jax.random.permutation(k_order, n_links)]
    tokens = jnp.zeros((seq_len,), jnp.int32).at[:context].set(links.reshape(-1))
    gaps = jax.random.choice(k_gaps, space, (num_chains,), replace=False)
    query_pos = context + 2 * gaps
    tokens = tokens.at[query_pos].set(nodes[:, 0])
    targets = jnp.zeros((seq_len,), jnp.int32).at[query_pos].set(nodes[:, -1])
    mask = jnp.zeros((seq_len,), jnp.float32).at[query_pos].set(1.0)
    if random_non_queries:
      filled = jnp.zeros((seq_len,), bool).at[:context].set(True).at[query_pos].set(True)
      tokens = jnp.where(filled, tokens, jax.random.randint(k_fill, (seq_len,), 1, vocab_size))
    return tokens.astype(jnp.int32), targets.astype(jnp.int32), mask

  return MQARBatch(*jax.vmap(one)(jax.random.split(key, batch_size)))


def mqar_stream(seed: int, **kwargs) -> KeyedBatches:
  """Resumable stream of :func:`mqar` batches for ``seed`` (``kwargs`` as :func:`mqar`'s, with
  ``batch_size``); ``batch_at(p)`` is the batch at position ``p``, independent of history."""
  return KeyedBatches(mqar, seed, **kwargs)


def multihop_stream(seed: int, **kwargs) -> KeyedBatches:
  """Resumable stream of :func:`multihop_recall` batches for ``seed`` (``kwargs`` as its)."""
  return KeyedBatches(multihop_recall, seed, **kwargs)
