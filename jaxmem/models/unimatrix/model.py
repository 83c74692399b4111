"""UniMatrixLM: one shared matrix-state block applied ``depth`` times per token (Flax NNX).

The UniMatrix family of Liu Xiao (2026), "Associative-State Universal Transformers: Sparse
Retrieval Meets Structured Recurrence", arXiv:2604.25930 (``docs/papers/unimatrix.md``),
with the variants as presets of :class:`~jaxmem.models.unimatrix.config.UniMatrixConfig`.
``tokens [B, T] -> logits [B, T, vocab_size]`` (float32)::

    e_t  = E[x_t] (+ P_t)                                  token (+ learned position) embedding
    r_t  = E_rosa[src_t]                                   rosa: src = x_{t−1} ("bigram") or
                                                           ROSA's prediction ("automaton"); 0 if none
    h⁰_t = e_t ⊙ (1 + tanh(M c_t)) + r_t                   modulation + residual path; c_t = r_t
                                                           (rosa_modulation="rosa") or E[x_t] ("token")
    for n in 1..depth (one block, shared weights; lax.scan over depth):
      h ← h + s_n                                          step_embed
      h ← h + MatrixState(LN h);  [h ← h + TopKMemory(LN h)];  h ← h + FFN(LN h)
      h ← h ⊙ (1 + σ(W_p E_deep[x_t]))                     deep_embed
    [ACT: h = Σ_n w_n hⁿ with halting weights w (Graves 2016)]
    sparse slots: c_t = SlotRead(q = W_q LN h_t; keys E[x_{<t−1}], values E[x_{<t}]) (read before write)
                  h_t ← h_t + σ(W_c h_t) ⊙ W_o c_t
    logits_t = Eᵀ LN(h_t)  [+ softplus(w_π · h_t) · Σ_n w_tn onehot(id_n)]   pointer-logit fusion

**The state is reset at every depth step**: each step's mixer runs over the whole sequence
from ``S_0 = 0`` (the kernel is a pure function of its inputs), so position ``t`` at step 2
sees only step-1 outputs at positions ``≤ t``. The paper's released code carries the state
from the end of one depth step into the next, which leaks future tokens;
``tests/models/test_unimatrix.py`` checks, for every variant and option, that the logits
at ``t`` have exactly zero gradient with respect to the (one-hot) inputs after ``t`` and do
not change when those inputs change.

Where the paper leaves a detail open (the slot query, the pointer gate's range, the merge
rule), the choice is stated here and in ``jaxmem/models/unimatrix/README.md``: the slot query
is a learned projection of the final hidden state (not ``E[x_{t−1}]``, which would hand the
recall task its answer by construction), the pointer gate is ``softplus`` (unbounded, so
fused pointer logits can dominate), and merges are the slot kernel's strength-weighted means.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_rank
from jaxmem.kernels import rosa as rosa_kernel
from jaxmem.kernels import slots as slot_kernel
from jaxmem.kernels.segments import (
  check_lengths,
  check_segment_ids,
  lengths_to_segment_ids,
  previous_in_segment,
  segment_positions,
)
from jaxmem.models import bodies, mixers
from jaxmem.models.layers import FeedForward, embed, layer_norm, linear, positions, token_ids
from jaxmem.models.mixers.matrix_state import MatrixStateConfig
from jaxmem.models.mixers.topk_memory import TopKMemoryConfig
from jaxmem.models.remat import policy as remat_policy
from jaxmem.models.unimatrix.config import UniMatrixConfig
from jaxmem.sharding import param

EMBED2 = ("embed", "embed")  # a d_model × d_model matrix (replicated)


def matrix_state_config(cfg: UniMatrixConfig) -> MatrixStateConfig:
  """The mixer config of ``cfg``'s block."""
  return MatrixStateConfig(state_dim=cfg.state_dim, updates=cfg.updates, spectral_norm=cfg.spectral_norm,
                           retention=cfg.retention, mode=cfg.mode, chunk_size=cfg.chunk_size,
                           precision=cfg.precision)


