"""The UniMatrix paper's two token benchmarks: associative recall and three-token rules.

Liu Xiao (2026), "Associative-State Universal Transformers: Sparse Retrieval Meets
Structured Recurrence", arXiv:2604.25930; jaxmem's summary is ``docs/papers/unimatrix.md``
(sections *Associative recall* and *Corrected three-token benchmark*). Both generators are
pure, jit-able functions of a PRNG key returning ``RecallBatch(inputs [B, T] int32,
targets [B, T] int32, mask [B, T] float32)``; the mask is 1 at the last position only
(loss and accuracy there), where the target is the next token after ``inputs[:, -1]``.

**Associative recall** (:func:`recall_batch`, vocabulary :data:`RECALL_VOCAB` = 64)::

    [BOS] [k₁ v₁ SEP] … [k_P v_P SEP] filler … [QUERY k_q ANSWER]      (length T)

PAD 0, BOS 1, SEP 2, QUERY 3, ANSWER 4, keys 5–12, values 13–20, filler 21–30 (ids 31–63
unused, as in the paper). The ``P = num_pairs`` keys are distinct, and so are the ``P``
values (so answering a value present in the sequence is right ``1/P`` of the time), the
``T − 3P − 4`` filler tokens are uniform over 21–30, ``k_q`` is uniform over the
sequence's keys, and the target at the ``ANSWER`` position is ``k_q``'s value.

**Three-token benchmark** (:func:`three_token_batch`, vocabulary :data:`THREE_TOKEN_VOCAB`
= 64)::

    [task] f… [t₁ A a₁ B b₁ C c₁] f… [t₂ A a₂ …] … f… [t_R A a_R B b_R C c_R] f… [QUERY t_q]

One task token (copy, affine, gate, lookup) opens the sequence; each of the
``R = num_tags`` distinct tags (in random order) owns a record of seven tokens with its
own digits ``a, b, c ∈ [0, 8)``; the ``T − 3 − 7R`` filler tokens are spread over the
``R + 1`` gaps uniformly at random with at least one filler between consecutive records;
``[QUERY t_q]`` asks for one of the tags. The target is a class token (one of 16) computed
from the queried record by the task's rule (:func:`three_token_target`)::

    copy     a
    affine   (a + 2b + 3c) mod 16
    gate     (a·(b + 1) + c·((a XOR b) + 1)) mod 16
    lookup   table[a, b, c], a fixed random table [8, 8, 8] → [0, 16) (lookup_table)

Token ids (module constants): PAD 0; task tokens 1–4 (:data:`TASK_TOKEN0` + index in
:data:`THREE_TOKEN_TASKS`); role markers A 5, B 6, C 7; QUERY 8; digits 9–16
(:data:`DIGIT0` + d); classes 17–32 (:data:`CLASS0` + class); tags 33–40 (:data:`TAG0` +
tag); filler 41–48; ids 49–63 unused (the vocabulary is padded to 64 so one model
configuration serves both benchmarks). The default ``T = 49`` holds ``R = 4`` records
(28 tokens), the task token, ``[QUERY t_q]`` and 18 filler tokens.

:func:`recall_stream` and :func:`three_token_stream` are resumable streams
(:class:`~jaxmem.data.KeyedBatches`: the batch at position ``p`` of seed ``s`` is the
generator's batch for ``fold_in(key(s), p)``), as dicts of numpy arrays. The plain-Python
decoders :func:`decode_recall` and :func:`decode_three_token` read one sequence back.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.checks import check_positive_int
from jaxmem.data.batches import KeyedBatches


class RecallBatch(NamedTuple):
  inputs: jax.Array   # [B, T] int32
  targets: jax.Array  # [B, T] int32, meaningful where mask == 1
  mask: jax.Array     # [B, T] float32, 1 at the last position only


class ThreeTokenBatch(NamedTuple):
  """A :class:`RecallBatch` plus each row's task (index into :data:`THREE_TOKEN_TASKS`)."""
  inputs: jax.Array   # [B, T] int32
  targets: jax.Array  # [B, T] int32
  mask: jax.Array     # [B, T] float32
  task: jax.Array     # [B] int32


