"""The baseline: a decoder-only byte-level Transformer language model (Flax NNX).

Pre-LN blocks (Xiong et al. 2020), GELU feed-forward, learned absolute positions and
optionally tied input/output embeddings (Press & Wolf 2017). The token mixer of each
block — softmax attention by default, or any memory registered in
:mod:`jaxmem.models.mixers`, per layer if wanted — is a module whose arithmetic lives in
:mod:`jaxmem.kernels`. The layers are stacked with ``nnx.vmap`` and applied with
``nnx.scan``, so depth is one compiled loop body, not a Python loop, and ``remat=True``
wraps each block in ``jax.checkpoint``.

Every paper model in jaxmem is compared with this one.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Union

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_config_ints, check_rank
from jaxmem.kernels.segments import check_lengths, check_segment_ids, previous_in_segment, segment_positions
from jaxmem.models import bodies, mixers
from jaxmem.models.bodies import BodyConfig
from jaxmem.models.layers import FeedForward, embed, layer_norm, linear, positions, token_ids
from jaxmem.models.mixers import MixerConfig, SoftmaxConfig
from jaxmem.models.remat import check_remat_policy
from jaxmem.models.remat import policy as remat_policy

MixerSpec = Union[MixerConfig, tuple]


@dataclasses.dataclass(frozen=True)
class TransformerConfig(BodyConfig):
  """Architecture of :class:`TransformerLM`: body fields plus the token mixer.

  Attributes:
    body: "transformer", the tag of this body in an LM config's ``model`` section (:mod:`jaxmem.models.bodies`;
      not an argument).
    vocab_size: number of token ids (256 for bytes).
    d_model: residual width.
    n_layers: number of blocks.
    n_heads: heads of the mixer; must divide ``d_model``.
    d_ff: hidden width of the MLP feed-forward layer (``ffn="mlp"``).
    max_len: longest sequence the learned positions cover.
    tie_embeddings: read logits with the transposed input embedding.
    remat: recompute each block in the backward pass (``jax.checkpoint``).
    remat_policy: what ``remat`` may keep: "full" (only each block's input) or "dots" (also the
      projections' outputs); :mod:`jaxmem.models.remat`.
    dtype: compute dtype of activations ("float32" or "bfloat16"); parameters stay
      float32 and the loss is computed in float32.
    mixer: the token mixer of every block — a config registered in
      :mod:`jaxmem.models.mixers` (``SoftmaxConfig()``, ``SDNCConfig()``,
      ``SDNCHybridConfig(erase=True)``, ``AssocConfig(rule="delta")``, ...) — or a tuple of
      them, one per layer, or a pattern whose length divides ``n_layers`` and is repeated
      (recurrentgemma's ``block_types``): ``(AssocConfig(rule="gated_delta"),) * 2 +
      (SoftmaxConfig(),)`` with ``n_layers=6`` is softmax every third layer.
    input_dim: 0 for token inputs (``vocab_size`` embedding); > 0 for continuous inputs
      ``[B, T, input_dim]`` through a linear map (algorithmic tasks).
    output_dim: 0 for ``vocab_size`` logits; > 0 for a linear read-out of that width.
    positions: "learned" (absolute, up to ``max_len``), "sinusoidal" (fixed) or "none"
      (causal mixers infer order; the choice for length generalisation).
    ffn: each block's second slot: "mlp" (the GELU feed-forward layer of width ``d_ff``), a mixer config
      (a second memory in the FFN's place: ``MatrixStateConfig()`` is UniMatrix's Recurrent-FFN-Hybrid,
      :func:`jaxmem.models.unimatrix.recurrent_ffn_hybrid`), or None (mixer-only blocks).
    ngram_inputs: ``n ≥ 2`` adds to each position's embedding a learned function of its last ``n`` tokens'
      embeddings, ``GELU(W [e_{t−n+1}; …; e_t] + b)`` (positions before the start read zeros): UniMatrix's
      generic triple latent is ``n = 3`` (:func:`jaxmem.models.unimatrix.triple_latent`). 1: the embedding
      alone.
  """

  body: str = dataclasses.field(default="transformer", init=False)
  vocab_size: int = 256
  d_model: int = 128
  n_layers: int = 4
  n_heads: int = 4
  d_ff: int = 512
  max_len: int = 256
  tie_embeddings: bool = True
  remat: bool = False
  remat_policy: str = "full"
  dtype: str = "float32"
  mixer: MixerSpec = SoftmaxConfig()
  input_dim: int = 0
  output_dim: int = 0
  positions: str = "learned"
  ffn: Union[str, MixerConfig, None] = "mlp"
  ngram_inputs: int = 1

  def __post_init__(self):
    # a config file's dict form of the mixers (BodyConfig.from_dict): {"name": ...} or a list of them
    if isinstance(self.mixer, Mapping):
      object.__setattr__(self, "mixer", MixerConfig.from_dict(self.mixer))
    elif isinstance(self.mixer, (list, tuple)) and any(isinstance(m, Mapping) for m in self.mixer):
      object.__setattr__(self, "mixer", tuple(MixerConfig.from_dict(m) for m in self.mixer))
    check_config_ints(self, ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len", "ngram_inputs"))
    check_config_ints(self, ("input_dim", "output_dim"), allow_zero=True)
    if self.d_model % self.n_heads:
      raise ValueError(
          f"TransformerConfig.n_heads={self.n_heads} must divide d_model={self.d_model}."
      )
    check_remat_policy("TransformerConfig", self.remat_policy)
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"TransformerConfig.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}.")
    if self.positions not in ("learned", "sinusoidal", "none"):
      raise ValueError(
          f"TransformerConfig.positions must be 'learned', 'sinusoidal' or 'none', got {self.positions!r}.")
    pattern = self.mixer if isinstance(self.mixer, tuple) else (self.mixer,)
    if not pattern or not all(isinstance(m, MixerConfig) for m in pattern):
      raise ValueError(f"TransformerConfig.mixer must be a mixer config (one of {mixers.names()}) or a "
                       f"non-empty tuple of them, got {self.mixer!r}.")
    if isinstance(self.ffn, Mapping):  # a config file's dict form of a mixer
      object.__setattr__(self, "ffn", MixerConfig.from_dict(self.ffn))
    if not (self.ffn in ("mlp", None) or isinstance(self.ffn, MixerConfig)):
      raise ValueError(f"TransformerConfig.ffn must be 'mlp', None or a mixer config (one of "
                       f"{mixers.names()}), got {self.ffn!r}.")
    if self.ngram_inputs > 1 and self.input_dim:
      raise ValueError(f"TransformerConfig.ngram_inputs={self.ngram_inputs} needs token inputs (input_dim=0), "
                       f"got input_dim={self.input_dim}.")
    if self.n_layers % len(pattern):
      raise ValueError(f"TransformerConfig.mixer has {len(pattern)} entries, which must divide "
                       f"n_layers={self.n_layers} (one per layer, or a pattern repeated).")

  @property
  def pattern(self) -> tuple:
    """The mixer configs of one repeat of the layer pattern (length 1 when all layers agree)."""
    pattern = self.mixer if isinstance(self.mixer, tuple) else (self.mixer,)
    return pattern[:1] if all(m == pattern[0] for m in pattern) else pattern

  def layer_mixer(self, layer: int) -> MixerConfig:
    """The mixer config of layer ``layer`` (0-based)."""
    if not 0 <= layer < self.n_layers:
      raise ValueError(f"`layer` must be in [0, {self.n_layers}), got {layer!r}.")
    return self.pattern[layer % len(self.pattern)]

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  def state_floats(self, seq_len: int) -> int:
    """Floats of memory the mixers hold per sequence after ``seq_len`` tokens, summed over layers (each layer's
    own mixer, and a mixer in the ffn slot: :meth:`jaxmem.models.mixers.MixerConfig.state_floats`): ``2·L·T·d``
    for softmax attention's KV cache, ``L·H·d_head²`` for an associative memory."""
    size = lambda m: m.state_floats(d_model=self.d_model, n_heads=self.n_heads, seq_len=seq_len)
    ffn = size(self.ffn) if isinstance(self.ffn, MixerConfig) else 0
    return sum(size(self.layer_mixer(i)) + ffn for i in range(self.n_layers))


class Block(nnx.Module):
  """Pre-LN block: ``x + Mixer(LN(x))`` then ``x + FFN(LN(x))``; ``mixer_cfg`` picks the mixer (held as
  ``self.attn``), ``cfg.ffn`` the second slot (the MLP, another mixer, or nothing)."""

  def __init__(self, cfg: TransformerConfig, mixer_cfg: Optional[MixerConfig] = None, *, rngs: nnx.Rngs):
    dt = jnp.dtype(cfg.dtype)
    mixer_cfg = cfg.layer_mixer(0) if mixer_cfg is None else mixer_cfg
    self.ln1 = layer_norm(cfg.d_model, dtype=dt, rngs=rngs)
    # The mixer is `attn` whatever it is (fla's blocks do the same): parameter paths, hence
    # checkpoints and the leaf order that global-norm clipping sums in, are the pre-mixer model's.
    self.attn = mixers.build(mixer_cfg, d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers,
                             dtype=cfg.dtype, rngs=rngs)
    if cfg.ffn is None:
      self.ln2, self.ffn = nnx.data(None), nnx.data(None)
    else:
      self.ln2 = layer_norm(cfg.d_model, dtype=dt, rngs=rngs)
      self.ffn = FeedForward(cfg.d_model, cfg.d_ff, n_layers=cfg.n_layers, dtype=dt, rngs=rngs) \
          if cfg.ffn == "mlp" else mixers.build(
          cfg.ffn, d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers, dtype=cfg.dtype, rngs=rngs)

  def __call__(self, x: jax.Array, segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """``x [B, T, d_model]``; ``segment_ids [B, T]``: packed sequences, passed to the mixers (the MLP is
    per token)."""
    x = x + (self.attn(self.ln1(x)) if segment_ids is None else self.attn(self.ln1(x), segment_ids))
    if self.ffn is None:
      return x
    if isinstance(self.ffn, mixers.Mixer) and segment_ids is not None:
      return x + self.ffn(self.ln2(x), segment_ids)
    return x + self.ffn(self.ln2(x))

  def init_state(self, batch_size: int, max_len: int) -> dict:
    """The decoding state of the block's mixers: ``{"attn": ..., "ffn": ... or None}`` (the MLP keeps none)."""
    ffn = self.ffn.init_state(batch_size, max_len) if isinstance(self.ffn, mixers.Mixer) else None
    return {"attn": self.attn.init_state(batch_size, max_len), "ffn": ffn}

  def scan(self, state: dict, x: jax.Array, lengths=None) -> tuple:
    """The block on ``x [B, T, d_model]`` from a decoding state: ``(state, y)``; ``lengths [B]``: right-padded
    rows, passed to the mixers (:meth:`jaxmem.models.mixers.registry.Mixer.scan`)."""
    rows = {} if lengths is None else {"lengths": lengths}
    attn, y = self.attn.scan(state["attn"], self.ln1(x), **rows)
    x = x + y
    ffn = state["ffn"]
    if isinstance(self.ffn, mixers.Mixer):
      ffn, y = self.ffn.scan(ffn, self.ln2(x), **rows)
      x = x + y
    elif self.ffn is not None:
      x = x + self.ffn(self.ln2(x))
    return {"attn": attn, "ffn": ffn}, x


class TransformerLM(nnx.Module):
  """Decoder-only LM: ``tokens [B, T] -> logits [B, T, vocab]`` (float32)."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    dt = jnp.dtype(cfg.dtype)
    if cfg.input_dim:
      self.embed = linear(cfg.input_dim, cfg.d_model, ("input", "embed"), dtype=dt, rngs=rngs)
    else:
      self.embed = embed(cfg.vocab_size, cfg.d_model, dtype=dt, rngs=rngs,
                         embedding_init=nnx.initializers.normal(0.02))
    self.pos = nnx.data(
        positions(cfg.max_len, cfg.d_model, std=0.01, rngs=rngs) if cfg.positions == "learned" else None)
    self.ngram = nnx.data(
        linear(cfg.ngram_inputs * cfg.d_model, cfg.d_model, (None, "embed"), dtype=dt, rngs=rngs)
        if cfg.ngram_inputs > 1 else None)

    def stack(mixer_cfg: MixerConfig, n: int) -> Block:  # n blocks with one mixer, stacked on axis 0
      @nnx.split_rngs(splits=n)
      @nnx.vmap(in_axes=(0,), out_axes=0)
      def make_blocks(rngs: nnx.Rngs) -> Block:
        return Block(cfg, mixer_cfg, rngs=rngs)
      return make_blocks(rngs)

    pattern = cfg.pattern
    repeats = cfg.n_layers // len(pattern)
    # One mixer: a stack of n_layers blocks. A pattern of P mixers: P stacks of n_layers / P
    # blocks; layer i is stack i % P, entry i // P. Either way depth is one nnx.scan.
    self.blocks = nnx.data(stack(pattern[0], repeats) if len(pattern) == 1
                           else tuple(stack(m, repeats) for m in pattern))
    self.ln_f = layer_norm(cfg.d_model, dtype=dt, rngs=rngs)
    out_dim = cfg.output_dim or cfg.vocab_size
    tied = cfg.tie_embeddings and not cfg.input_dim and not cfg.output_dim
    self.head: Optional[nnx.Linear] = nnx.data(
        None if tied else linear(cfg.d_model, out_dim, ("embed", "vocab"), use_bias=False, dtype=dt, rngs=rngs)
    )

  def embed_tokens(self, tokens_BT: jax.Array, segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """Input plus position embeddings: tokens ``[B, T]`` (or ``[B, T, input_dim]``) ->
    ``[B, T, d_model]``. With ``segment_ids [B, T]`` (packed sequences) positions and the n-gram window restart
    at each segment (:func:`jaxmem.kernels.segments.segment_positions`)."""
    if self.cfg.input_dim:
      check_rank("inputs", tokens_BT, 3, "B, T, input_dim")
      if tokens_BT.shape[-1] != self.cfg.input_dim:
        raise ValueError(f"`inputs` has {tokens_BT.shape[-1]} channels, input_dim={self.cfg.input_dim}.")
    else:
      check_rank("tokens", tokens_BT, 2, "B, T")
      tokens_BT = token_ids(tokens_BT, self.cfg.vocab_size)
    T = tokens_BT.shape[1]
    if self.cfg.positions == "learned" and T > self.cfg.max_len:
      raise ValueError(f"`tokens` has length {T} > max_len={self.cfg.max_len}.")
    x = self.embed(tokens_BT)
    if self.ngram is not None:  # [e_{t−n+1}; …; e_t], zeros before the start (of the segment)
      n = self.cfg.ngram_inputs
      if segment_ids is None:
        window = [jnp.pad(x, ((0, 0), (j, 0), (0, 0)))[:, :T] for j in range(n - 1, 0, -1)] + [x]
      else:
        window = [_back_in_segment(x, segment_ids, j) for j in range(n - 1, 0, -1)] + [x]
      x = x + jax.nn.gelu(self.ngram(jnp.concatenate(window, axis=-1)))
    if segment_ids is not None and self.cfg.positions != "none":
      pos_BT = segment_positions(segment_ids)
      if self.cfg.positions == "learned":
        return x + jnp.take(self.pos[...], pos_BT, axis=0).astype(x.dtype)
      return x + sinusoidal_at(pos_BT, self.cfg.d_model).astype(x.dtype)
    if self.cfg.positions == "learned":
      x = x + self.pos[...][None, :T].astype(x.dtype)
    elif self.cfg.positions == "sinusoidal":
      x = x + sinusoidal_positions(T, self.cfg.d_model)[None].astype(x.dtype)
    return x

  def logits_from_embeddings(self, x_BTD: jax.Array, segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """Blocks, final norm and read-out; separate so tests can differentiate w.r.t. inputs."""
    body = (lambda blk, h, seg: blk(h)) if segment_ids is None else (lambda blk, h, seg: blk(h, seg))
    if self.cfg.remat:
      body = nnx.remat(body, policy=remat_policy(self.cfg.remat_policy))

    @nnx.scan(in_axes=(0, nnx.Carry, None), out_axes=nnx.Carry)
    def run_blocks(blocks, h: jax.Array, seg) -> jax.Array:
      for block in (blocks if isinstance(blocks, tuple) else (blocks,)):  # the pattern, not time
        h = body(block, h, seg)
      return h

    return self.read_out(run_blocks(self.blocks, x_BTD, segment_ids))

  def __call__(self, tokens_BT: jax.Array, segment_ids: Optional[jax.Array] = None) -> jax.Array:
    """``logits [B, T, vocab]``; ``segment_ids [B, T]`` (integers): packed sequences (several documents per row,
    :mod:`jaxmem.kernels.segments`): positions restart and no mixer reads across a boundary, so each
    document's logits are the ones it would get alone; padding (id 0) tokens' logits are not meaningful."""
    if segment_ids is not None:
      B, T = tokens_BT.shape[:2]
      segment_ids = check_segment_ids(segment_ids, B, T)
    return self.logits_from_embeddings(self.embed_tokens(tokens_BT, segment_ids), segment_ids)

  # -- decoding: init_state / scan / step (jaxmem.generate builds on these) ----------------------------------

  def _without_decoding(self) -> list:
    """The names of the model's mixers (each layer's, and one in the ffn slot) without init_state / step /
    scan."""
    cfgs = list(self.cfg.pattern) + ([self.cfg.ffn] if isinstance(self.cfg.ffn, MixerConfig) else [])
    module = lambda c: mixers.lookup(c.name)[1]
    return sorted({c.name for c in cfgs if not (module(c).decodes() and module(c).scans())})

  def decodes(self) -> bool:
    """Whether every mixer of the model (each layer's, and one in the ffn slot) can decode token by token."""
    return not self._without_decoding()

  def _check_decodes(self) -> None:
    if self.cfg.input_dim:
      raise ValueError("decoding needs token inputs (TransformerConfig.input_dim=0).")
    missing = self._without_decoding()
    if missing:
      raise ValueError(f"mixer(s) {missing} of this model have no token-by-token decoding (init_state / step / "
                       f"scan); the mixers that decode: "
                       f"{[n for n in mixers.names() if mixers.lookup(n)[1].decodes()]}.")

  def init_state(self, batch_size: int, max_len: int) -> dict:
    """The decoding state before the first token, for sequences of up to ``max_len`` tokens: ``{"pos": [B]
    int32 (tokens read so far, per row), "layers": each stack's block states (stacked on the layer axis),
    "ngram": the last ``ngram_inputs − 1`` token embeddings [B, n − 1, d_model] or None}``."""
    self._check_decodes()
    if self.cfg.positions == "learned" and max_len > self.cfg.max_len:
      raise ValueError(f"`max_len`={max_len} exceeds the {self.cfg.max_len} learned positions of this model "
                       f"(TransformerConfig.max_len).")
    cfg, P = self.cfg, len(self.cfg.pattern)
    repeats = cfg.n_layers // P

    def stacked(stack: Block):
      # a decoding state reads the modules' sizes, never their parameters, so the stacked module (parameters
      # with a leading layer axis) gives one layer's state; every layer starts from the same one
      one = stack.init_state(batch_size, max_len)
      return jax.tree.map(lambda x: jnp.broadcast_to(x, (repeats,) + x.shape), one)

    layers = stacked(self.blocks) if P == 1 else tuple(stacked(s) for s in self.blocks)
    n = cfg.ngram_inputs
    ngram = jnp.zeros((batch_size, n - 1, cfg.d_model), jnp.dtype(cfg.dtype)) if n > 1 else None
    return {"pos": jnp.zeros((batch_size,), jnp.int32), "layers": layers, "ngram": ngram}

  def scan(self, state: dict, tokens_BT: jax.Array, lengths=None) -> tuple:
    """``T`` more tokens of every row from ``state``: ``(state, logits [B, T, vocab] float32)``, equal to the
    corresponding rows of :meth:`__call__` on the whole sequence. Positions continue from ``state["pos"]``
    (per row). Learned positions past ``max_len`` cannot be checked under ``jit``: they are clamped to the
    last one, so check lengths first (``jaxmem.generate`` does).

    ``lengths [B]`` (integers in ``[0, T]``; None: all ``T``): right-padded rows, prompts of different lengths
    in one call: row ``b`` reads its first ``lengths[b]`` tokens, and the state returned for it (positions,
    n-gram window, every mixer's state) is the one after them; the logits at its padding are unspecified."""
    cfg = self.cfg
    B, T = check_rank("tokens", tokens_BT, 2, "B, T")
    tokens_BT = token_ids(tokens_BT, cfg.vocab_size)
    if lengths is not None:
      lengths = check_lengths(lengths, B, T)
    pos_BT = state["pos"][:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    x = self.embed(tokens_BT)
    ngram = state["ngram"]
    if self.ngram is not None:
      n = cfg.ngram_inputs
      seq = jnp.concatenate([ngram.astype(x.dtype), x], axis=1)   # [B, n − 1 + T, d]
      window = [seq[:, n - 1 - j: n - 1 - j + T] for j in range(n - 1, 0, -1)] + [x]
      if lengths is None:
        ngram = seq[:, seq.shape[1] - (n - 1):]
      else:  # the n − 1 embeddings up to row b's last token (token t is seq[n − 1 + t])
        idx = lengths[:, None] + jnp.arange(n - 1, dtype=jnp.int32)[None]
        ngram = jnp.take_along_axis(seq, idx[..., None], axis=1)
      x = x + jax.nn.gelu(self.ngram(jnp.concatenate(window, axis=-1)))
    if cfg.positions == "learned":
      x = x + jnp.take(self.pos[...], jnp.minimum(pos_BT, cfg.max_len - 1), axis=0).astype(x.dtype)
    elif cfg.positions == "sinusoidal":
      x = x + sinusoidal_at(pos_BT, cfg.d_model).astype(x.dtype)

    @nnx.scan(in_axes=(0, 0, nnx.Carry, None), out_axes=(0, nnx.Carry))
    def run_blocks(blocks, states, h, lengths):
      stacks = blocks if isinstance(blocks, tuple) else (blocks,)
      states = states if isinstance(blocks, tuple) else (states,)
      new = []
      for block, st in zip(stacks, states, strict=True):  # the pattern, not time
        st, h = block.scan(st, h, lengths)
        new.append(st)
      return (tuple(new) if isinstance(blocks, tuple) else new[0]), h

    layers, h = run_blocks(self.blocks, state["layers"], x, lengths)
    read = T if lengths is None else lengths
    return {"pos": state["pos"] + read, "layers": layers, "ngram": ngram}, self.read_out(h)

  def step(self, state: dict, tokens_B: jax.Array) -> tuple:
    """One token per row: ``(state, tokens [B]) -> (state, logits [B, vocab])``."""
    state, logits = self.scan(state, tokens_B[:, None])
    return state, logits[:, 0]

  def block(self, layer: int) -> Block:
    """A standalone copy of layer ``layer``'s block (its parameters sliced out of the stack), for
    probing one layer; ``read_out`` applies the final norm and head."""
    mixer_cfg = self.cfg.layer_mixer(layer)
    P = len(self.cfg.pattern)
    stack = self.blocks if P == 1 else self.blocks[layer % P]
    block = nnx.eval_shape(lambda: Block(self.cfg, mixer_cfg, rngs=nnx.Rngs(0)))
    nnx.update(block, jax.tree.map(lambda x: x[layer // P], nnx.state(stack)))
    return block

  def read_out(self, h_BTD: jax.Array) -> jax.Array:
    """Final norm and logits (float32) of the last block's output."""
    h = self.ln_f(h_BTD)
    logits = self.embed.attend(h) if self.head is None else self.head(h)
    return logits.astype(jnp.float32)


def _back_in_segment(x_BTD: jax.Array, segment_ids_BT: jax.Array, lag: int) -> jax.Array:
  """Each token's input ``lag`` non-padding tokens back in its own segment (zeros where there is none)."""
  src, ok = previous_in_segment(segment_ids_BT, lag)
  back = jnp.take_along_axis(x_BTD, src[..., None], axis=1)
  return jnp.where(ok[..., None], back, jnp.zeros((), x_BTD.dtype))


def sinusoidal_positions(length: int, dim: int) -> jax.Array:
  """Fixed sinusoidal positions (Vaswani et al. 2017, §3.5): ``[length, dim]``."""
  return sinusoidal_at(jnp.arange(length), dim)


def sinusoidal_at(positions, dim: int) -> jax.Array:
  """:func:`sinusoidal_positions` at integer ``positions`` of any shape: ``[..., dim]``."""
  pos = jnp.asarray(positions).astype(jnp.float32)[..., None]
  i = jnp.arange((dim + 1) // 2, dtype=jnp.float32).reshape((1,) * (pos.ndim - 1) + (-1,))
  angles = pos / jnp.power(10000.0, 2.0 * i / dim)
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)[..., :dim]


bodies.register("transformer", TransformerConfig, TransformerLM)
