"""ROSA: the next token after the longest earlier match of the current suffix.

RWKV-8's ROSA ("Rapid Online Suffix Automaton", BlinkDL, RWKV-LM ``RWKV-v8/``; the
UniMatrix paper, arXiv:2604.25930, names its previous-token path after it, see
``docs/papers/unimatrix.md``). For a token sequence ``x [T]`` and each position ``t``::

    L_t = max { L >= 1 : x[t-L+1 .. t] == x[j-L+1 .. j] for some j < t }   (0 if none)
    j_t = max { j < t : x[t-L_t+1 .. t] == x[j-L_t+1 .. j] }               (most recent)
    y_t = x[j_t + 1]   if L_t >= 1,   else none_id.

Occurrences may overlap (``x = a a a``: ``y_2 = x[2]``, matched at ``j = 1`` with ``L = 2``),
and ``j_t + 1 <= t``, so ``y_t`` depends on ``x[<= t]`` only (causal by construction).

Tie-break: among the earlier end positions of the longest matching suffix the most recent
one is used. This is what RWKV-8's reference does (``rosa`` in
``RWKV-v8/251014_rosa_onlyemb_train.py``): each automaton state keeps the latest position
at which its strings ended, updated after the prediction, and the prediction reads it at
the suffix-link parent of the new state, i.e. at the longest suffix seen before.

Two implementations, tested equal to each other and to a brute-force search:

* :func:`rosa` — pure JAX, batched, jit-able. A ``lax.scan`` over ``t`` carries the match
  lengths of every earlier end position, ``M_t[j] = [x_j == x_t] · (M_{t-1}[j-1] + 1)`` for
  ``j < t`` (``M_{t-1}[-1] = 0``), so ``L_t = max_j M_t[j]`` and ``j_t`` is the largest
  ``j`` attaining it: ``O(T)`` vector work per step, ``O(T²)`` in all. Discrete: no
  gradient.
* :func:`rosa_automaton` — the online suffix automaton in plain Python / numpy, one
  sequence at a time (:class:`SuffixAutomaton` streams tokens; :func:`rosa_automaton_batched`
  loops over a batch). The automaton itself is built in ``O(T)`` amortised transitions;
  keeping every state's most recent end position walks the new state's suffix-link path
  once per token (as RWKV-8's reference does), which is short on typical text but up to
  ``t`` states on periodic input (``a a a …``), so ``O(T²)`` in the worst case.
* :func:`rosa_init` / :func:`rosa_scan` — :func:`rosa`'s recurrence as a streaming state of fixed
  capacity ``C`` (the tokens so far and their match lengths ``M``, ``[B, C]`` each, and a count per
  row), for decoding: feeding a sequence in pieces gives :func:`rosa` of the whole, ``O(C)`` vector
  work per token. Rows may be at different positions.
"""

from __future__ import annotations

from typing import Hashable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.checks import check_rank
from jaxmem.kernels.segments import (
  check_lengths,
  check_segment_ids,
  previous_in_segment,
  segment_index,
  where_rows,
)


def _check_tokens(name: str, tokens, rank: int, layout: str) -> tuple[int, ...]:
  shape = check_rank(name, tokens, rank, layout)
  dtype = getattr(tokens, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"`{name}` must hold integer token ids, got dtype {dtype}.")
  return shape


def _check_none_id(none_id) -> int:
  if isinstance(none_id, bool) or not isinstance(none_id, (int, np.integer)):
    raise ValueError(f"`none_id` must be an integer, got {none_id!r}.")
  return int(none_id)