class UniMatrixBlock(nnx.Module):
  """The shared block: ``h + MatrixState(LN h)`` [``+ TopKMemory(LN h)``], then ``+ FFN(LN h)``."""

  def __init__(self, cfg: UniMatrixConfig, *, rngs: nnx.Rngs):
    d = cfg.d_model
    self.ln1 = layer_norm(d, rngs=rngs)
    self.mixer = mixers.build(matrix_state_config(cfg), d_model=d, n_heads=cfg.n_heads,
                              n_layers=cfg.depth, dtype="float32", rngs=rngs)
    if cfg.dense_memory:
      self.ln_m = nnx.data(layer_norm(d, rngs=rngs))
      memory = TopKMemoryConfig(top_k=cfg.dense_top_k)
      self.memory = nnx.data(mixers.build(memory, d_model=d, n_heads=cfg.n_heads, n_layers=cfg.depth,
                                          dtype="float32", rngs=rngs))
    else:
      self.ln_m, self.memory = nnx.data(None), nnx.data(None)
    self.ln2 = layer_norm(d, rngs=rngs)
    self.ffn = FeedForward(d, cfg.ffn_dim, n_layers=cfg.depth, rngs=rngs)
    self.drop = nnx.data(nnx.Dropout(cfg.dropout) if cfg.dropout else None)

  def __call__(self, h, initial_state=None, return_state: bool = False, key=None, segment_ids=None):
    """``key``: this step's dropout key (None: no dropout; see :class:`UniMatrixLM`); ``segment_ids [B, T]``:
    packed rows, passed to the matrix state and the dense memory."""
    h, S_T, _ = self._apply(h, initial_state, None, key, segment_ids=segment_ids)
    return (h, S_T) if return_state else h

  def init_state(self, batch_size: int, max_len: int) -> dict:
    """One application's decoding state: ``{"matrix": S_0 [B, H, S, S], "memory": the dense memory's KV
    cache (dense_memory) or None}``."""
    memory = None if self.memory is None else self.memory.init_state(batch_size, max_len)
    return {"matrix": self.mixer.init_state(batch_size, max_len), "memory": memory}

  def scan(self, state: dict, h, lengths=None) -> tuple:
    """The block on ``h [B, T, d_model]`` continuing from ``state`` (no dropout): ``(state, h)``; ``lengths
    [B]``: right-padded rows (:meth:`jaxmem.models.mixers.registry.Mixer.scan`)."""
    h, S_T, memory = self._apply(h, state["matrix"], state["memory"], None, decoding=True, lengths=lengths)
    return {"matrix": S_T, "memory": memory}, h

  def _apply(self, h, S_0, memory, key, decoding: bool = False, segment_ids=None, lengths=None):
    """The residual branches; the dense memory over the whole sequence, or from its cache when decoding."""
    S_T, y = self.mixer.scan(S_0, self.ln1(h), segment_ids, lengths=lengths)
    h = h + _dropout(self.drop, y, key, 0)
    if self.memory is not None:
      if decoding:
        memory, y = self.memory.scan(memory, self.ln_m(h), lengths)
      else:
        y = self.memory(self.ln_m(h), segment_ids)
      h = h + _dropout(self.drop, y, key, 1)
    h = h + _dropout(self.drop, self.ffn(self.ln2(h)), key, 2)
    return h, S_T, memory


def _dropout(drop, x, key, site: int):
  """``drop(x)`` with the key ``fold_in(key, site)``; ``x`` when there is no dropout or no key (eval)."""
  if drop is None or key is None:
    return x
  return drop(x, rngs=jax.random.fold_in(key, site))


def _take(table, ids_BT):
  """``table[ids]`` with ``ids < 0`` giving the zero vector."""
  rows = jnp.take(table, jnp.maximum(ids_BT, 0), axis=0)
  return jnp.where((ids_BT >= 0)[..., None], rows, 0.0)


