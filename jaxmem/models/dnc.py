"""The Differentiable Neural Computer (Graves et al. 2016) as a Flax NNX module.

A controller (LSTM or feed-forward) reads ``[x_t; r_{t−1}]``, emits the interface vector
``ξ_t`` (parsed by :func:`jaxmem.kernels.dnc.parse_interface`) and its output ``h_t``; the
memory step is :func:`jaxmem.kernels.dnc.step`, vmapped over the batch; the output is
``y_t = W_y [h_t; r_t]`` (Nature 2016, Methods). The time loop is one ``lax.scan`` whose
body is wrapped in ``jax.checkpoint`` (``remat=True``) so the reverse pass stores the
carried state per step and not the step's intermediates.

:class:`DNCLM` is the DNC as a language model (token embedding in, logits out; the ``"dnc"`` body of an LM
config, :mod:`jaxmem.models.bodies`), so ``jaxmem train`` trains it like any other.

As in DeepMind's reference, the controller output and the interface are clipped to
``[-clip_value, clip_value]`` (0 disables) for stability early in training.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmem.checks import check_config_ints, check_rank
from jaxmem.kernels import dnc as dnc_kernels
from jaxmem.kernels.segments import (
  check_lengths,
  check_segment_ids,
  lengths_to_segment_ids,
  segment_starts,
  where_rows,
)
from jaxmem.models import bodies
from jaxmem.models.layers import constant, embed, linear, token_ids

# the controller's and read-out's matrices: replicated (the LSTM is small and sequential), weight-decayed
EMBED2 = ("embed", "embed")


@dataclasses.dataclass(frozen=True)
class DNCConfig:
  """Attributes: sizes of the controller and the memory (N slots × W, R read heads)."""

  input_dim: int = 8
  output_dim: int = 8
  memory_size: int = 64
  word_size: int = 32
  num_reads: int = 4
  hidden_size: int = 128
  controller: str = "lstm"
  clip_value: float = 20.0
  remat: bool = True

  def __post_init__(self):
    check_config_ints(self, ("input_dim", "output_dim", "memory_size", "word_size", "num_reads",
                             "hidden_size"))
    if self.controller not in ("lstm", "feedforward"):
      raise ValueError(f"DNCConfig.controller must be 'lstm' or 'feedforward', got {self.controller!r}.")
    if not (isinstance(self.clip_value, (int, float)) and self.clip_value >= 0):
      raise ValueError(f"DNCConfig.clip_value must be >= 0, got {self.clip_value!r}.")


class DNC(nnx.Module):
  """``x [B, T, input_dim] -> y [B, T, output_dim]`` (and the final memory state)."""

  def __init__(self, cfg: DNCConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    R, W, Hd = cfg.num_reads, cfg.word_size, cfg.hidden_size
    ctrl_in = cfg.input_dim + R * W
    if cfg.controller == "lstm":
      # gates (i, f, g, o) from [input; h]; forget-gate bias 1 (Jozefowicz et al. 2015)
      bias = jnp.zeros((4 * Hd,)).at[Hd:2 * Hd].set(1.0)
      self.cell = linear(ctrl_in + Hd, 4 * Hd, EMBED2, rngs=rngs, bias_init=constant(bias))
    else:
      self.cell = linear(ctrl_in, Hd, EMBED2, rngs=rngs)
    self.interface = linear(Hd, dnc_kernels.interface_size(W, R), EMBED2, rngs=rngs)
    self.readout = linear(Hd + R * W, cfg.output_dim, EMBED2, rngs=rngs)

  def initial_state(self, batch_size: int):
    cfg = self.cfg
    mem = jax.vmap(lambda _: dnc_kernels.init(cfg.memory_size, cfg.word_size, cfg.num_reads))(
        jnp.arange(batch_size))
    h = jnp.zeros((batch_size, cfg.hidden_size))
    reads = jnp.zeros((batch_size, cfg.num_reads * cfg.word_size))
    return (h, h, mem, reads)

  def _clip(self, x):
    c = self.cfg.clip_value
    return jnp.clip(x, -c, c) if c else x

  def __call__(self, x_BTC: jax.Array, *, return_state: bool = False, segment_ids=None):
    """``y [B, T, output_dim]`` from :meth:`initial_state`; with ``return_state`` also the final memory;
    ``segment_ids``: as :meth:`scan`."""
    final, ys = self.scan(self.initial_state(x_BTC.shape[0]), x_BTC, segment_ids)
    return (ys, final[2]) if return_state else ys

  def scan(self, state, x_BTC: jax.Array, segment_ids=None) -> tuple:
    """The recurrence from ``state`` (:meth:`initial_state`'s structure: controller ``h, c``, memory, last
    reads): ``(state after the last step, y [B, T, output_dim])``. ``segment_ids [B, T]`` (integers): packed
    rows (:mod:`jaxmem.kernels.segments`): the controller, the memory and the reads return to
    :meth:`initial_state` at every segment but a row's first (which continues ``state``); a padding token
    (id 0) leaves the state as it is and outputs 0."""
    B, T, _ = check_rank("x", x_BTC, 3, "B, T, input_dim")
    if x_BTC.shape[-1] != self.cfg.input_dim:
      raise ValueError(f"`x` has {x_BTC.shape[-1]} channels, DNCConfig.input_dim={self.cfg.input_dim}.")
    cfg = self.cfg
    starts = None
    if segment_ids is not None:
      starts = tuple(jnp.swapaxes(a, 0, 1) for a in segment_starts(check_segment_ids(segment_ids, B, T)))
      fresh = self.initial_state(B)
    # Pure step over plain arrays: read the parameters once, outside the scan.
    graphdef, params = nnx.split(self)

    def step(carry, inputs):
      x_t, s = inputs
      if s is not None:  # packed rows: a fresh state at a segment's start
        carry = where_rows(s[0], fresh, carry)
      h, c, mem, reads = carry
      model = nnx.merge(graphdef, params, copy=True)
      inp = jnp.concatenate([x_t, reads], axis=-1)
      if cfg.controller == "lstm":
        i, f, g, o = jnp.split(model.cell(jnp.concatenate([inp, h], axis=-1)), 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        out = h
      else:
        out = h = jax.nn.relu(model.cell(inp))
      out = self._clip(out)
      xi = self._clip(model.interface(out))
      it = jax.vmap(lambda z: dnc_kernels.parse_interface(z, cfg.word_size, cfg.num_reads))(xi)
      mem, r = jax.vmap(dnc_kernels.step)(mem, it)
      reads = r.reshape(B, -1)
      y = model.readout(jnp.concatenate([out, reads], axis=-1))
      if s is None:
        return (h, c, mem, reads), y
      return where_rows(s[1], (h, c, mem, reads), carry), jnp.where(s[1][:, None], y, 0.0)

    if cfg.remat:
      step = jax.checkpoint(step)
    final, ys = jax.lax.scan(step, state, (jnp.swapaxes(x_BTC, 0, 1), starts))
    return final, jnp.swapaxes(ys, 0, 1)


@dataclasses.dataclass(frozen=True)
class DNCLMConfig(bodies.BodyConfig):
  """A DNC-controller language model (:class:`DNCLM`): token embedding of width ``d_embed``, the DNC (its
  memory and controller fields as :class:`DNCConfig`), logits read out by the DNC's output layer.

  Attributes:
    body: "dnc", the tag of this body in an LM config's ``model`` section (not an argument).
    vocab_size: token ids ``[0, vocab_size)`` (256 for bytes).
    d_embed: width of the token embedding, the DNC's input.
    memory_size, word_size, num_reads, hidden_size, controller, clip_value, remat: as :class:`DNCConfig`.
  """

  body: str = dataclasses.field(default="dnc", init=False)
  vocab_size: int = 256
  d_embed: int = 64
  memory_size: int = DNCConfig.memory_size   # the memory's and controller's defaults are DNCConfig's
  word_size: int = DNCConfig.word_size
  num_reads: int = DNCConfig.num_reads
  hidden_size: int = DNCConfig.hidden_size
  controller: str = DNCConfig.controller
  clip_value: float = DNCConfig.clip_value
  remat: bool = DNCConfig.remat

  def __post_init__(self):
    check_config_ints(self, ("vocab_size", "d_embed"))
    _ = self.dnc  # the memory's and controller's own checks (DNCConfig.__post_init__)

  @property
  def dnc(self) -> DNCConfig:
    """The :class:`DNCConfig` of the memory: input ``d_embed``, output ``vocab_size``."""
    return DNCConfig(input_dim=self.d_embed, output_dim=self.vocab_size, memory_size=self.memory_size,
                     word_size=self.word_size, num_reads=self.num_reads, hidden_size=self.hidden_size,
                     controller=self.controller, clip_value=self.clip_value, remat=self.remat)

  def state_floats(self, seq_len: int) -> int:
    """Floats of the carried state per sequence, whatever ``seq_len``: memory ``N·W``, link matrix ``N²``,
    usage, precedence and write weights ``3·N``, read weights ``R·N``, controller ``2·hidden``, reads
    ``R·W``."""
    N, W, R = self.memory_size, self.word_size, self.num_reads
    return N * W + N * N + 3 * N + R * N + 2 * self.hidden_size + R * W


class DNCLM(nnx.Module):
  """``tokens [B, T] -> logits [B, T, vocab_size]`` (float32): ``DNC(Embed(tokens))``, one ``lax.scan`` over
  time; no positions (the controller's recurrence orders the tokens), so no length limit."""

  def __init__(self, cfg: DNCLMConfig, *, rngs: nnx.Rngs):
    if not isinstance(cfg, DNCLMConfig):
      raise ValueError(f"`cfg` must be a DNCLMConfig, got {type(cfg).__name__}.")
    self.cfg = cfg
    self.embed = embed(cfg.vocab_size, cfg.d_embed, embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
    self.dnc = DNC(cfg.dnc, rngs=rngs)

  def __call__(self, tokens_BT: jax.Array, segment_ids=None) -> jax.Array:
    """``logits [B, T, vocab_size]``; ``segment_ids [B, T]``: packed rows, each document read from a fresh
    controller and memory (:meth:`DNC.scan`)."""
    check_rank("tokens", tokens_BT, 2, "B, T")
    emb = self.embed(token_ids(tokens_BT, self.cfg.vocab_size))
    return self.dnc(emb, segment_ids=segment_ids).astype(jnp.float32)

  # decoding (jaxmem.generate): the DNC's carried state, whatever the context length
  def init_state(self, batch_size: int, max_len: int):
    """The DNC's state before the first token (its size does not depend on ``max_len``)."""
    del max_len
    return self.dnc.initial_state(batch_size)

  def scan(self, state, tokens_BT: jax.Array, lengths=None) -> tuple:
    """``(state, tokens [B, T]) -> (state, logits [B, T, vocab_size])``; ``lengths [B]`` (integers in
    ``[0, T]``; None: all ``T``): right-padded rows, row ``b``'s state is the one after its first ``lengths[b]``
    tokens (the padding leaves the DNC's state as it is; its logits are unspecified)."""
    B, T = check_rank("tokens", tokens_BT, 2, "B, T")
    segment_ids = None if lengths is None else lengths_to_segment_ids(check_lengths(lengths, B, T), T)
    state, y = self.dnc.scan(state, self.embed(token_ids(tokens_BT, self.cfg.vocab_size)), segment_ids)
    return state, y.astype(jnp.float32)

  def step(self, state, tokens_B: jax.Array) -> tuple:
    """One token per row: ``(state, tokens [B]) -> (state, logits [B, vocab_size])``."""
    state, y = self.scan(state, tokens_B[:, None])
    return state, y[:, 0]


bodies.register("dnc", DNCLMConfig, DNCLM)