def rosa(tokens_BT, *, none_id: int = -1, return_length: bool = False, segment_ids=None):
  """ROSA predictions for a batch of token sequences, as a vectorised ``lax.scan``.

  Args:
    tokens_BT: ``[B, T]`` integer token ids.
    none_id: the prediction where ``x_t`` never occurred before (``L_t = 0``).
    return_length: also return the match lengths ``L_t``.
    segment_ids: ``[B, T]`` integers, packed sequences (:mod:`jaxmem.kernels.segments`): each segment is
      matched against its own earlier tokens only, as if it were a sequence of its own (padding inside a
      segment skipped); padding tokens predict ``none_id`` with length 0.

  Returns:
    ``pred_BT`` int32 ``[B, T]`` (``y_t`` above), and with ``return_length`` the tuple
    ``(pred_BT, length_BT)``, ``length_BT`` int32 ``[B, T]``.

  Raises:
    ValueError: ``tokens_BT`` not of rank 2 or not of an integer dtype; ``none_id`` not an
      integer.
  """
  B, T = _check_tokens("tokens_BT", tokens_BT, 2, "B, T")
  none_id = _check_none_id(none_id)
  x_BT = jnp.asarray(tokens_BT)
  if T == 0:
    empty = jnp.zeros((B, 0), jnp.int32)
    return (empty, empty) if return_length else empty
  j_T = jnp.arange(T, dtype=jnp.int32)
  if segment_ids is not None:
    return _rosa_segments(x_BT, check_segment_ids(segment_ids, B, T), none_id, return_length)

  def step(M_BT, t):
    x_t_B = jax.lax.dynamic_index_in_dim(x_BT, t, axis=1, keepdims=False)
    prev_BT = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), M_BT[:, :-1]], axis=1)  # M_{t-1}[j-1]
    match_BT = (x_BT == x_t_B[:, None]) & (j_T < t)[None, :]
    M_BT = jnp.where(match_BT, prev_BT + 1, 0)
    L_B = jnp.max(M_BT, axis=1)
    j_B = jnp.max(jnp.where(M_BT == L_B[:, None], j_T[None, :], -1), axis=1)  # most recent
    nxt_B = jnp.take_along_axis(x_BT, jnp.clip(j_B + 1, 0, T - 1)[:, None], axis=1)[:, 0]
    pred_B = jnp.where(L_B > 0, nxt_B.astype(jnp.int32), jnp.int32(none_id))
    return M_BT, (pred_B, L_B)

  _, (pred_TB, length_TB) = jax.lax.scan(step, jnp.zeros((B, T), jnp.int32), j_T)
  pred_BT, length_BT = pred_TB.T, length_TB.T
  return (pred_BT, length_BT) if return_length else pred_BT


def _rosa_segments(x_BT, segment_ids_BT, none_id: int, return_length: bool):
  """:func:`rosa` of packed rows: the same recurrence over the non-padding tokens of each segment. ``M[j]``
  counts matches ending at ``j`` of the current segment only; "``j − 1``" is the segment's previous
  non-padding token and "``j + 1``" its next one; ``M`` does not change at a padding token."""
  B, T = x_BT.shape
  j_T = jnp.arange(T, dtype=jnp.int32)
  run_BT = segment_index(segment_ids_BT)                        # −1 at padding
  before_BT, has_before_BT = previous_in_segment(segment_ids_BT, 1)
  valid_BT = run_BT >= 0
  # the next non-padding token of the row after j (T if none): a reversed running minimum
  at_or_after = jax.lax.cummin(jnp.where(valid_BT, j_T[None], T), axis=1, reverse=True)
  after_BT = jnp.concatenate([at_or_after[:, 1:], jnp.full((B, 1), T, jnp.int32)], axis=1)

  def step(M_BT, t):
    col = lambda a: jax.lax.dynamic_index_in_dim(a, t, axis=1, keepdims=False)
    x_t_B, run_t_B = col(x_BT), col(run_BT)
    prev_BT = jnp.where(has_before_BT, jnp.take_along_axis(M_BT, before_BT, axis=1), 0)   # M[j − 1]
    match_BT = (x_BT == x_t_B[:, None]) & (j_T < t)[None, :] & (run_BT == run_t_B[:, None])
    new_BT = jnp.where(match_BT, prev_BT + 1, 0)
    valid_B = run_t_B >= 0
    L_B = jnp.where(valid_B, jnp.max(new_BT, axis=1), 0)
    j_B = jnp.max(jnp.where(new_BT == L_B[:, None], j_T[None, :], -1), axis=1)  # most recent
    nxt_B = jnp.take_along_axis(after_BT, jnp.clip(j_B, 0, T - 1)[:, None], axis=1)
    y_B = jnp.take_along_axis(x_BT, jnp.minimum(nxt_B, T - 1), axis=1)[:, 0]
    pred_B = jnp.where(L_B > 0, y_B.astype(jnp.int32), jnp.int32(none_id))
    return jnp.where(valid_B[:, None], new_BT, M_BT), (pred_B, L_B)

  _, (pred_TB, length_TB) = jax.lax.scan(step, jnp.zeros((B, T), jnp.int32), j_T)
  return (pred_TB.T, length_TB.T) if return_length else pred_TB.T