def _check_int_in(name: str, value, lo: int, hi: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
    raise ValueError(f"`{name}` must be an integer in [{lo}, {hi}], got {value!r}.")
  return int(value)


def _as_tokens(name: str, inputs_T) -> list[int]:
  x = np.asarray(inputs_T)
  if x.ndim != 1:
    raise ValueError(f"`{name}` must be one sequence [T], got shape {x.shape}.")
  return [int(t) for t in x]


# --- associative recall ------------------------------------------------------------------

RECALL_VOCAB = 64
PAD, BOS, SEP, QUERY, ANSWER = 0, 1, 2, 3, 4
KEY0, NUM_KEYS = 5, 8          # keys 5..12
VALUE0, NUM_VALUES = 13, 8     # values 13..20
FILLER0, NUM_FILLERS = 21, 10  # filler 21..30


def _check_recall_args(batch_size, num_pairs, seq_len) -> None:
  check_positive_int("batch_size", batch_size)
  _check_int_in("num_pairs", num_pairs, 1, NUM_KEYS)
  check_positive_int("seq_len", seq_len)
  if seq_len < 3 * num_pairs + 4:
    raise ValueError(f"`seq_len` ({seq_len}) must hold BOS, {num_pairs} `k v SEP` triples and "
                     f"`QUERY k ANSWER`: seq_len >= 3·num_pairs + 4 = {3 * num_pairs + 4}.")


def recall_batch(key: jax.Array, *, batch_size: int, num_pairs: int = 4, seq_len: int = 128) -> RecallBatch:
  """A batch of the paper's associative-recall sequences (layout: the module docstring).

  Args:
    key: PRNG key.
    batch_size: number of sequences ``B``.
    num_pairs: key/value pairs per sequence, 1–8 (the paper: 4, and 6 and 8 in its ablation).
    seq_len: sequence length ``T >= 3·num_pairs + 4`` (the paper: 128).

  Returns:
    ``RecallBatch`` of ``[B, T]`` arrays; ``targets[:, -1]`` is the queried key's value and
    ``mask`` is 1 at position ``T − 1`` only.
  """
  _check_recall_args(batch_size, num_pairs, seq_len)
  return _recall(key, batch_size=int(batch_size), num_pairs=int(num_pairs), seq_len=int(seq_len))


def _below(u: jax.Array, n: int) -> jax.Array:
  """Uniform integers in ``[0, n)`` from uniforms in ``[0, 1)``."""
  return jnp.minimum(jnp.floor(u * n).astype(jnp.int32), n - 1)


def _ranks(u: jax.Array) -> jax.Array:
  """A uniformly random permutation of ``range(u.shape[-1])`` per row (argsort of uniforms)."""
  return jnp.argsort(u, axis=-1).astype(jnp.int32)


# Each generator draws one [B, n] block of uniforms and slices it: a single PRNG call keeps
# compilation fast (a threefry call per field, under vmap, compiles several times slower).
@functools.partial(jax.jit, static_argnames=("batch_size", "num_pairs", "seq_len"))
def _recall(key, *, batch_size, num_pairs, seq_len):
  B, P, n_fill = batch_size, num_pairs, seq_len - 3 * num_pairs - 4
  u = jax.random.uniform(key, (B, NUM_KEYS + NUM_VALUES + n_fill + 1))
  keys = KEY0 + _ranks(u[:, :NUM_KEYS])[:, :P]
  values = VALUE0 + _ranks(u[:, NUM_KEYS:NUM_KEYS + NUM_VALUES])[:, :P]
  filler = FILLER0 + _below(u[:, NUM_KEYS + NUM_VALUES:-1], NUM_FILLERS)
  q = _below(u[:, -1:], P)                                               # [B, 1]
  triples = jnp.stack([keys, values, jnp.full((B, P), SEP, jnp.int32)], axis=-1).reshape(B, 3 * P)
  column = lambda t: jnp.full((B, 1), t, jnp.int32)
  tokens = jnp.concatenate([column(BOS), triples, filler, column(QUERY),
                            jnp.take_along_axis(keys, q, axis=1), column(ANSWER)], axis=1)
  last = jnp.arange(seq_len)[None, :] == seq_len - 1                     # [1, T]
  targets = jnp.where(last, jnp.take_along_axis(values, q, axis=1), 0).astype(jnp.int32)
  mask = jnp.broadcast_to(last, (B, seq_len)).astype(jnp.float32)
  return RecallBatch(tokens, targets, mask)


def recall_stream(seed: int, *, batch_size: int, num_pairs: int = 4, seq_len: int = 128) -> KeyedBatches:
  """Resumable stream of :func:`recall_batch` batches for ``seed`` (dicts ``inputs / targets /
  mask`` of numpy arrays); ``batch_at(p)`` is the batch at position ``p``, independent of history."""
  _check_recall_args(batch_size, num_pairs, seq_len)
  return KeyedBatches(recall_batch, seed, batch_size=batch_size, num_pairs=num_pairs, seq_len=seq_len)


def decode_recall(inputs_T) -> tuple[dict[int, int], int]:
  """Reads one recall sequence back, in plain Python.

  Args:
    inputs_T: one sequence ``[T]`` of token ids.

  Returns:
    ``(pairs, query)``: the ``{key token: value token}`` pairs in the context and the
    queried key token; the answer is ``pairs[query]``.

  Raises:
    ValueError: if the sequence does not follow the layout of the module docstring.
  """
  x = _as_tokens("inputs_T", inputs_T)
  if len(x) < 7 or x[0] != BOS or x[-3:-2] != [QUERY] or x[-1] != ANSWER:
    raise ValueError("`inputs_T` must start with BOS and end with `QUERY k ANSWER`.")
  pairs, i = {}, 1
  while i < len(x) - 3 and KEY0 <= x[i] < KEY0 + NUM_KEYS:
    k, v, sep = x[i:i + 3]
    if not VALUE0 <= v < VALUE0 + NUM_VALUES or sep != SEP or k in pairs:
      raise ValueError(f"malformed `k v SEP` triple {x[i:i + 3]} at position {i}.")
    pairs[k] = v
    i += 3
  if not all(FILLER0 <= t < FILLER0 + NUM_FILLERS for t in x[i:-3]):
    raise ValueError(f"non-filler token between the context and the query: {x[i:-3]}.")
  if x[-2] not in pairs:
    raise ValueError(f"the queried key {x[-2]} is not in the context.")
  return pairs, x[-2]


# --- three-token benchmark ----------------------------------------------------------------

THREE_TOKEN_VOCAB = 64
THREE_TOKEN_TASKS = ("copy", "affine", "gate", "lookup")
TT_PAD = 0
TASK_TOKEN0 = 1                           # copy 1, affine 2, gate 3, lookup 4
ROLE_A, ROLE_B, ROLE_C = 5, 6, 7
TT_QUERY = 8
DIGIT0, NUM_DIGITS = 9, 8                 # digits 9..16
CLASS0, NUM_CLASSES = 17, 16              # classes 17..32
TAG0, MAX_TAGS = 33, 8                    # tags 33..40
TT_FILLER0, TT_NUM_FILLERS = 41, 8        # filler 41..48
RECORD_LEN = 7                            # tag A a B b C c


@functools.lru_cache(maxsize=8)
def _table(seed: int) -> np.ndarray:
  table = np.random.default_rng(seed).integers(0, NUM_CLASSES, size=(NUM_DIGITS,) * 3).astype(np.int32)
  table.flags.writeable = False
  return table


def lookup_table(seed: int = 0) -> np.ndarray:
  """The lookup task's fixed random table ``[8, 8, 8] → [0, 16)`` (int32), a pure function of ``seed``."""
  _check_int_in("seed", seed, 0, 2**63 - 1)
  return _table(int(seed)).copy()


def three_token_target(task: str, a: int, b: int, c: int, table=None) -> int:
  """The class in ``[0, 16)`` that ``task`` assigns to the record ``(a, b, c)``, in plain Python.

  Args:
    task: one of :data:`THREE_TOKEN_TASKS`.
    a, b, c: the record's digits, each in ``[0, 8)``.
    table: the lookup table (``[8, 8, 8]``); ``None`` means ``lookup_table(0)``.

  Returns:
    The class; its token id is ``CLASS0 + class``.
  """
  if task not in THREE_TOKEN_TASKS:
    raise ValueError(f"`task` must be one of {list(THREE_TOKEN_TASKS)}, got {task!r}.")
  a, b, c = (_check_int_in(n, v, 0, NUM_DIGITS - 1) for n, v in (("a", a), ("b", b), ("c", c)))
  if task == "copy":
    return a
  if task == "affine":
    return (a + 2 * b + 3 * c) % 16
  if task == "gate":
    return (a * (b + 1) + c * ((a ^ b) + 1)) % 16
  table = lookup_table(0) if table is None else np.asarray(table)
  if table.shape != (NUM_DIGITS,) * 3:
    raise ValueError(f"`table` must have shape (8, 8, 8), got {table.shape}.")
  return int(table[a, b, c])


def _check_three_token_args(batch_size, tasks, seq_len, num_tags, table_seed) -> tuple[int, ...]:
  check_positive_int("batch_size", batch_size)
  if isinstance(tasks, str) or not isinstance(tasks, Sequence) or not tasks:
    raise ValueError(f"`tasks` must be a non-empty sequence of names from {list(THREE_TOKEN_TASKS)}, "
                     f"got {tasks!r}.")
  for t in tasks:
    if t not in THREE_TOKEN_TASKS:
      raise ValueError(f"`tasks` entries must be in {list(THREE_TOKEN_TASKS)}, got {t!r}.")
  if len(set(tasks)) != len(tasks):
    raise ValueError(f"`tasks` must not repeat a task, got {tuple(tasks)}.")
  _check_int_in("num_tags", num_tags, 1, MAX_TAGS)
  check_positive_int("seq_len", seq_len)
  need = 3 + RECORD_LEN * num_tags + (num_tags - 1)
  if seq_len < need:
    raise ValueError(f"`seq_len` ({seq_len}) must hold the task token, {num_tags} records, a filler "
                     f"between consecutive records and `QUERY tag`: seq_len >= 8·num_tags + 2 = {need}.")
  _check_int_in("table_seed", table_seed, 0, 2**63 - 1)
  return tuple(THREE_TOKEN_TASKS.index(t) for t in tasks)


def three_token_batch(key: jax.Array, *, batch_size: int, tasks: Sequence[str] = THREE_TOKEN_TASKS,
                      seq_len: int = 49, num_tags: int = 4, table_seed: int = 0,
                      return_task: bool = False):
  """A batch of the corrected three-token benchmark (layout: the module docstring).

  Args:
    key: PRNG key.
    batch_size: number of sequences ``B``.
    tasks: the task names to draw from, uniformly per sequence (a subset of
      :data:`THREE_TOKEN_TASKS`, no repeats).
    seq_len: sequence length ``T >= 8·num_tags + 2`` (the paper: 49).
    num_tags: records (distinct tags) per sequence, 1–8.
    table_seed: seed of the lookup task's table (:func:`lookup_table`).
    return_task: also return each row's task index into :data:`THREE_TOKEN_TASKS`.

  Returns:
    ``RecallBatch`` of ``[B, T]`` arrays (``targets[:, -1]`` is the class token
    ``CLASS0 + class``; ``mask`` is 1 at ``T − 1`` only), or ``(batch, task [B] int32)``
    with ``return_task``.
  """
  task_ids = _check_three_token_args(batch_size, tasks, seq_len, num_tags, table_seed)
  out = _three_token(key, batch_size=int(batch_size), task_ids=task_ids, seq_len=int(seq_len),
                     num_tags=int(num_tags), table_seed=int(table_seed))
  batch = RecallBatch(out.inputs, out.targets, out.mask)
  return (batch, out.task) if return_task else batch


@functools.partial(jax.jit, static_argnames=("batch_size", "task_ids", "seq_len", "num_tags", "table_seed"))
def _three_token(key, *, batch_size, task_ids, seq_len, num_tags, table_seed):
  B, R, T = batch_size, num_tags, seq_len
  table = jnp.asarray(_table(table_seed))
  n_free = T - 3 - RECORD_LEN * R - (R - 1)  # fillers beyond the mandatory separators
  widths = (1, MAX_TAGS, 3 * R, n_free + R, T, 1)  # task, tags, digits, slots, filler, query
  u = jnp.split(jax.random.uniform(key, (B, sum(widths))), np.cumsum(widths)[:-1].tolist(), axis=1)
  task = jnp.asarray(task_ids, jnp.int32)[_below(u[0][:, 0], len(task_ids))]     # [B]
  tags = _ranks(u[1])[:, :R]                                                    # [B, R], record order
  abc = _below(u[2], NUM_DIGITS).reshape(B, R, 3)
  # Records and free fillers as n_free + R items: the records take a random sorted subset of
  # the slots; record i then starts at body offset slot_i + 7·i (i records and i mandatory
  # separators precede it), so consecutive records are at least one filler apart.
  slots = jnp.sort(_ranks(u[3])[:, :R], axis=-1)
  starts = 1 + slots + RECORD_LEN * jnp.arange(R)[None, :]                     # [B, R]
  role = lambda t: jnp.full((B, R), t, jnp.int32)
  records = jnp.stack([TAG0 + tags, role(ROLE_A), DIGIT0 + abc[..., 0], role(ROLE_B), DIGIT0 + abc[..., 1],
                       role(ROLE_C), DIGIT0 + abc[..., 2]], axis=-1).reshape(B, R * RECORD_LEN)
  positions = (starts[:, :, None] + jnp.arange(RECORD_LEN)[None, None, :]).reshape(B, R * RECORD_LEN)
  tokens = TT_FILLER0 + _below(u[4], TT_NUM_FILLERS)
  tokens = tokens.at[jnp.arange(B)[:, None], positions].set(records)
  q = _below(u[5], R)                                                          # [B, 1]
  tokens = tokens.at[:, 0].set(TASK_TOKEN0 + task).at[:, T - 2].set(TT_QUERY)
  tokens = tokens.at[:, T - 1].set(TAG0 + jnp.take_along_axis(tags, q, axis=1)[:, 0])
  a, b, c = (jnp.take_along_axis(abc[..., j], q, axis=1)[:, 0] for j in range(3))
  classes = jnp.stack([a, (a + 2 * b + 3 * c) % 16, (a * (b + 1) + c * ((a ^ b) + 1)) % 16, table[a, b, c]],
                      axis=-1)                                                 # [B, 4]
  answer = CLASS0 + jnp.take_along_axis(classes, task[:, None], axis=1)        # [B, 1]
  last = jnp.arange(T)[None, :] == T - 1
  targets = jnp.where(last, answer, 0).astype(jnp.int32)
  mask = jnp.broadcast_to(last, (B, T)).astype(jnp.float32)
  return ThreeTokenBatch(tokens.astype(jnp.int32), targets, mask, task)


def _three_token_with_task(key, **kwargs) -> ThreeTokenBatch:
  batch, task = three_token_batch(key, return_task=True, **kwargs)
  return ThreeTokenBatch(*batch, task)


def three_token_stream(seed: int, *, batch_size: int, tasks: Sequence[str] = THREE_TOKEN_TASKS,
                       seq_len: int = 49, num_tags: int = 4, table_seed: int = 0) -> KeyedBatches:
  """Resumable stream of :func:`three_token_batch` batches for ``seed``: dicts of numpy
  arrays ``inputs / targets / mask`` and ``task`` (``[B]``, index into :data:`THREE_TOKEN_TASKS`)."""
  _check_three_token_args(batch_size, tasks, seq_len, num_tags, table_seed)
  return KeyedBatches(_three_token_with_task, seed, batch_size=batch_size, tasks=tuple(tasks),
                      seq_len=seq_len, num_tags=num_tags, table_seed=table_seed)


class ThreeTokenExample(NamedTuple):
  task: str                                   # one of THREE_TOKEN_TASKS
  records: dict[int, tuple[int, int, int]]    # tag index (0..7) -> digits (a, b, c), in order
  query: int                                  # the queried tag index


def decode_three_token(inputs_T) -> ThreeTokenExample:
  """Reads one three-token sequence back, in plain Python.

  Args:
    inputs_T: one sequence ``[T]`` of token ids.

  Returns:
    ``ThreeTokenExample(task, records, query)``; the answer class is
    ``three_token_target(task, *records[query], table)``.

  Raises:
    ValueError: if the sequence does not follow the layout of the module docstring.
  """
  x = _as_tokens("inputs_T", inputs_T)
  if len(x) < 3 + RECORD_LEN or not TASK_TOKEN0 <= x[0] < TASK_TOKEN0 + len(THREE_TOKEN_TASKS):
    raise ValueError("`inputs_T` must start with a task token.")
  if x[-2] != TT_QUERY or not TAG0 <= x[-1] < TAG0 + MAX_TAGS:
    raise ValueError("`inputs_T` must end with `QUERY tag`.")
  is_filler = lambda t: TT_FILLER0 <= t < TT_FILLER0 + TT_NUM_FILLERS
  is_digit = lambda t: DIGIT0 <= t < DIGIT0 + NUM_DIGITS
  records, i, body_end = {}, 1, len(x) - 2
  while i < body_end:
    if is_filler(x[i]):
      i += 1
      continue
    r = x[i:i + RECORD_LEN]
    ok = (len(r) == RECORD_LEN and TAG0 <= r[0] < TAG0 + MAX_TAGS and r[1::2] == [ROLE_A, ROLE_B, ROLE_C]
          and all(is_digit(t) for t in r[2::2]) and r[0] - TAG0 not in records)
    if not ok or (records and not is_filler(x[i - 1])):
      raise ValueError(f"malformed record {r} at position {i}.")
    records[r[0] - TAG0] = (r[2] - DIGIT0, r[4] - DIGIT0, r[6] - DIGIT0)
    i += RECORD_LEN
  if x[-1] - TAG0 not in records:
    raise ValueError(f"the queried tag {x[-1] - TAG0} has no record.")
  return ThreeTokenExample(THREE_TOKEN_TASKS[x[0] - TASK_TOKEN0], records, x[-1] - TAG0)
