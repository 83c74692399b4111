"""A byte-level subset of RULER, generated procedurally (nothing is downloaded).

Hsieh et al. (2024), "RULER: What's the Real Context Size of Your Long-Context Language
Models?"; the task definitions, prompt templates and metric follow NVIDIA/RULER
``scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,
freq_words_extraction,constants}.py`` and ``scripts/synthetic.yaml`` (rewritten here; the
word lists, which RULER takes from ``wonderwords`` and Paul Graham's essays, are replaced
by pseudo-words). The UniMatrix paper scores its small models on this subset
(``docs/papers/unimatrix.md``, *RULER subset*).

Every example is ``prompt = head + context + "\\n" + question + answer_prefix`` (ASCII, so
bytes and characters agree) with ``len(prompt) <= length``: the haystack grows one item at
a time (a noise line, a distractor needle, a listed word) while it fits, so the prompt is
within one item of ``length``. Below :func:`min_length` a task's smallest haystack does
not fit and :func:`generate` raises. All drawn strings have fixed widths, so an example's
byte length depends on ``(task, length)`` only, never on the seed.

Tasks (the context has one item per line unless stated):

* ``niah_single_1``: noise lines ``The grass is green. … There and back again.`` and one
  needle ``One of the special magic numbers for {key} is: {value}.`` (``key``: two
  pseudo-words joined by ``-``; ``value``: 7 digits). Answer: the value.
* ``niah_multikey_2``: distractor needles (at least 4, every key distinct) and the target
  needle. Answer: the queried key's value.
* ``niah_multikey_3``: as ``niah_multikey_2`` with UUID-4 keys and values
  (``One of the special magic uuids for …``).
* ``vt``: noise lines and, in order among them, one chain of 4 hops ``VAR ABCDE = 12345``,
  ``VAR FGHIJ = VAR ABCDE``, … (5-letter names, a 5-digit value). Answer: the 5 names, in
  chain order.
* ``cwe``: one line ``1. w 2. w …`` of 10 common pseudo-words listed 6 times each and the
  others once (30 and 3 times from 16,384 bytes: RULER switches at 4,096 tokens, ≈4 bytes
  per token), shuffled. Answer: the 10 common words, by first appearance.
* ``fwe``: one line of coded words (6 random letters) where the word of rank ``k`` occurs
  ``⌊n·k⁻²/ζ(2)⌋`` times (α = 2) over ``max(8, length // 200)`` words; rank 1 is the noise
  word ``...``. Answer: ranks 2–4, most frequent first.

Adaptations: RULER's one-shot demonstrations for ``vt`` and ``cwe`` are omitted (they
cost context a byte-level model does not have); distractor keys never repeat the target
key, and ``fwe`` keeps ``n ≥ 74`` so that ranks 2–5 have strictly decreasing counts (the
answer is unique); trailing spaces of answer prefixes are dropped.

Metric: RULER scores all six tasks with ``string_match_all`` (:func:`score`: the fraction
of answers contained in the prediction, case-insensitive; RULER reports it ×100), and
uses ``string_match_part`` only for its QA tasks, which are not here.

For a byte LM (vocabulary 256), :func:`encode` lays out ``prompt + completion`` for
teacher forcing, ``completion = " " + ", ".join(answers) + "."``, with the mask over the
completion bytes; :func:`ruler_batch` stacks ``batch_size`` of them.
"""

from __future__ import annotations

import functools
import math
import uuid
from typing import Callable, NamedTuple, Sequence

import numpy as np

from jaxmem.checks import check_positive_int

RULER_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe")
RULER_MAX_LENGTH = 1 << 22  # 4 MiB: the pseudo-word pools stay far from exhausted
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]         # 70
_NUM_WORDS = len(_SYLLABLES) ** 3                                   # 343,000 six-letter words
_NUM_CW, _VT_HOPS, _NIAH_DISTRACTORS_MIN = 10, 4, 4
_FWE_MIN_WORDS = 74  # n·(1/16 − 1/25)/ζ(2) >= 1: counts of ranks 4 and 5 differ
_ZETA2 = math.pi ** 2 / 6


