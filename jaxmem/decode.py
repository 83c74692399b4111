"""Sampling from a trained language model: :func:`generate` (also ``jaxmem.generate``).

Any model with the decoding methods ``init_state(batch_size, max_len)``, ``scan(state, tokens [B, T]) ->
(state, logits [B, T, V])`` and ``step(state, tokens [B]) -> (state, logits [B, V])`` —
:class:`~jaxmem.models.TransformerLM` whose mixers all decode, :class:`~jaxmem.models.UniMatrixLM`,
:class:`~jaxmem.models.DNCLM` — decodes in two phases inside one compiled program:

1. **prefill**: the first ``P`` tokens of every row (``P`` = the shortest prompt) through the models' parallel /
   chunked sequence forms (``scan``), once, returning every layer's state — in pieces of
   :data:`PREFILL_CHUNK` tokens, each from the state the last left, so attention's scores stay
   ``[chunk, context]`` for long prompts;
2. **decode**: one ``lax.scan`` over the remaining ``T − P + n`` positions, a ``step`` each. At position ``p``
   row ``b`` feeds its own prompt token while ``p < len_b`` and otherwise the token sampled from its logits,
   so every row reads exactly its own sequence: its logits (and greedy tokens) equal decoding that row alone;
   sampled tokens also depend on the row's index (its key is ``(seed, position, row)``).

A softmax layer keeps a fixed-size KV cache of ``T + n`` positions with a length per row, a memory its
carried state (a matrix state's size does not grow with the context), so no shape changes from step to step.

Prompts of different lengths are **right-padded**: row ``b`` is ``prompt[b, :prompt_lengths[b]]`` (whatever
follows is ignored), and the output row ``b`` is that prompt, its ``n`` new tokens, then zeros
(``[B, T + n]`` in all).

Compiled once per (model structure, batch, prompt width ``T``, shortest prompt ``P``, ``n``, whether
``top_k`` / ``top_p`` / greedy / ``return_logits``): temperature, ``top_p``'s value, the seed and the prompt
values are arguments of the compiled program, not constants. (Batches whose shortest prompt varies compile
once per shortest length: pad to a few lengths if that matters.)
"""

from __future__ import annotations

import functools
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


def _check_args(model, prompt, max_new_tokens, temperature, top_k, top_p, prompt_lengths, seed):
  prompt = np.asarray(prompt)
  if prompt.ndim != 2 or prompt.shape[0] < 1 or prompt.shape[1] < 1:
    raise ValueError(f"`prompt` must be token ids [B, T] with B, T >= 1, got shape {prompt.shape}.")
  if not np.issubdtype(prompt.dtype, np.integer):
    raise ValueError(f"`prompt` must be integer token ids, got dtype {prompt.dtype}.")
  B, T = prompt.shape
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
    raise ValueError(f"`max_new_tokens` must be an int >= 1, got {max_new_tokens!r}.")
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
    raise ValueError(f"`seed` must be an int, got {seed!r}.")
  if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or \
      not (math.isfinite(temperature) and temperature >= 0):
    raise ValueError(f"`temperature` must be a finite number >= 0 (0: greedy), got {temperature!r}.")
  vocab = model.cfg.vocab_size
  if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                            or not 1 <= top_k <= vocab):
    raise ValueError(f"`top_k` must be None or an int in [1, vocab_size={vocab}], got {top_k!r}.")
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
  return prompt.astype(np.int32), lengths.astype(np.int32)


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


def prefill(model, graphdef, params, state, tokens_BP, chunk: int):
  """``model.scan`` over the prompt in pieces of ``chunk`` tokens (a ``lax.scan`` over the whole pieces, then
  the rest), each from the state the previous left: ``(state, logits of the last token [B, V])``. Equal to one
  ``scan`` of the whole prompt up to float32 rounding; a softmax layer's scores are ``[chunk, context]`` per
  head instead of ``[P, context]``."""
  B, P = tokens_BP.shape
  if P <= chunk:
    state, logits = model.scan(state, tokens_BP)
    return state, logits[:, -1]
  whole = P // chunk
  pieces = jnp.moveaxis(tokens_BP[:, :whole * chunk].reshape(B, whole, chunk), 1, 0)

  def body(state, piece):
    state, logits = nnx.merge(graphdef, params, copy=True).scan(state, piece)
    return state, logits[:, -1]

  state, lasts = jax.lax.scan(body, state, pieces)
  if whole * chunk == P:
    return state, lasts[-1]
  state, logits = model.scan(state, tokens_BP[:, whole * chunk:])
  return state, logits[:, -1]


@functools.partial(jax.jit, static_argnames=("graphdef", "P", "n", "greedy", "top_k", "use_top_p",
                                             "return_logits", "prefill_chunk"))
