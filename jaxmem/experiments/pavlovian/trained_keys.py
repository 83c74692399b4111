"""Learned key embeddings over an associative memory: Schlag et al. 2021's synthetic capacity model.

A functional model (a raw parameter dict, no NNX module) so that many small runs stack on a leading
axis and train together under ``vmap`` (:mod:`jaxmem.train.many_runs`). Setup as in the authors'
public synthetic code (github.com/ischlag/fast-weight-transformers, ``synthetic/``; read for the
protocol, not copied):

* ``S`` key symbols and ``S`` value symbols; values are fixed one-hot vectors ``v ∈ R^S``; each key
  symbol has a learned embedding ``e(k) ∈ R^{⌊2.2 S⌋}`` (:func:`emb_width`), ``N(0, 1)`` init.
* write key ``k_t = W_K [e(k_t); v_t] + b_K ∈ R^d`` (the write key also sees the one-hot value),
  query ``q = W_Q e(q) + b_Q`` (separate projections of the same embedding).
* ``rule="hebb"`` (the sum rule, β = 1): unnormalised ``φ`` and the linear-attention read
  ``ŷ = S φ(q) / (z · φ(q) + 1e-6)``, ``z = Σ_t φ(k_t)`` (written through the kernel as an extra
  all-ones value channel).
* ``rule="delta"``: sum-normalised ``φ(k)``, ``φ(q)``
  (:func:`jaxmem.kernels.feature_maps.normalized_features`), no denominator, and a learned
  ``β_t = σ(w_β · [e(k_t); v_t] + b_β)``.
* no output layer or scale. Every write goes through
  :func:`jaxmem.kernels.assoc.associative_memory` (chunked); the queries read the final state.

A run with ``S`` symbols can be padded to ``P ≥ S`` symbols (:func:`init`): the padded rows and
embedding columns are masked, are never written or queried and get zero gradient, so runs of
different ``S`` share one shape. The streams come from
:func:`jaxmem.tasks.pairs.sample_symbol_streams`; the loss is
:func:`jaxmem.train.losses.squared_error_loss`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.kernels.assoc import associative_memory
from jaxmem.kernels.feature_maps import feature_map as get_feature_map
from jaxmem.kernels.feature_maps import normalized_features
from jaxmem.train.losses import squared_error_loss

RULES = ("hebb", "delta")


def emb_width(S: int) -> int:
  """The authors' key-embedding width for ``S`` key and ``S`` value symbols: ``⌊1.1 · 2S⌋``."""
  return int(1.1 * 2 * S)


def init(key, S: int, P: int, d: int) -> tuple[dict, jax.Array]:
  """Parameters of one run with ``S`` key symbols, padded to ``P ≥ S`` symbols, key width ``d``.

  Returns (params, embedding column mask ``[⌊2.2 P⌋]``: 1 on the run's ``⌊2.2 S⌋`` columns). Params:
  ``emb [P, De]``, ``wk_e [De, d]``, ``wk_v [P, d]``, ``bk [d]``, ``wq [De, d]``, ``bq [d]``,
  ``wb_e [De]``, ``wb_v [P]``, ``bb []`` with ``De = ⌊2.2 P⌋``. Init: ``e ~ N(0, 1)``;
  ``W_K, W_Q ~ U(±1/√d)`` (the authors' choice); ``w_β, b_β ~ U(±1/√fan_in)``; ``b_K = b_Q = 0``.
  """
  De = emb_width(P)
  ks = jax.random.split(key, 7)
  uni = lambda k, shape, a: jax.random.uniform(k, shape, minval=-a, maxval=a)
  u, ub = 1 / np.sqrt(d), 1 / np.sqrt(emb_width(S) + S)
  params = {"emb": jax.random.normal(ks[0], (P, De)),
            "wk_e": uni(ks[1], (De, d), u), "wk_v": uni(ks[2], (P, d), u), "bk": jnp.zeros(d),
            "wq": uni(ks[3], (De, d), u), "bq": jnp.zeros(d),
            "wb_e": uni(ks[4], (De,), ub), "wb_v": uni(ks[5], (P,), ub), "bb": uni(ks[6], (), ub)}
  return params, (jnp.arange(De) < emb_width(S)).astype(jnp.float32)


def readout(params: dict, colmask, ids_BL, vals_BL, active_BL, *, rule: str, feature_map: str) -> jax.Array:
  """One run: writes ``B`` streams (key ids, value ids, active ``[B, L]``) and reads every key symbol's
  query from each final state. Returns ``ŷ [B, P, P]`` (stream, queried symbol, value)."""
  p = params
  P = p["emb"].shape[0]
  E = p["emb"] * colmask[None, :]
  K = (E @ p["wk_e"])[ids_BL] + p["wk_v"][vals_BL] + p["bk"][None, None, :]
  Q = E @ p["wq"] + p["bq"][None, :]
  v = jax.nn.one_hot(vals_BL, P)
  if rule == "hebb":  # a ones channel carries z · φ(q), the linear-attention denominator
    phi = get_feature_map(feature_map)
    k, q, beta = phi(K), phi(Q), active_BL
    v = jnp.concatenate([v, jnp.ones_like(v[..., :1])], axis=-1)
  elif rule == "delta":
    k, q = normalized_features(K, feature_map, "sum"), normalized_features(Q, feature_map, "sum")
    beta = jax.nn.sigmoid((E @ p["wb_e"])[ids_BL] + p["wb_v"][vals_BL] + p["bb"]) * active_BL
  else:
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
  h = lambda x: x[:, :, None]
  _, S = associative_memory(h(k), h(k), h(v), h(beta), rule=rule, mode="chunked", chunk_size=64,
                            return_state=True)
  r_BPV = jnp.einsum("bvf,pf->bpv", S[:, 0], q)
  return r_BPV[..., :P] / (r_BPV[..., P:] + 1e-6) if rule == "hebb" else r_BPV


def loss(params: dict, colmask, ids_BL, vals_BL, active_BL, y_BPP, queried_BP, *, rule: str,
         feature_map: str) -> tuple[jax.Array, jax.Array]:
  """(mean over queried (stream, key) pairs of ``0.5‖y − ŷ‖²``, argmax accuracy) for one run; the
  arguments after ``colmask`` are one run's :func:`~jaxmem.tasks.pairs.sample_symbol_streams`."""
  yh = readout(params, colmask, ids_BL, vals_BL, active_BL, rule=rule, feature_map=feature_map)
  return squared_error_loss(yh, y_BPP, queried_BP)


__all__ = ["RULES", "emb_width", "init", "loss", "readout"]