def rosa_init(batch_size: int, capacity: int) -> dict:
  """The empty streaming state of :func:`rosa_scan` for ``batch_size`` rows of up to ``capacity`` tokens:
  ``{"tokens": [B, C] int32, "match": [B, C] int32 (M of the last token), "length": [B] int32}``."""
  for name, value in (("batch_size", batch_size), ("capacity", capacity)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
  zeros = jnp.zeros((batch_size, capacity), jnp.int32)
  return {"tokens": zeros, "match": zeros, "length": jnp.zeros((batch_size,), jnp.int32)}


def rosa_scan(state: dict, tokens_BT, *, none_id: int = -1, return_length: bool = False, lengths=None):
  """:func:`rosa` continued from a streaming state (:func:`rosa_init`): ``(state, pred_BT)``.

  Row ``b`` continues at its own position ``state["length"][b]``; the predictions equal those of
  :func:`rosa` on the row's whole sequence so far. Tokens past the capacity are not stored (under
  ``jit`` this cannot raise): keep ``length + T <= capacity``. ``lengths [B]`` (or None: all ``T``):
  right-padded rows, row ``b`` reads its first ``lengths[b]`` tokens only (the state returned is the one
  after them; the predictions at the padding are unspecified).

  Returns:
    ``(new_state, pred_BT)``, and with ``return_length`` ``(new_state, (pred_BT, length_BT))``.
  """
  B, T = _check_tokens("tokens_BT", tokens_BT, 2, "B, T")
  none_id = _check_none_id(none_id)
  C = state["tokens"].shape[1]
  j_C = jnp.arange(C, dtype=jnp.int32)
  keep_TB = None if lengths is None else \
      jnp.arange(T, dtype=jnp.int32)[:, None] < check_lengths(lengths, B, T)[None, :]

  def step(st, inputs):
    x_B, keep_B = inputs
    buf, M, t = st["tokens"], st["match"], st["length"]
    prev = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), M[:, :-1]], axis=1)   # M_{t-1}[j-1]
    M = jnp.where((buf == x_B[:, None]) & (j_C[None] < t[:, None]), prev + 1, 0)
    buf = jnp.where(j_C[None] == t[:, None], x_B[:, None], buf)
    L = jnp.max(M, axis=1)
    j = jnp.max(jnp.where(M == L[:, None], j_C[None], -1), axis=1)               # most recent
    nxt = jnp.take_along_axis(buf, jnp.clip(j + 1, 0, C - 1)[:, None], axis=1)[:, 0]
    pred = jnp.where(L > 0, nxt, jnp.int32(none_id))
    new = {"tokens": buf, "match": M, "length": t + 1}
    return (new if keep_B is None else where_rows(keep_B, new, st)), (pred, L)

  x_TB = jnp.swapaxes(jnp.asarray(tokens_BT).astype(jnp.int32), 0, 1)
  state, (pred_TB, length_TB) = jax.lax.scan(step, state, (x_TB, keep_TB))
  return state, ((pred_TB.T, length_TB.T) if return_length else pred_TB.T)