def _select(onehot_BTV, table_VD):
  """``onehot @ table`` at full float32 precision (a row lookup must not pass through bf16 / TF32)."""
  return jnp.matmul(onehot_BTV, table_VD, precision=jax.lax.Precision.HIGHEST)


class _Inputs:
  """Token ids or one-hot rows behind one lookup: ``rows(table)``, ``prev_rows(table)``, ``ids``, and the
  packed rows' ``segment_ids`` (None: one sequence per row).

  One-hot inputs (``[B, T, V]`` floats) make every embedding a matmul, so tests can take
  gradients with respect to the inputs; the ids (their argmax) drive the discrete parts
  (ROSA, slot ids, pointer targets). With ``segment_ids`` "the previous token" is the previous non-padding
  token of the same segment (none at a segment's first token).
  """

  def __init__(self, x, segment_ids=None):
    self.onehot = x if jnp.issubdtype(x.dtype, jnp.floating) else None
    self.ids = jnp.argmax(x, axis=-1).astype(jnp.int32) if self.onehot is not None else x.astype(jnp.int32)
    self.segment_ids = segment_ids
    self.prev = None if segment_ids is None else previous_in_segment(segment_ids, 1)  # (index, exists)

  def rows(self, table):
    return _take(table, self.ids) if self.onehot is None else _select(self.onehot, table)

  def prev_ids(self):
    """``x_{t−1}`` ``[B, T]``, −1 where there is none."""
    if self.prev is None:
      return jnp.pad(self.ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    src, ok = self.prev
    return jnp.where(ok, jnp.take_along_axis(self.ids, src, axis=1), -1)

  def prev_rows(self, table):
    """``table[x_{t−1}]``, the zero vector where there is no previous token."""
    if self.onehot is None:
      return _take(table, self.prev_ids())
    if self.prev is None:
      return _select(jnp.pad(self.onehot[:, :-1], ((0, 0), (1, 0), (0, 0))), table)
    src, ok = self.prev
    rows = jnp.take_along_axis(self.onehot, src[..., None], axis=1)
    return _select(jnp.where(ok[..., None], rows, 0.0), table)


class UniMatrixLM(nnx.Module):
  """The UniMatrix language model (equations in the module docstring).

  ``UniMatrixLM(cfg, rngs=nnx.Rngs(0))(tokens [B, T]) -> logits [B, T, vocab_size]``;
  ``model(tokens, return_aux=True)`` also returns ``{"ponder": [B, T]}`` (ACT's ``N + R``, else
  ``depth``) and, with a slot write gate, ``"slot_write_gate": [B, T]`` (each token's ``g_t``).
  :meth:`apply_onehot` takes one-hot rows ``[B, T, vocab_size]`` instead of ids. With
  ``cfg.dropout > 0`` every call in train mode (the default) draws new masks from the model's
  dropout stream; ``model.eval()`` makes calls deterministic.

  Decoding (``jaxmem.generate``): :meth:`init_state`, :meth:`scan` (a piece of every row) and :meth:`step`
  (one token per row) give the logits of :meth:`__call__` on the whole sequence (eval mode). The state holds,
  per row, the position and the last token (``x_{t−1}`` of the bigram ROSA and of the slot keys), the ROSA
  stream (``rosa="automaton"``), the slot memory, and per depth step (stacked on a leading ``depth`` axis,
  scanned with the depth steps) the matrix state and the dense memory's KV cache. ACT decodes as it runs:
  every depth step advances every position whatever its halting, which only weights the outputs.
  ``carry_state=True`` cannot decode (:meth:`_check_decodes`).
  """

  def __init__(self, cfg: UniMatrixConfig, *, rngs: nnx.Rngs):
    if not isinstance(cfg, UniMatrixConfig):
      raise ValueError(f"`cfg` must be a UniMatrixConfig, got {type(cfg).__name__}.")
    self.cfg = cfg
    V, d = cfg.vocab_size, cfg.d_model
    emb_init = nnx.initializers.normal(0.02)
    self.embed = embed(V, d, embedding_init=emb_init, rngs=rngs)
    self.pos = nnx.data(positions(cfg.max_len, d, std=0.01, rngs=rngs)
                        if cfg.positions == "learned" else None)
    none = nnx.data(None)
    self.rosa_embed, self.rosa_mod = none, none
    if cfg.rosa != "none":
      self.rosa_embed = nnx.data(embed(V, d, embedding_init=emb_init, rngs=rngs))
      self.rosa_mod = nnx.data(linear(d, d, EMBED2, kernel_init=nnx.initializers.zeros, rngs=rngs))
    self.step_embed = nnx.data(param(jnp.zeros((cfg.depth, d), jnp.float32), ("layers", "embed"))
                               if cfg.step_embed else None)
    self.deep_embed, self.deep_proj = none, none
    if cfg.deep_embed:
      self.deep_embed = nnx.data(embed(V, d, embedding_init=emb_init, rngs=rngs))
      self.deep_proj = nnx.data(linear(d, d, EMBED2, rngs=rngs))
    self.block = UniMatrixBlock(cfg, rngs=rngs)
    # ACT halting unit; bias 1 (Graves 2016, §3: a positive bias makes early halting the default)
    self.halt = nnx.data(linear(d, 1, ("embed", None), bias_init=nnx.initializers.constant(1.0), rngs=rngs)
                         if cfg.act
                         else None)
    self.slot_norm, self.slot_query, self.slot_out, self.slot_gate = none, none, none, none
    self.write_gate, self.pointer_gate = none, none
    if cfg.n_slots:
      self.slot_norm = nnx.data(layer_norm(d, rngs=rngs))
      self.slot_query = nnx.data(linear(d, d, EMBED2, rngs=rngs) if cfg.slot_query == "hidden" else None)
      self.slot_out = nnx.data(linear(d, d, EMBED2, rngs=rngs))
      self.slot_gate = nnx.data(linear(d, d, EMBED2, rngs=rngs))
      if cfg.write_gate:  # starts open: σ(3) ≈ 0.95
        self.write_gate = nnx.data(linear(d, 1, ("embed", None), kernel_init=nnx.initializers.zeros,
                                          bias_init=nnx.initializers.constant(3.0), rngs=rngs))
      if cfg.pointer:
        self.pointer_gate = nnx.data(linear(d, 1, ("embed", None), bias_init=nnx.initializers.constant(1.0),
                                            rngs=rngs))
    self.ln_f = layer_norm(d, rngs=rngs)
    self.head = nnx.data(None if cfg.tie_embeddings
                         else linear(d, V, ("embed", "vocab"), use_bias=False, rngs=rngs))
    # dropout (cfg.dropout > 0): one key per call from this stream, split over depth steps and sites.
    # Forked last, so that the parameters are those of the same config without dropout.
    self.drop = nnx.data(nnx.Dropout(cfg.dropout) if cfg.dropout else None)
    self.dropout_rng = nnx.data(rngs.dropout.fork() if cfg.dropout else None)

  # ------------------------------------------------------------------------------------
  def _check_length(self, T: int):
    if T == 0:
      raise ValueError("`tokens` must have at least one position, got length 0.")
    if T > self.cfg.max_len:
      raise ValueError(f"`tokens` has length {T} > max_len={self.cfg.max_len}.")

  def __call__(self, tokens_BT: jax.Array, segment_ids=None, *, return_aux: bool = False):
    """``logits [B, T, vocab_size]``; ``segment_ids [B, T]`` (integers): packed rows, several documents per
    row (:mod:`jaxmem.kernels.segments`): each document's logits are those of the model on that document
    alone (positions, ROSA, the previous token, the matrix states, the dense and the slot memory restart at
    every document; padding, id 0, is skipped)."""
    B, T = check_rank("tokens", tokens_BT, 2, "B, T")
    tokens_BT = token_ids(tokens_BT, self.cfg.vocab_size)
    self._check_length(T)
    return self._forward(_Inputs(tokens_BT, self._segments(segment_ids, B, T)), return_aux)

  def apply_onehot(self, onehot_BTV: jax.Array, segment_ids=None, *, return_aux: bool = False):
    """The forward pass on one-hot rows ``[B, T, vocab_size]`` (differentiable in them)."""
    B, T, V = check_rank("onehot", onehot_BTV, 3, "B, T, vocab_size")
    if V != self.cfg.vocab_size:
      raise ValueError(f"`onehot` has {V} columns, vocab_size={self.cfg.vocab_size}.")
    if not jnp.issubdtype(onehot_BTV.dtype, jnp.floating):
      raise ValueError(f"`onehot` must be floating point, got dtype {onehot_BTV.dtype}.")
    self._check_length(T)
    return self._forward(_Inputs(onehot_BTV, self._segments(segment_ids, B, T)), return_aux)

  def _segments(self, segment_ids, B: int, T: int):
    if segment_ids is None:
      return None
    if self.cfg.carry_state:
      raise ValueError("UniMatrixConfig.carry_state=True cannot take `segment_ids`: it carries the matrix "
                       "state left after the last token of a row into the next depth step, across every "
                       "document.")
    return check_segment_ids(segment_ids, B, T)

  # ------------------------------------------------------------------------------------
  # ------------------------------------------------------------------------------------
  def _check_decodes(self) -> None:
    """Raises ``ValueError`` for a configuration that cannot decode token by token."""
    if self.cfg.carry_state:
      raise ValueError("UniMatrixConfig.carry_state=True cannot decode: it carries the matrix state left after "
                       "the last token of a depth step into the next step, so every position reads future "
                       "tokens by design (the paper's released-code leak, for study only).")

  def init_state(self, batch_size: int, max_len: int) -> dict:
    """The decoding state before the first token, for sequences of up to ``max_len`` tokens: ``{"pos": [B]
    int32 (tokens read per row), "prev": [B] int32 (the last token, -1 before the first), "depth": each depth
    step's block state (:meth:`UniMatrixBlock.init_state`, stacked on a leading ``depth`` axis), "rosa": the
    ROSA stream of capacity ``max_len`` (``rosa="automaton"``) or None, "slots": the slot memory or None}``."""
    self._check_decodes()
    cfg = self.cfg
    for name, value in (("batch_size", batch_size), ("max_len", max_len)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
    if cfg.positions == "learned" and max_len > cfg.max_len:
      raise ValueError(f"`max_len`={max_len} exceeds the {cfg.max_len} learned positions of this model "
                       f"(UniMatrixConfig.max_len).")
    block = self.block.init_state(batch_size, max_len)
    B = batch_size
    return {"pos": jnp.zeros((B,), jnp.int32), "prev": jnp.full((B,), -1, jnp.int32),
            "depth": jax.tree.map(lambda x: jnp.broadcast_to(x, (cfg.depth,) + x.shape), block),
            "rosa": rosa_kernel.rosa_init(B, max_len) if cfg.rosa == "automaton" else None,
            "slots": slot_kernel.init(B, cfg.n_slots, cfg.d_model, cfg.d_model) if cfg.n_slots else None}

  def scan(self, state: dict, tokens_BT: jax.Array, lengths=None) -> tuple:
    """``T`` more tokens of every row from ``state``: ``(state, logits [B, T, vocab_size] float32)``, equal to
    the corresponding positions of :meth:`__call__` (eval mode) on the whole sequence; each row continues at
    its own position. Never applies dropout. Learned positions past ``max_len`` cannot be checked under
    ``jit``: they are clamped to the last one, so check lengths first (``jaxmem.generate`` does).

    ``lengths [B]`` (integers in ``[0, T]``; None: all ``T``): right-padded rows, prompts of different lengths
    in one call: row ``b`` reads its first ``lengths[b]`` tokens, and the state returned for it (position, last
    token, ROSA stream, every depth step's states, slot memory) is the one after them; the logits at its
    padding are unspecified."""
    B, T = check_rank("tokens", tokens_BT, 2, "B, T")
    tokens_BT = token_ids(tokens_BT, self.cfg.vocab_size).astype(jnp.int32)
    if lengths is not None:
      lengths = check_lengths(lengths, B, T)
    # with lengths, the slot memory reads the rows as segment ids (padding: no write, no ageing); every other
    # part reads the state's previous token and positions, never the ids' segments
    inp = _Inputs(tokens_BT, None if lengths is None else lengths_to_segment_ids(lengths, T))
    h, rosa = self._embed(inp, state, lengths)
    h, _, depth = self._depth(h, inp, None, state["depth"], lengths)
    pointer, slots = None, state["slots"]
    if self.slot_norm is not None:
      h, pointer, _, slots = self._slots(h, inp, None, state)
    if lengths is None:
      read, prev = T, tokens_BT[:, -1]
    else:
      last = jnp.take_along_axis(tokens_BT, jnp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
      read, prev = lengths, jnp.where(lengths > 0, last, state["prev"])
    new = {"pos": state["pos"] + read, "prev": prev, "depth": depth, "rosa": rosa, "slots": slots}
    return new, self._logits(h, pointer)

  def step(self, state: dict, tokens_B: jax.Array) -> tuple:
    """One token per row: ``(state, tokens [B]) -> (state, logits [B, vocab_size])``."""
    state, logits = self.scan(state, tokens_B[:, None])
    return state, logits[:, 0]

  # ------------------------------------------------------------------------------------
  def _prev_ids(self, inp: _Inputs, state: dict):
    """``x_{t−1}`` of each token of a piece, the row's last token before it from ``state`` (-1: none)."""
    return jnp.concatenate([state["prev"][:, None], inp.ids[:, :-1]], axis=1)

  def _embed(self, inp: _Inputs, state=None, lengths=None):
    """``h⁰`` and the ROSA stream's new state (None unless decoding with ``rosa="automaton"``); ``state``:
    the decoding state the tokens continue from (None: the whole sequence from its start); ``lengths``: its
    right-padded rows (the ROSA stream reads each row's own tokens only)."""
    cfg = self.cfg
    T = inp.ids.shape[1]
    h = e = inp.rows(self.embed.embedding[...])
    if self.pos is not None:
      if state is None and inp.segment_ids is not None:  # packed rows: positions restart per document
        h = h + jnp.take(self.pos[...], segment_positions(inp.segment_ids), axis=0)
      elif state is None:
        h = h + self.pos[...][None, :T]
      else:
        pos_BT = state["pos"][:, None] + jnp.arange(T, dtype=jnp.int32)[None]
        h = h + jnp.take(self.pos[...], jnp.minimum(pos_BT, cfg.max_len - 1), axis=0)
    rosa = None
    if self.rosa_embed is not None:
      table = self.rosa_embed.embedding[...]
      if cfg.rosa == "bigram":  # the paper's released code: E_rosa[x_{t−1}]
        r = inp.prev_rows(table) if state is None else _take(table, self._prev_ids(inp, state))
      else:  # the token that followed the longest earlier match; -1 (none) gives 0
        ids = jax.lax.stop_gradient(inp.ids)
        if state is None:
          src = rosa_kernel.rosa(ids, segment_ids=inp.segment_ids)
        else:
          rosa, src = rosa_kernel.rosa_scan(state["rosa"], ids, lengths=lengths)
        r = _take(table, src)
      # the modulation's condition: the ROSA row, or the current token's own embedding (no position)
      c = r if cfg.rosa_modulation == "rosa" else e
      h = h * (1.0 + jnp.tanh(self.rosa_mod(c))) + r
    return h, rosa

  def _depth(self, h, inp: _Inputs, key=None, states=None, lengths=None):
    """The shared block applied ``depth`` times (a ``lax.scan`` over depth steps; ACT when configured):
    ``(h, ponder, states)``. ``states``: each depth step's block state stacked on axis 0 (decoding; scanned
    with the steps and returned updated), or None (the whole sequence from zero states; None returned);
    ``lengths``: the decoded rows' lengths (right padding)."""
    cfg = self.cfg
    graphdef, params = nnx.split(self.block)
    steps = self.step_embed[...] if self.step_embed is not None else jnp.zeros((cfg.depth, cfg.d_model))
    # (step embedding, dropout key, block state) per depth step; no keys without dropout
    xs = (steps, None if key is None else jax.random.split(key, cfg.depth), states)
    deep = None
    if self.deep_embed is not None:
      deep = 1.0 + jax.nn.sigmoid(self.deep_proj(inp.rows(self.deep_embed.embedding[...])))

    def step(h, x):
      s_D, k, st = x
      block = nnx.merge(graphdef, params)
      if st is None:
        h = block(h + s_D[None, None], key=k, segment_ids=inp.segment_ids)
      else:
        st, h = block.scan(st, h + s_D[None, None], lengths)
      return (h * deep if deep is not None else h), st

    if cfg.carry_state:  # the paper's leak (UniMatrixConfig.carry_state): S_T of step n starts step n + 1
      def leaky(carry, x):
        (h, S), (s_D, k, _) = carry, x
        h, S = nnx.merge(graphdef, params)(h + s_D[None, None], initial_state=S, return_state=True, key=k)
        return (h * deep if deep is not None else h, S), None
      B = h.shape[0]
      S0 = jnp.zeros((B, cfg.n_heads, cfg.state_dim, cfg.state_dim), jnp.float32)
      (h, _), _ = jax.lax.scan(leaky, (h, S0), xs)
      return h, jnp.full(h.shape[:2], float(cfg.depth)), None
    if cfg.remat:
      step = jax.checkpoint(step, policy=remat_policy(cfg.remat_policy))
    if self.halt is None:
      h, states = jax.lax.scan(step, h, xs)
      return h, jnp.full(h.shape[:2], float(cfg.depth)), states
    return self._act(step, h, xs)

  def _act(self, step, h, xs):
    """Adaptive Computation Time over depth (Graves 2016, eqs. 6–14; the UT's per-position halting).

    At step ``n`` every position computes ``hⁿ`` (halted positions too: the block mixes over
    all of them) and ``pⁿ = σ(w · hⁿ + b)``; a running position halts at the first ``N`` with
    ``Σ_{n≤N} pⁿ ≥ act_threshold`` (or at the last step) and gets weights ``pⁿ`` for ``n < N``
    and the remainder ``R = 1 − Σ_{n<N} pⁿ`` at ``N``; the output is ``Σ_n wⁿ hⁿ`` and the
    ponder cost ``N + R``. Every depth step's state thus advances at every position whatever its
    halting, so decoding runs the same steps (``step`` returns each one's new state).
    """
    cfg = self.cfg
    depth = cfg.depth
    BT = h.shape[:2]

    def body(carry, x):
      h, out, cum, running, ponder = carry
      step_x, n = x
      h, st = step(h, step_x)
      p = jax.nn.sigmoid(self.halt(h)[..., 0].astype(jnp.float32))
      last = n == depth - 1
      halts = running & ((cum + p >= cfg.act_threshold) | last)
      remainder = 1.0 - cum
      w = jnp.where(halts, remainder, jnp.where(running, p, 0.0))
      out = out + w[..., None] * h
      ponder = ponder + jnp.where(running, 1.0, 0.0) + jnp.where(halts, remainder, 0.0)
      cum = jnp.where(running & ~halts, cum + p, cum)
      return (h, out, cum, running & ~halts, ponder), st

    init = (h, jnp.zeros_like(h), jnp.zeros(BT), jnp.ones(BT, bool), jnp.zeros(BT))
    (_, out, _, _, ponder), states = jax.lax.scan(body, init, (xs, jnp.arange(depth)))
    return out, ponder, states

  def _merge_ids(self, inp: _Inputs, state=None):
    """The key token ``x_{t−1}`` of each write (``vocab_size`` at ``t = 0``, no previous token)."""
    prev = inp.prev_ids() if state is None else self._prev_ids(inp, state)
    return jnp.where(prev < 0, self.cfg.vocab_size, jax.lax.stop_gradient(prev))

  def _slots(self, h, inp: _Inputs, key=None, state=None):
    """The sparse slot memory over the final states: context under a gate, pointer logits, the write gate
    and the slot memory after the last token; ``state``: the decoding state (None: from an empty memory)."""
    cfg = self.cfg
    table = self.embed.embedding[...]
    z = self.slot_norm(h)
    gate = None if self.write_gate is None else jax.nn.sigmoid(self.write_gate(z)[..., 0])
    if gate is not None and cfg.slot_write_threshold:  # the kernel writes nothing where the gate is 0
      gate = jnp.where(gate > cfg.slot_write_threshold, gate, 0.0)
    keys = inp.prev_rows(table) if state is None else _take(table, self._prev_ids(inp, state))
    query = self.slot_query(z) if cfg.slot_query == "hidden" else keys
    read, slots = slot_kernel.slot_memory(
        query, keys, inp.rows(table), inp.ids, n_slots=cfg.n_slots,
        top_k=cfg.slot_top_k, threshold=cfg.slot_threshold, temperature=cfg.slot_temperature,
        write_gate_BT=gate, vocab_size=cfg.vocab_size if cfg.pointer else None, cos_scale=cfg.slot_cos_scale,
        strength_update=cfg.slot_strength,
        merge_ids_BT=self._merge_ids(inp, state) if cfg.slot_merge == "key_id" else None,
        initial_state=None if state is None else state["slots"], return_state=True,
        segment_ids=inp.segment_ids)
    h = h + jax.nn.sigmoid(self.slot_gate(z)) * _dropout(self.drop, self.slot_out(read.context), key, 0)
    pointer = None
    if self.pointer_gate is not None:
      pointer = jax.nn.softplus(self.pointer_gate(z)) * read.pointer
    return h, pointer, gate, slots

  def _logits(self, h, pointer):
    """``Eᵀ LN(h)`` (or the head) plus the fused pointer logits, float32."""
    z = self.ln_f(h)
    logits = (self.embed.attend(z) if self.head is None else self.head(z)).astype(jnp.float32)
    if pointer is not None:
      logits = logits + pointer.astype(jnp.float32)
    return logits

  def _forward(self, inp: _Inputs, return_aux: bool):
    key = None   # train mode with dropout: one key per call -> embedding, depth steps, slot context
    if self.drop is not None and not self.drop.deterministic:
      key = self.dropout_rng()
    keys = (None,) * 3 if key is None else tuple(jax.random.split(key, 3))
    h = _dropout(self.drop, self._embed(inp)[0], keys[0], 0)
    h, ponder, _ = self._depth(h, inp, keys[1])
    pointer, aux = None, {"ponder": ponder}
    if self.slot_norm is not None:
      h, pointer, gate, _ = self._slots(h, inp, keys[2])
      if gate is not None:
        aux["slot_write_gate"] = gate
    logits = self._logits(h, pointer)
    return (logits, aux) if return_aux else logits


def param_breakdown(model: nnx.Module) -> dict:
  """Parameter count per top-level attribute (``embed``, ``block``, ``rosa_embed``, ...)."""
  out: dict = {}
  for path, x in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
    key = getattr(path[0], "key", str(path[0]))
    out[str(key)] = out.get(str(key), 0) + int(x.size)
  return out


__all__ = ["UniMatrixBlock", "UniMatrixLM", "matrix_state_config",
           "param_breakdown"]


bodies.register("unimatrix", UniMatrixConfig, UniMatrixLM)
