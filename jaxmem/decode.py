"""Sampling from a trained language model: :func:`generate` (also ``jaxmem.generate``).

Any model with the decoding methods ``init_state(batch_size, max_len)``, ``scan(state, tokens [B, T],
lengths=None) -> (state, logits [B, T, V])`` and ``step(state, tokens [B]) -> (state, logits [B, V])`` —
:class:`~jaxmem.models.TransformerLM` whose mixers all decode, :class:`~jaxmem.models.UniMatrixLM`,
:class:`~jaxmem.models.DNCLM` — decodes in two phases inside one compiled program:

1. **prefill**: every row's whole prompt through the models' parallel / chunked sequence forms (``scan``),
   once, returning every layer's state. Prompts of different lengths are right-padded to the longest, ``L``;
   ``scan``'s ``lengths`` (each row's tokens in the piece) makes the padding write nothing, so each row's
   state — its KV caches' length, its memories, its convolution windows, its position — is the one after its
   own last prompt token, and its first new token is chosen from the logits there. The prompt goes in pieces
   of :data:`PREFILL_CHUNK` tokens, each from the state the last left, so attention's scores stay
   ``[chunk, context]`` for long prompts.
2. **decode**: one ``lax.scan`` of ``n − 1`` ``step``s, every row at its own position (row ``b``'s new token
   ``j`` is read at position ``len_b + j``): a batch of prompts of 2,048 and 8 tokens costs what two of 2,048
   cost, not 2,040 steps more.

So every row reads exactly its own sequence: its logits (and greedy tokens) are those of the row decoded alone,
up to float32 rounding. Sampled tokens also depend on the row's index: row ``b``'s ``j``-th new token is drawn
with the key of ``(seed, len_b + j, b)``, so a row samples the same tokens in every batch in which it is row
``b`` (whatever the other rows, the batch size and the padding), and rows with the same prompt in one batch
sample independently; decoded alone (as row 0) it draws other samples unless ``b = 0``.

A softmax layer keeps a fixed-size KV cache of ``L + n`` positions with a length per row, a memory its
carried state (a matrix state's size does not grow with the context), so no shape changes from step to step.

Prompts of different lengths are **right-padded**: row ``b`` is ``prompt[b, :prompt_lengths[b]]`` (whatever
follows is ignored). The output is ``[B, T + n]`` for a prompt of width ``T``: row ``b`` holds its prompt in
columns ``0 .. len_b − 1``, its ``n`` new tokens in columns ``len_b .. len_b + n − 1`` and zeros after them
(with every row of length ``T``, the default, the new tokens are ``out[:, T:]``).

Compiled once per (model structure, batch, longest prompt ``L``, ``n``, whether the lengths differ, whether
``top_k`` / ``top_p`` / greedy / ``return_logits``): the prompt lengths, temperature, ``top_p``'s value, the
seed and the prompt values are arguments of the compiled program, not constants.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _check_model(model) -> None:
  for name in ("init_state", "scan", "step"):
    if not callable(getattr(model, name, None)):
      raise ValueError(f"`model` ({type(model).__name__}) cannot decode: it has no `{name}` method (every "
                       f"TransformerLM whose mixers decode, UniMatrixLM and DNCLM do).")
  check = getattr(model, "_check_decodes", None)
  if check is not None:
    check()


def _takes_lengths(model) -> bool:
  """Whether ``model.scan`` takes ``lengths`` (right-padded rows of different lengths in one call)."""
  try:
    return "lengths" in inspect.signature(model.scan).parameters
  except (TypeError, ValueError):
    return False


def _python_number(name: str, value, kind: str):
  """``value`` as a Python number when it is a concrete 0-d jax / numpy array or a numpy scalar of an integer
  (``kind="int"``) or a real (``kind="real"``) dtype; any other value unchanged (the caller's checks refuse
  what is not a number). A traced value (inside ``jit`` / ``grad`` / ``vmap``) is a ``ValueError``: the
  sampling arguments choose and feed the compiled program, so they must be known on the host."""
  if isinstance(value, jax.core.Tracer):
    raise ValueError(f"`{name}` must be a concrete number, got a traced value: `generate` compiles its own "
                     f"program, so call it outside jit / grad / vmap.")
  if not isinstance(value, (jax.Array, np.ndarray, np.generic)):
    return value
  dtype = np.dtype(value.dtype)
  ok = np.issubdtype(dtype, np.integer) or (kind == "real" and np.issubdtype(dtype, np.floating))
  if np.shape(value) != () or dtype == np.bool_ or not ok:
    what = "an int" if kind == "int" else "a number"
    raise ValueError(f"`{name}` must be {what} (a Python number or a 0-d array), got an array of shape "
                     f"{np.shape(value)} and dtype {dtype}.")
  return np.asarray(value).item()


def seed_key(seed: int) -> jax.Array:
  """The sampling key of an integer ``seed`` (any Python int, or a 0-d integer array). Seeds in
  ``[0, 2**32)`` give ``jax.random.key(seed)`` itself; any other int (negative, or wider than 32 bits) folds
  the number of its further 32-bit words with its sign, then those words, into the key of its lowest 32 bits
  (``jax.random.fold_in``), so no int is refused and distinct seeds fold distinct sequences (``jax.random.key``
  alone keeps only a seed's low 32 bits without x64, and refuses seeds of 2**63 and more)."""
  seed = _python_number("seed", seed, "int")
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
    raise ValueError(f"`seed` must be an int, got {seed!r}.")
  seed = int(seed)
  magnitude = abs(seed)
  key = jax.random.key(magnitude & 0xFFFFFFFF)
  if 0 <= seed < 2 ** 32:
    return key
  words, rest = [], magnitude >> 32
  while rest:
    words.append(rest & 0xFFFFFFFF)
    rest >>= 32
  key = jax.random.fold_in(key, 2 * len(words) + (seed < 0))
  for word in words:
    key = jax.random.fold_in(key, word)
  return key


def _check_args(model, prompt, max_new_tokens, temperature, top_k, top_p, prompt_lengths):
  prompt = np.asarray(prompt)
  if prompt.ndim != 2 or prompt.shape[0] < 1 or prompt.shape[1] < 1:
    raise ValueError(f"`prompt` must be token ids [B, T] with B, T >= 1, got shape {prompt.shape}.")
  if not np.issubdtype(prompt.dtype, np.integer):
    raise ValueError(f"`prompt` must be integer token ids, got dtype {prompt.dtype}.")
  B, T = prompt.shape
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
    raise ValueError(f"`max_new_tokens` must be an int >= 1, got {max_new_tokens!r}.")
  temperature = _python_number("temperature", temperature, "real")
  if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or \
      not (math.isfinite(temperature) and temperature >= 0):
    raise ValueError(f"`temperature` must be a finite number >= 0 (0: greedy), got {temperature!r}.")
  vocab = model.cfg.vocab_size
  if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                            or not 1 <= top_k <= vocab):
    raise ValueError(f"`top_k` must be None or an int in [1, vocab_size={vocab}], got {top_k!r}.")
  top_p = None if top_p is None else _python_number("top_p", top_p, "real")
  if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
                            or not 0.0 < top_p <= 1.0):
    raise ValueError(f"`top_p` must be None or a number in (0, 1], got {top_p!r}.")
  bad = prompt[(prompt < 0) | (prompt >= vocab)]
  if prompt_lengths is None:
    lengths = np.full((B,), T, np.int32)
  else:
    lengths = np.asarray(prompt_lengths)
    if lengths.shape != (B,) or not np.issubdtype(lengths.dtype, np.integer):
      raise ValueError(f"`prompt_lengths` must be {B} ints (one per row), got {prompt_lengths!r}.")
    if lengths.min() < 1 or lengths.max() > T:
      raise ValueError(f"`prompt_lengths` must lie in [1, T={T}], got {lengths.tolist()}.")
    bad = np.concatenate([prompt[b, :lengths[b]] for b in range(B)])
    bad = bad[(bad < 0) | (bad >= vocab)]
  if bad.size:
    raise ValueError(f"`prompt` token ids must lie in [0, vocab_size={vocab}), got ids such as "
                     f"{bad.ravel()[:3].tolist()}.")
  limit = _length_limit(model)
  if limit is not None and int(lengths.max()) + max_new_tokens > limit:
    raise ValueError(f"a prompt of {int(lengths.max())} tokens plus max_new_tokens={max_new_tokens} exceeds "
                     f"the model's {limit} positions (learned positions end at max_len); shorten the prompt or "
                     f"generate fewer tokens.")
  return prompt.astype(np.int32), lengths.astype(np.int32), float(temperature), top_p