class SuffixAutomaton:
  """Online suffix automaton of a growing sequence that answers ROSA queries.

  State ``s`` represents the substrings of lengths ``(length[link[s]], length[s]]`` that
  share one set of end positions; ``last_end[s]`` is the latest of those positions among
  the tokens appended so far (``-1`` for the brand-new state of the whole sequence).
  :meth:`append` adds one token, returns ``(y_t, L_t)`` and then records ``t`` as an end
  position of every suffix of the sequence.
  """

  def __init__(self, none_id: int = -1):
    self.none_id = _check_none_id(none_id)
    self.tokens: list[Hashable] = []
    self.trans: list[dict] = [{}]     # outgoing transitions per state
    self.link: list[int] = [-1]       # suffix link; the root (state 0) has none
    self.length: list[int] = [0]      # longest string of the state
    self.last_end: list[int] = [-1]   # most recent end position of the state's strings
    self.last = 0                     # state of the whole sequence

  def _new_state(self, length: int, link: int, trans: dict, last_end: int) -> int:
    self.trans.append(trans)
    self.link.append(link)
    self.length.append(length)
    self.last_end.append(last_end)
    return len(self.length) - 1

  def append(self, token: Hashable) -> tuple[int, int]:
    """Appends ``token`` as ``x_t`` and returns ``(y_t, L_t)``."""
    t = len(self.tokens)
    self.tokens.append(token)
    cur = self._new_state(self.length[self.last] + 1, 0, {}, -1)
    p = self.last
    while p != -1 and token not in self.trans[p]:
      self.trans[p][token] = cur
      p = self.link[p]
    if p != -1:
      q = self.trans[p][token]
      if self.length[p] + 1 == self.length[q]:
        self.link[cur] = q
      else:  # split q: the clone keeps q's shorter strings (and their end positions)
        clone = self._new_state(self.length[p] + 1, self.link[q], dict(self.trans[q]),
                                self.last_end[q])
        while p != -1 and self.trans[p].get(token) == q:
          self.trans[p][token] = clone
          p = self.link[p]
        self.link[q] = clone
        self.link[cur] = clone
    self.last = cur
    # the longest suffix seen before is the longest string of cur's suffix-link parent
    parent = self.link[cur]
    match_length = self.length[parent]
    pred = self.tokens[self.last_end[parent] + 1] if match_length > 0 else self.none_id
    v = cur
    while v != -1:
      self.last_end[v] = t
      v = self.link[v]
    return pred, match_length


def rosa_automaton(tokens_T: Iterable[int], *, none_id: int = -1, return_length: bool = False):
  """ROSA of one sequence with the online suffix automaton (the reference algorithm).

  Args:
    tokens_T: ``[T]`` integer token ids (an integer array, or a sequence of ints).
    none_id: the prediction where ``x_t`` never occurred before.
    return_length: also return the match lengths.

  Returns:
    ``np.ndarray`` int32 ``[T]`` (and the int32 lengths ``[T]`` with ``return_length``).

  Raises:
    ValueError: ``tokens_T`` not of rank 1 or not integers; ``none_id`` not an integer.
  """
  arr = np.asarray(tokens_T)
  if arr.size == 0:
    arr = arr.astype(np.int32)
  _check_tokens("tokens_T", arr, 1, "T")
  sam = SuffixAutomaton(none_id)
  out = [sam.append(int(tok)) for tok in arr]
  pred_T = np.array([p for p, _ in out], np.int32)
  length_T = np.array([n for _, n in out], np.int32)
  return (pred_T, length_T) if return_length else pred_T


def rosa_automaton_batched(tokens_BT, *, none_id: int = -1, return_length: bool = False):
  """:func:`rosa_automaton` over each row of ``tokens_BT [B, T]``; returns int32 ``[B, T]``."""
  arr = np.asarray(tokens_BT)
  _check_tokens("tokens_BT", arr, 2, "B, T")
  rows = [rosa_automaton(row, none_id=none_id, return_length=True) for row in arr]
  pred_BT = np.stack([p for p, _ in rows]) if rows else np.zeros(arr.shape, np.int32)
  length_BT = np.stack([n for _, n in rows]) if rows else np.zeros(arr.shape, np.int32)
  return (pred_BT, length_BT) if return_length else pred_BT