class RulerExample(NamedTuple):
  context: str                 # the haystack
  question: str                # the question line
  answers: tuple[str, ...]     # every string the prediction must contain
  prompt: str                  # instruction + context + question + answer prefix
  task: str

  @property
  def completion(self) -> str:
    """The teacher-forced continuation of ``prompt``: ``" " + ", ".join(answers) + "."``."""
    return " " + ", ".join(self.answers) + "."


class RulerBatch(NamedTuple):
  inputs: np.ndarray   # [T] or [B, T] int32 bytes
  targets: np.ndarray  # [T] or [B, T] int32, the next byte
  mask: np.ndarray     # [T] or [B, T] float32, 1 where the target is a completion byte


def _check_task(task) -> str:
  if task not in RULER_TASKS:
    raise ValueError(f"`task` must be one of {list(RULER_TASKS)}, got {task!r}.")
  return task


def _check_seed(seed) -> int:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"`seed` must be a non-negative integer, got {seed!r}.")
  return int(seed)


# --- drawing strings ------------------------------------------------------------------------

def _distinct(rng: np.random.Generator, n: int, high: int, exclude=()) -> list[int]:
  """``n`` distinct integers from ``[0, high)``, none in ``exclude``, in drawn order."""
  out, seen = [], set(exclude)
  while len(out) < n:
    for v in rng.integers(0, high, size=n - len(out)).tolist():
      if v not in seen:
        seen.add(v)
        out.append(v)
  return out