def decode_program(graphdef, params, prompt, lengths, temperature, top_p, key, *, P, n, greedy, top_k,
                   use_top_p, return_logits, prefill_chunk=PREFILL_CHUNK):
  """The compiled program behind :func:`generate` (one per set of static arguments; its ``_cache_size()``
  counts them): prefill then the decode ``lax.scan``; returns ``(tokens [B, T + n], logits [B, n, V] or
  None)``."""
  model = nnx.merge(graphdef, params)
  B, T = prompt.shape
  state = model.init_state(B, T + n)
  state, last = prefill(model, graphdef, params, state, prompt[:, :P], prefill_chunk)
  positions = jnp.arange(P, T + n, dtype=jnp.int32)

  def body(carry, p):
    state, last = carry
    if greedy:
      sampled = jnp.argmax(last, axis=-1).astype(jnp.int32)
    else:
      # temperature first, then top-k and top-p (HF's order); the row's maximum subtracted so that no logit
      # overflows however small the temperature (the most likely token then stays at 0, the rest below)
      z = last.astype(jnp.float32)
      z = (z - jnp.max(z, axis=-1, keepdims=True)) / temperature
      filtered = filter_logits(z, top_k, top_p if use_top_p else None)
      keys = jax.vmap(lambda b: jax.random.fold_in(jax.random.fold_in(key, p), b))(jnp.arange(B))
      sampled = jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)
    forced = jnp.take(prompt, jnp.minimum(p, T - 1), axis=1)
    token = jnp.where(p < lengths, forced, sampled)
    token = jnp.where(p < lengths + n, token, 0)            # after its n new tokens a row reads zeros
    state, nxt = nnx.merge(graphdef, params, copy=True).step(state, token)
    return (state, nxt), (token, last if return_logits else None)

  _, (tokens, lasts) = jax.lax.scan(body, (state, last), positions)
  out = jnp.concatenate([prompt[:, :P], tokens.T], axis=1)   # [B, T + n]
  if not return_logits:
    return out, None
  # the logits that chose row b's j-th new token were `last` at position lengths[b] + j
  lasts = jnp.moveaxis(lasts, 0, 1)                           # [B, T + n − P, V]
  idx = lengths[:, None] + jnp.arange(n)[None] - P
  return out, jnp.take_along_axis(lasts, idx[:, :, None], axis=1)


def generate(model: nnx.Module, prompt_BT, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: Optional[int] = None, top_p: Optional[float] = None, seed: int = 0,
             prompt_lengths: Optional[Sequence[int]] = None, return_logits: bool = False):
  """Samples ``max_new_tokens`` tokens after each prompt (module docstring: prefill, then one ``lax.scan``).

  Args:
    model: a language model that decodes (``TransformerLM`` with decoding mixers, ``UniMatrixLM``, ``DNCLM``);
      put it in eval mode first if it has dropout.
    prompt_BT: token ids ``[B, T]``, right-padded when ``prompt_lengths`` is given.
    max_new_tokens: ``n``, new tokens per row.
    temperature: divides the logits before sampling; ``0.0`` is greedy (argmax, no randomness).
    top_k: sample among the ``k`` most likely tokens only (tokens tied with the ``k``-th stay in).
    top_p: sample among the fewest most likely tokens whose probability (after ``temperature`` and
      ``top_k``) sums to at least ``top_p`` (ties broken by token id).
    seed: the sampling key; the same seed gives the same tokens. Row ``b``'s draws come from the key of
      ``(seed, position, b)``, so its samples depend on its own sequence and index only.
    prompt_lengths: ``[B]`` prompt lengths (default: all ``T``).
    return_logits: also return the logits that chose each new token.

  Returns:
    tokens ``[B, T + n]`` (row ``b``: its prompt, its ``n`` new tokens, zeros), and with ``return_logits`` the
    float32 logits ``[B, n, V]`` (before temperature and filtering) from which each new token was chosen.

  Raises:
    ValueError: a model that cannot decode (naming the mixers without decoding), ids outside the vocabulary,
      bad lengths, sizes past a model's learned positions, or bad sampling arguments.
  """
  _check_model(model)
  prompt, lengths = _check_args(model, prompt_BT, max_new_tokens, temperature, top_k, top_p, prompt_lengths,
                                seed)
  prompt = prompt[:, :int(lengths.max())]      # padding past the longest prompt is never read
  graphdef, params = nnx.split(model)
  greedy = np.float32(temperature) == 0   # a temperature that rounds to 0 in float32 is greedy too
  out, logits = decode_program(graphdef, params, jnp.asarray(prompt), jnp.asarray(lengths),
                          jnp.float32(temperature if not greedy else 1.0), jnp.float32(top_p or 1.0),
                          jax.random.key(seed), P=int(lengths.min()), n=int(max_new_tokens), greedy=greedy,
                          top_k=top_k, use_top_p=top_p is not None, return_logits=return_logits,
                          prefill_chunk=PREFILL_CHUNK)
  return (out, logits) if return_logits else out


__all__ = ["PREFILL_CHUNK", "decode_program", "filter_logits", "generate", "prefill"]
