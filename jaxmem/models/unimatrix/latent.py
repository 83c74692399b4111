"""The paper's latent models for the three-token benchmark (Liu Xiao 2026, ``docs/papers/unimatrix.md``).

* :class:`TypedLatentCompressor` — **benchmark-aware** (an upper bound, as the paper says):
  it is told which ids are tags, role markers (``A, B, C``), digits, task tokens, the query
  marker and the answer classes, and keeps one typed latent ``Z[tag, role] ∈ R^L`` per
  (tag, role): at a digit ``x_t`` right after role marker ``r`` inside the record of tag
  ``g`` (the most recent tag token), ``Z[g, r] += E_digit[x_t]``. At ``QUERY g`` it reads
  ``[Z[g, A]; Z[g, B]; Z[g, C]]`` and applies the MLP head of the current task (the most
  recent task token), giving logits at the 16 class ids (−1e9 elsewhere). Causal: every
  quantity at ``t`` is a cumulative sum / running maximum over positions ``≤ t``.
* :func:`triple_latent` — the **generic** version on raw ids: each position's latent is a
  learned function of its triple ``(x_{t−2}, x_{t−1}, x_t)``,
  ``z_t = e_t + GELU(W [e_{t−2}; e_{t−1}; e_t])``, followed by ``n_layers`` blocks of
  matrix-state memory and FFN and a tied read-out: no knowledge of the task's structure. It is a
  configuration of the one body (:class:`~jaxmem.models.TransformerConfig` with ``ngram_inputs=3``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_config_ints, check_rank
from jaxmem.models.layers import token_ids
from jaxmem.models.mixers.matrix_state import MatrixStateConfig
from jaxmem.models.transformer import TransformerConfig
from jaxmem.sharding import param

# the typed latents and per-task heads are trained without weight decay (decay=False), as they always were


def _index_table(vocab_size: int, ids: tuple) -> jax.Array:
  """``[vocab_size]`` int32: position of each id in ``ids``, −1 for ids not in it."""
  table = jnp.full((vocab_size,), -1, jnp.int32)
  return table.at[jnp.asarray(ids, jnp.int32)].set(jnp.arange(len(ids), dtype=jnp.int32))


def _last_index(idx_BT: jax.Array) -> jax.Array:
  """At each ``t``, the index (≥ 0) of the most recent position ``≤ t`` with ``idx ≥ 0`` (−1: none)."""
  T = idx_BT.shape[1]
  pos = jnp.where(idx_BT >= 0, jnp.arange(T)[None, :], -1)
  last = jax.lax.cummax(pos, axis=1)
  return jnp.where(last >= 0, jnp.take_along_axis(idx_BT, jnp.maximum(last, 0), axis=1), -1)


@dataclasses.dataclass(frozen=True)
class TypedLatentConfig:
  """Token-id roles of the benchmark (``jaxmem.tasks.unimatrix``'s three-token vocabulary) and sizes."""

  vocab_size: int
  tag_ids: tuple
  role_ids: tuple
  digit_ids: tuple
  task_ids: tuple
  query_id: int
  class_ids: tuple
  latent_dim: int = 16
  hidden: int = 64

  def __post_init__(self):
    check_config_ints(self, ("vocab_size", "latent_dim", "hidden"))
    for name in ("tag_ids", "role_ids", "digit_ids", "task_ids", "class_ids"):
      ids = tuple(getattr(self, name))
      object.__setattr__(self, name, ids)
      if not ids or any(not isinstance(i, int) or not 0 <= i < self.vocab_size for i in ids):
        raise ValueError(f"TypedLatentConfig.{name} must be a non-empty tuple of ids in "
                         f"[0, {self.vocab_size}), "
                         f"got {ids!r}.")
    if len(self.role_ids) != 3:
      raise ValueError(f"TypedLatentConfig.role_ids must hold the 3 role markers (A, B, C), "
                       f"got {self.role_ids!r}.")


class TypedLatentCompressor(nnx.Module):
  """Typed (tag, role) latents and per-task heads (module docstring); ``tokens [B, T] -> logits [B, T, V]``."""

  def __init__(self, cfg: TypedLatentConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    L, Hd, n_tasks, n_cls = cfg.latent_dim, cfg.hidden, len(cfg.task_ids), len(cfg.class_ids)
    digits = nnx.initializers.normal(1.0)(rngs.params(), (len(cfg.digit_ids), L))
    self.digit_embed = param(digits, (None, None), decay=False)
    init = nnx.initializers.lecun_normal()
    per_task = lambda shape: jax.vmap(lambda k: init(k, shape))(jax.random.split(rngs.params(), n_tasks))
    self.w1 = param(per_task((3 * L, Hd)), (None, None, None), decay=False)
    self.b1 = param(jnp.zeros((n_tasks, Hd)), (None, None), decay=False)
    self.w2 = param(per_task((Hd, n_cls)), (None, None, None), decay=False)
    self.b2 = param(jnp.zeros((n_tasks, n_cls)), (None, None), decay=False)

  def __call__(self, tokens_BT: jax.Array) -> jax.Array:
    cfg = self.cfg
    B, T = check_rank("tokens", tokens_BT, 2, "B, T")
    V = cfg.vocab_size
    x = token_ids(tokens_BT, cfg.vocab_size).astype(jnp.int32)
    prev = jnp.pad(x[:, :-1], ((0, 0), (1, 0)), constant_values=0)
    tag = _index_table(V, cfg.tag_ids)[x]
    cur_tag = _last_index(tag)                                  # the record being read
    role = _index_table(V, cfg.role_ids)[prev]                  # digit after A / B / C
    digit = _index_table(V, cfg.digit_ids)[x]
    task = _last_index(_index_table(V, cfg.task_ids)[x])
    write = (digit >= 0) & (role >= 0) & (cur_tag >= 0)
    n_tags = len(cfg.tag_ids)
    slot = jnp.where(write, cur_tag * 3 + role, -1)             # (tag, role) flattened
    e = jnp.where(write[..., None], self.digit_embed[...][jnp.maximum(digit, 0)], 0.0)  # [B, T, L]
    onehot = jax.nn.one_hot(slot, 3 * n_tags)                   # −1 -> zeros
    Z = jnp.cumsum(onehot[..., None] * e[:, :, None, :], axis=1)  # [B, T, 3·n_tags, L]
    Z = Z.reshape(B, T, n_tags, 3 * cfg.latent_dim)
    is_query = (prev == cfg.query_id) & (tag >= 0)
    z = jnp.take_along_axis(Z, jnp.maximum(tag, 0)[:, :, None, None], axis=2)[:, :, 0]  # [B, T, 3L]
    t_idx = jnp.maximum(task, 0)
    hid = jax.nn.relu(jnp.einsum("btl,btlh->bth", z, self.w1[...][t_idx]) + self.b1[...][t_idx])
    cls = jnp.einsum("bth,bthc->btc", hid, self.w2[...][t_idx]) + self.b2[...][t_idx]
    cls = jnp.where((is_query & (task >= 0))[..., None], cls, 0.0)
    # ids that are not classes get −1e9: the argmax and the softmax are over the 16 classes only
    logits = jnp.full((B, T, V), -1e9, jnp.float32)
    return logits.at[:, :, jnp.asarray(cfg.class_ids)].set(cls.astype(jnp.float32))


def triple_latent(*, vocab_size: int = 259, d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                  state_dim: int = 16, max_len: int = 128) -> TransformerConfig:
  """The generic triple-latent model (module docstring) as a configuration of the one body: build it with
  ``TransformerLM(triple_latent(...), rngs=...)``. Token embedding plus ``GELU(W [e_{t−2}; e_{t−1}; e_t])``
  (``ngram_inputs=3``), no positions, ``n_layers`` pre-LN blocks of a matrix-state memory (``state_dim``;
  float32) and a GELU MLP of width ``4 · d_model``, tied read-out. Bad values raise ``ValueError`` from the
  configs."""
  return TransformerConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                           d_ff=4 * d_model, max_len=max_len, positions="none", ngram_inputs=3,
                           mixer=MatrixStateConfig(state_dim=state_dim))


def triple_latent_params_from_legacy(params: dict) -> dict:
  """Parameters saved by the former ``TripleLatentLM`` module (a nested dict, e.g. restored with Orbax without
  a target) as :func:`triple_latent`'s: ``triple`` is ``ngram``, ``blocks/mixer`` is ``blocks/attn`` and
  ``blocks/{up,down}`` are ``blocks/ffn/{up,down}``; every other path and every value is unchanged. (Models
  initialised by the two differ in ``W_2`` of the MLP only: the body scales it by ``1/√(2·n_layers)``.)"""
  if not isinstance(params, dict) or "triple" not in params or not isinstance(params.get("blocks"), dict) \
      or "mixer" not in params["blocks"]:
    raise ValueError("`params` must be a nested dict with 'triple' and 'blocks/mixer' (a TripleLatentLM's).")
  blocks = dict(params["blocks"])
  attn, up, down = blocks.pop("mixer"), blocks.pop("up"), blocks.pop("down")
  out = {k: v for k, v in params.items() if k not in ("triple", "blocks")}
  return {**out, "ngram": params["triple"], "blocks": {**blocks, "attn": attn, "ffn": {"up": up, "down": down}}}