def _length_limit(model) -> Optional[int]:
  cfg = getattr(model, "cfg", None)
  if getattr(cfg, "positions", None) == "learned":
    return cfg.max_len
  return None


def filter_logits(logits_BV: jax.Array, top_k: Optional[int], top_p) -> jax.Array:
  """``logits`` with every token outside the top-``k`` (static ``k``) and outside the nucleus of mass
  ``top_p`` (the fewest most likely tokens whose probabilities sum to at least ``top_p``; the most likely token
  always stays) set to ``−inf``. ``None`` disables either filter."""
  if top_k is not None:
    kth = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV < kth, -jnp.inf, logits_BV)
  if top_p is not None:
    order = jnp.argsort(-logits_BV, axis=-1)
    sorted_logits = jnp.take_along_axis(logits_BV, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs          # mass of the more likely tokens
    keep_sorted = before < top_p                          # the first token always (before = 0)
    keep = jnp.zeros_like(keep_sorted).at[jnp.arange(order.shape[0])[:, None], order].set(keep_sorted)
    logits_BV = jnp.where(keep, logits_BV, -jnp.inf)
  return logits_BV


PREFILL_CHUNK = 512   # prompt tokens per prefill call: bounds attention's [chunk, context] scores


def prefill(model, graphdef, params, state, tokens_BP, chunk: int, lengths=None):
  """``model.scan`` over the prompt in pieces of ``chunk`` tokens (a ``lax.scan`` over the whole pieces, then
  the rest), each from the state the previous left: ``(state, logits of each row's last prompt token [B, V])``.
  Equal to one ``scan`` of the whole prompt up to float32 rounding; a softmax layer's scores are
  ``[chunk, context]`` per head instead of ``[P, context]``.

  ``lengths [B]`` (integers in ``[1, P]``; None: all ``P``): right-padded prompts of different lengths. Each
  piece is scanned with its rows' own token counts in it (``clip(lengths − start, 0, chunk)``, the model's
  ``scan(..., lengths=)``), so a row whose prompt has ended reads nothing more, its state stays the one after
  its last prompt token, and its logits are taken from the piece that holds that token."""
  B, P = tokens_BP.shape

  def piece(m, state, tokens, start):
    if lengths is None:
      state, logits = m.scan(state, tokens)
      return state, logits[:, -1]
    n = jnp.clip(lengths - start, 0, tokens.shape[1])
    state, logits = m.scan(state, tokens, lengths=n)
    return state, jnp.take_along_axis(logits, jnp.maximum(n - 1, 0)[:, None, None], axis=1)[:, 0]

  if P <= chunk:
    return piece(model, state, tokens_BP, 0)
  whole = P // chunk
  pieces = jnp.moveaxis(tokens_BP[:, :whole * chunk].reshape(B, whole, chunk), 1, 0)

  def body(state, x):
    tokens, start = x
    return piece(nnx.merge(graphdef, params, copy=True), state, tokens, start)

  starts = jnp.arange(whole, dtype=jnp.int32) * chunk
  state, lasts = jax.lax.scan(body, state, (pieces, starts))      # lasts [whole, B, V]
  if whole * chunk < P:
    state, rest = piece(model, state, tokens_BP[:, whole * chunk:], whole * chunk)
    lasts = jnp.concatenate([lasts, rest[None]], axis=0)
  if lengths is None:
    return state, lasts[-1]
  # row b's last prompt token, lengths[b] − 1, lies in piece (lengths[b] − 1) // chunk
  return state, lasts[(lengths - 1) // chunk, jnp.arange(B)]


@functools.partial(jax.jit, static_argnames=("graphdef", "n", "greedy", "top_k", "use_top_p", "return_logits",
                                             "ragged", "prefill_chunk"))
def decode_program(graphdef, params, prompt, lengths, temperature, top_p, key, *, n, greedy, top_k, use_top_p,
                   return_logits, ragged, prefill_chunk=PREFILL_CHUNK):
  """The compiled program behind :func:`generate` (one per set of static arguments; its ``_cache_size()``
  counts them): the prefill of ``prompt [B, L]`` (``L`` the longest prompt; with ``ragged``, rows of the
  ``lengths`` given, else all ``L``), then the decode ``lax.scan``; returns ``(tokens [B, L + n], logits
  [B, n, V] or None)``, row ``b``'s new tokens in columns ``lengths[b] .. lengths[b] + n − 1``."""
  model = nnx.merge(graphdef, params)
  B, L = prompt.shape
  state = model.init_state(B, L + n)
  state, last = prefill(model, graphdef, params, state, prompt, prefill_chunk, lengths if ragged else None)
  rows = jnp.arange(B, dtype=jnp.int32)

  def choose(last, j):
    """Row ``b``'s ``j``-th new token from the logits ``last [B, V]`` of its previous token."""
    if greedy:
      return jnp.argmax(last, axis=-1).astype(jnp.int32)
    # temperature first, then top-k and top-p (HF's order); the row's maximum subtracted so that no logit
    # overflows however small the temperature (the most likely token then stays at 0, the rest below)
    z = last.astype(jnp.float32)
    z = (z - jnp.max(z, axis=-1, keepdims=True)) / temperature
    filtered = filter_logits(z, top_k, top_p if use_top_p else None)
    # the key of (seed, the token's position in its row, the row)
    keys = jax.vmap(lambda p, b: jax.random.fold_in(jax.random.fold_in(key, p), b))(lengths + j, rows)
    return jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)

  def body(carry, j):
    state, last = carry
    token = choose(last, j)
    state, nxt = nnx.merge(graphdef, params, copy=True).step(state, token)
    return (state, nxt), (token, last if return_logits else None)

  # n − 1 steps: the last new token needs no step after it
  (_, last), (tokens, lasts) = jax.lax.scan(body, (state, last), jnp.arange(n - 1, dtype=jnp.int32))
  new = jnp.concatenate([tokens.T, choose(last, n - 1)[:, None]], axis=1)       # [B, n]
  # row b: its prompt in columns < lengths[b], its new tokens from there on, zeros after them
  columns = jnp.arange(L + n, dtype=jnp.int32)[None]
  out = jnp.where(columns < lengths[:, None], jnp.pad(prompt, ((0, 0), (0, n))), 0)
  out = out.at[rows[:, None], lengths[:, None] + jnp.arange(n, dtype=jnp.int32)[None]].set(new)
  if not return_logits:
    return out, None
  return out, jnp.concatenate([jnp.moveaxis(lasts, 0, 1), last[:, None]], axis=1)   # [B, n, V]


def generate(model: nnx.Module, prompt_BT, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: Optional[int] = None, top_p: Optional[float] = None, seed: int = 0,
             prompt_lengths: Optional[Sequence[int]] = None, return_logits: bool = False):
  """Samples ``max_new_tokens`` tokens after each prompt (module docstring: prefill, then one ``lax.scan``).

  Args:
    model: a language model that decodes (``TransformerLM`` with decoding mixers, ``UniMatrixLM``, ``DNCLM``);
      put it in eval mode first if it has dropout. Prompts of different lengths need its ``scan`` to take
      ``lengths`` (each of these models' does).
    prompt_BT: token ids ``[B, T]``, right-padded when ``prompt_lengths`` is given.
    max_new_tokens: ``n``, new tokens per row.
    temperature: divides the logits before sampling; ``0.0`` is greedy (argmax, no randomness). A Python or
      numpy number, or a 0-d jax / numpy array (concrete).
    top_k: sample among the ``k`` most likely tokens only (tokens tied with the ``k``-th stay in).
    top_p: sample among the fewest most likely tokens whose probability (after ``temperature`` and
      ``top_k``) sums to at least ``top_p`` (ties broken by token id).
    seed: any int (or a 0-d integer array): the sampling key (:func:`seed_key`); the same seed gives the same
      tokens. Row ``b``'s ``j``-th new token is drawn with the key of ``(seed, len_b + j, b)``: its samples
      depend on its own sequence, the seed and its index ``b`` only, so the row samples alike in every batch
      in which it is row ``b``, but not alone unless ``b = 0``.
    prompt_lengths: ``[B]`` prompt lengths in ``[1, T]`` (default: all ``T``).
    return_logits: also return the logits that chose each new token.

  Returns:
    tokens ``[B, T + n]`` int32: row ``b`` holds ``prompt[b, :len_b]`` in columns ``0 .. len_b − 1``, its ``n``
    new tokens in columns ``len_b .. len_b + n − 1`` (``out[:, T:]`` when every row has length ``T``) and
    zeros in the rest; with ``return_logits`` also the float32 logits ``[B, n, V]`` (before temperature and
    filtering) from which each new token was chosen (``[b, j]`` chose the token in column ``len_b + j``).

  Raises:
    ValueError: a model that cannot decode (naming the mixers without decoding), or one whose ``scan`` takes no
      ``lengths`` given prompts of different lengths; ids outside the vocabulary, bad lengths, sizes past a
      model's learned positions, or bad sampling arguments.
  """
  _check_model(model)
  prompt, lengths, temperature, top_p = _check_args(model, prompt_BT, max_new_tokens, temperature, top_k, top_p,
                                                    prompt_lengths)
  key = seed_key(seed)
  n, T, L = int(max_new_tokens), prompt.shape[1], int(lengths.max())
  ragged = bool(lengths.min() < L)
  if ragged and not _takes_lengths(model):
    raise ValueError(f"`model` ({type(model).__name__}) cannot decode prompts of different lengths: its `scan` "
                     f"takes no `lengths` (right-padded rows in one call); give prompts of one length, or add "
                     f"`lengths` to `scan` (jaxmem.models.mixers.Mixer.scan says what it must do).")
  graphdef, params = nnx.split(model)
  greedy = np.float32(temperature) == 0   # a temperature that rounds to 0 in float32 is greedy too
  # padding past the longest prompt is never read: the program sees L columns, the output gets T + n
  out, logits = decode_program(graphdef, params, jnp.asarray(prompt[:, :L]), jnp.asarray(lengths),
                               jnp.float32(temperature if not greedy else 1.0), jnp.float32(top_p or 1.0), key,
                               n=n, greedy=bool(greedy), top_k=top_k, use_top_p=top_p is not None,
                               return_logits=return_logits, ragged=ragged, prefill_chunk=PREFILL_CHUNK)
  if T > L:
    out = jnp.pad(out, ((0, 0), (0, T - L)))
  return (out, logits) if return_logits else out


__all__ = ["PREFILL_CHUNK", "decode_program", "filter_logits", "generate", "prefill", "seed_key"]