def _word(i: int) -> str:
  s = len(_SYLLABLES)
  return _SYLLABLES[i // (s * s)] + _SYLLABLES[(i // s) % s] + _SYLLABLES[i % s]


def _word_key(i: int) -> str:
  return f"{_word(i // _NUM_WORDS)}-{_word(i % _NUM_WORDS)}"


def _letters(i: int, width: int, alphabet: str) -> str:
  out = []
  for _ in range(width):
    i, r = divmod(i, len(alphabet))
    out.append(alphabet[r])
  return "".join(out)


def _uuid(rng: np.random.Generator) -> str:
  return str(uuid.UUID(bytes=rng.bytes(16), version=4))


def _distinct_uuids(rng: np.random.Generator, n: int) -> list[str]:
  out, seen = [], set()
  while len(out) < n:
    u = _uuid(rng)
    if u not in seen:
      seen.add(u)
      out.append(u)
  return out


# --- task plans -----------------------------------------------------------------------------

class _Plan(NamedTuple):
  """A task with its haystack size ``n`` still open: the prompt is monotone in ``n``."""
  head: str
  question: str
  prefix: str
  n_min: int
  context_bytes: Callable[[int], int]
  build: Callable[[int], tuple[str, tuple[str, ...]]]  # n -> (context, answers)


def _lines_plan(head, question, prefix, answers, fixed, width, fill, n_min) -> _Plan:
  """A context of one item per line: the ``fixed`` items and ``n`` haystack items of ``width``
  bytes each; ``fill(n)`` returns all the lines in order."""
  fixed_bytes = sum(len(s) for s in fixed)

  def context_bytes(n):
    return fixed_bytes + n * width + (n + len(fixed) - 1)

  return _Plan(head, question, prefix, n_min, context_bytes, lambda n: ("\n".join(fill(n)), answers))


def _insert_one(rng, items: list[str], item: str) -> list[str]:
  """``item`` before a uniformly drawn one of ``items`` (RULER: never after the last)."""
  i = int(rng.integers(0, len(items)))
  return items[:i] + [item] + items[i:]


def _niah_plan(task: str, rng: np.random.Generator) -> _Plan:
  kind = "uuid" if task == "niah_multikey_3" else "number"

  def needle(k, v):
    return f"One of the special magic {kind}s for {k} is: {v}."

  if kind == "uuid":
    key, value = _distinct_uuids(rng, 1)[0], _uuid(rng)
  else:
    key_id = _distinct(rng, 1, _NUM_WORDS ** 2)[0]
    key, value = _word_key(key_id), str(int(rng.integers(10**6, 10**7)))
  head = (f"A special magic {kind} is hidden within the following text. Make sure to memorize it. "
          f"I will quiz you about the {kind} afterwards.\n")
  question = f"What is the special magic {kind} for {key} mentioned in the provided text?"
  prefix = f" The special magic {kind} for {key} mentioned in the provided text is"
  target = needle(key, value)

  if task == "niah_single_1":
    def fill(n):
      return _insert_one(rng, [NOISE] * n, target)
    width, n_min = len(NOISE), 1
  elif task == "niah_multikey_2":
    def fill(n):
      keys = [_word_key(i) for i in _distinct(rng, n, _NUM_WORDS ** 2, exclude=(key_id,))]
      values = rng.integers(10**6, 10**7, size=n).tolist()
      return _insert_one(rng, [needle(k, v) for k, v in zip(keys, values, strict=True)], target)
    width, n_min = len(target), _NIAH_DISTRACTORS_MIN
  else:
    def fill(n):
      keys = [k for k in _distinct_uuids(rng, n + 1) if k != key][:n]
      return _insert_one(rng, [needle(k, _uuid(rng)) for k in keys], target)
    width, n_min = len(target), _NIAH_DISTRACTORS_MIN
  return _lines_plan(head, question, prefix, (value,), [target], width, fill, n_min)


def _vt_plan(rng: np.random.Generator) -> _Plan:
  names = [_letters(i, 5, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") for i in _distinct(rng, _VT_HOPS + 1, 26**5)]
  value = str(int(rng.integers(10000, 100000)))
  chain = [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a}" for a, b in zip(names, names[1:], strict=False)]
  head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
  question = f"Question: Find all variables that are assigned the value {value} in the text above."
  prefix = (" Answer: According to the chain(s) of variable assignment in the text above, "
            f"{len(names)} variables are assigned the value {value}, they are:")

  def fill(n):
    at = set(np.sort(rng.choice(n, size=len(chain), replace=False)).tolist())
    lines, statements = [], iter(chain)
    for i in range(n):
      if i in at:                      # statement j goes right before the j-th chosen noise line
        lines.append(next(statements))
      lines.append(NOISE)
    return lines

  return _lines_plan(head, question, prefix, tuple(names), chain, len(NOISE), fill, len(chain))


def _digits_up_to(m: int) -> int:
  """``sum(len(str(i)) for i in range(1, m + 1))``."""
  total, d, lo = 0, 1, 1
  while lo <= m:
    hi = min(m, 10 * lo - 1)
    total += (hi - lo + 1) * d
    d, lo = d + 1, 10 * lo
  return total


def _cwe_plan(rng: np.random.Generator, length: int) -> _Plan:
  rc, ru = (6, 1) if length < 16384 else (30, 3)
  head = ("Below is a numbered list of words. In these words, some appear more often than others. "
          "Memorize the ones that appear most often.\n")
  question = f"Question: What are the {_NUM_CW} most common words in the above list?"
  prefix = f" Answer: The top {_NUM_CW} words that appear most often in the list are:"

  def entries(n):
    return _NUM_CW * rc + (n - _NUM_CW) * ru

  def context_bytes(n):  # "i. word" entries, one space apart; every word has 6 letters
    m = entries(n)
    return _digits_up_to(m) + m * (2 + 6) + (m - 1)

  def build(n):
    words = [_word(i) for i in _distinct(rng, n, _NUM_WORDS)]
    common = words[:_NUM_CW]
    listed = common * rc + words[_NUM_CW:] * ru
    listed = [listed[i] for i in rng.permutation(len(listed))]
    context = " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed))
    first = {w: listed.index(w) for w in common}
    return context, tuple(sorted(common, key=first.__getitem__))

  return _Plan(head, question, prefix, 2 * _NUM_CW, context_bytes, build)


def _fwe_plan(rng: np.random.Generator, length: int) -> _Plan:
  vocab_size = max(8, length // 200)
  weights = np.arange(1, vocab_size + 1, dtype=np.float64) ** -2.0 / _ZETA2
  widths = np.full(vocab_size, 6)
  widths[0] = 3  # rank 1 is the noise word "..."
  head = ("Read the following coded text and track the frequency of each coded word. "
          "Find the three most frequently appeared coded words. ")
  question = ("Question: Do not provide any explanation. Please ignore the dots '....'. "
              "What are the three most frequently appeared words in the above coded text?")
  prefix = " Answer: According to the coded text above, the three most frequently appeared words are:"

  def counts(n):
    return np.floor(n * weights).astype(np.int64)

  def context_bytes(n):
    c = counts(n)
    return int((c * widths).sum() + c.sum() - 1)

  def build(n):
    vocab = ["..."] + [_letters(i, 6, "abcdefghijklmnopqrstuvwxyz")
                       for i in _distinct(rng, vocab_size - 1, 26**6)]
    words = [w for w, c in zip(vocab, counts(n).tolist(), strict=True) for _ in range(c)]
    words = [words[i] for i in rng.permutation(len(words))]
    return " ".join(words), tuple(vocab[1:4])

  return _Plan(head, question, prefix, _FWE_MIN_WORDS, context_bytes, build)


def _plan(task: str, rng: np.random.Generator, length: int) -> _Plan:
  if task.startswith("niah"):
    return _niah_plan(task, rng)
  if task == "vt":
    return _vt_plan(rng)
  return _cwe_plan(rng, length) if task == "cwe" else _fwe_plan(rng, length)


def _prompt_bytes(plan: _Plan, n: int) -> int:
  return len(plan.head) + plan.context_bytes(n) + 1 + len(plan.question) + len(plan.prefix)


@functools.lru_cache(maxsize=None)
def _min_length(task: str, length_class: int) -> int:
  plan = _plan(task, np.random.default_rng(0), length_class)
  return _prompt_bytes(plan, plan.n_min)


def min_length(task: str) -> int:
  """The smallest ``length`` :func:`generate` accepts for ``task`` (its smallest haystack)."""
  return _min_length(_check_task(task), 0)


# --- public API -----------------------------------------------------------------------------

def generate(task: str, *, seed: int, length: int) -> RulerExample:
  """One RULER example whose prompt is at most ``length`` bytes (within one haystack item).

  Args:
    task: one of :data:`RULER_TASKS`.
    seed: non-negative integer; the example is a pure function of ``(task, seed, length)``.
    length: target byte length of ``prompt``, from :func:`min_length` to
      :data:`RULER_MAX_LENGTH`.

  Returns:
    ``RulerExample(context, question, answers, prompt, task)``.
  """
  _check_task(task)
  seed = _check_seed(seed)
  check_positive_int("length", length)
  if length > RULER_MAX_LENGTH:
    raise ValueError(f"`length` must be at most RULER_MAX_LENGTH = {RULER_MAX_LENGTH}, got {length}.")
  rng = np.random.default_rng([seed, RULER_TASKS.index(task)])
  plan = _plan(task, rng, length)
  if _prompt_bytes(plan, plan.n_min) > length:
    raise ValueError(f"`length` ({length}) is below the {_prompt_bytes(plan, plan.n_min)} bytes of "
                     f"task {task!r}'s smallest haystack (min_length).")
  lo, hi = plan.n_min, 2 * plan.n_min          # largest n with a prompt that fits: lo fits, hi not
  while _prompt_bytes(plan, hi) <= length:
    lo, hi = hi, 2 * hi
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if _prompt_bytes(plan, mid) <= length else (lo, mid)
  context, answers = plan.build(lo)
  prompt = plan.head + context + "\n" + plan.question + plan.prefix
  assert len(prompt) == _prompt_bytes(plan, lo) <= length, (task, len(prompt), length)
  return RulerExample(context, plan.question, answers, prompt, task)


def score(task: str, prediction: str, answers: Sequence[str]) -> float:
  """RULER's ``string_match_all`` in ``[0, 1]``: the fraction of ``answers`` that occur in
  ``prediction``, ignoring case (every task here uses it)."""
  _check_task(task)
  if not isinstance(prediction, str):
    raise ValueError(f"`prediction` must be a str, got {type(prediction).__name__}.")
  if isinstance(answers, str):
    answers = (answers,)
  answers = tuple(answers)
  if not answers or not all(isinstance(a, str) and a for a in answers):
    raise ValueError(f"`answers` must be a non-empty sequence of non-empty strings, got {answers!r}.")
  p = prediction.lower()
  return sum(a.lower() in p for a in answers) / len(answers)


def encode(example: RulerExample, *, answer_bytes: int | None = None,
           seq_len: int | None = None) -> RulerBatch:
  """Teacher-forcing arrays for a byte LM: ``prompt + completion`` shifted by one.

  ``inputs[t]`` is byte ``t`` of ``prompt + completion`` and ``targets[t]`` byte ``t + 1``;
  ``mask`` is 1 exactly where ``targets`` is a completion byte (``len(completion)`` of
  them, from ``t = len(prompt) − 1``); positions past the text hold 0 with mask 0.

  Args:
    example: from :func:`generate`.
    answer_bytes: bytes reserved for the completion (default: its length); at least
      ``len(example.completion)``.
    seq_len: array length ``T`` (default ``len(prompt) + answer_bytes − 1``); at least
      ``len(prompt) + len(completion) − 1``.

  Returns:
    ``RulerBatch`` of ``[T]`` numpy arrays (int32, int32, float32).
  """
  if not isinstance(example, RulerExample):
    raise ValueError(f"`example` must be a RulerExample, got {type(example).__name__}.")
  prompt, completion = example.prompt.encode("utf-8"), example.completion.encode("utf-8")
  if answer_bytes is None:
    answer_bytes = len(completion)
  check_positive_int("answer_bytes", answer_bytes)
  if answer_bytes < len(completion):
    raise ValueError(f"`answer_bytes` ({answer_bytes}) is shorter than the {len(completion)}-byte "
                     f"completion {example.completion!r}.")
  text = np.frombuffer(prompt + completion, np.uint8).astype(np.int32)
  need = text.shape[0] - 1
  if seq_len is None:
    seq_len = len(prompt) + answer_bytes - 1
  check_positive_int("seq_len", seq_len)
  if seq_len < need:
    raise ValueError(f"`seq_len` ({seq_len}) must hold prompt + completion − 1 = {need} bytes.")
  inputs, targets = np.zeros(seq_len, np.int32), np.zeros(seq_len, np.int32)
  inputs[:need], targets[:need] = text[:-1], text[1:]
  mask = np.zeros(seq_len, np.float32)
  mask[len(prompt) - 1:need] = 1.0
  return RulerBatch(inputs, targets, mask)


def ruler_batch(task: str, *, seed: int, batch_size: int, length: int, answer_bytes: int | None = None,
                return_examples: bool = False):
  """``batch_size`` encoded examples of ``task``: row ``i`` is ``generate(task, seed=seed + i,
  length=length)``, so batch ``k`` of an evaluation run takes ``seed = k·batch_size``.

  Args:
    task: one of :data:`RULER_TASKS`.
    seed: non-negative integer, the first row's seed.
    batch_size: rows ``B``.
    length: as :func:`generate`'s.
    answer_bytes: as :func:`encode`'s (default: the completion's length, which is the same
      for every seed and length of a task).
    return_examples: also return the ``B`` examples (to :func:`score` generations).

  Returns:
    ``RulerBatch`` of ``[B, T]`` arrays with ``T = length + answer_bytes − 1``, or
    ``(batch, examples)`` with ``return_examples``.
  """
  seed = _check_seed(seed)
  check_positive_int("batch_size", batch_size)
  examples = [generate(task, seed=seed + i, length=length) for i in range(batch_size)]
  if answer_bytes is None:
    answer_bytes = max(len(e.completion.encode("utf-8")) for e in examples)
  check_positive_int("answer_bytes", answer_bytes)
  rows = [encode(e, answer_bytes=answer_bytes, seq_len=length + answer_bytes - 1) for e in examples]
  batch = RulerBatch(*(np.stack(x) for x in zip(*rows, strict=True)))
  return (batch, examples) if return_examples else batch
