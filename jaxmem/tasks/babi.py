"""bAbI-style question answering: a procedural generator, a loader for the real files, an encoder.

The real bAbI tasks (Weston et al. 2015, "Towards AI-Complete Question Answering: A Set of
Prerequisite Toy Tasks", arXiv:1502.05698) cannot be downloaded here. This module offers:

* :func:`generate_babi` — a procedural generator, deterministic per seed, for three of the
  twenty tasks, in the same style (names, places, objects and the sentence forms of the
  real data): **1** single supporting fact ("Where is Mary?"), **2** two supporting facts
  ("Where is the football?"), **7** counting ("How many objects is Daniel carrying?").
  It simulates a small world while writing the story, so answers and supporting facts are
  correct by construction. It is *not* the Facebook generator: sentence and question mixes
  differ, and each example holds exactly one question.
* :func:`load_babi` — a reader for a user-supplied copy of the real files
  (``qa1_single-supporting-fact_train.txt``, ...), returning the same :class:`BabiExample`.
* :class:`Vocabulary` and :func:`encode_examples` — integer arrays for a model.

World rules of the generator (tasks 2 and 7): a person carries what they picked up and
takes it along when moving; a person can pick up an object only when their own location is
known, nobody holds the object, and the object is either not yet placed or lies where the
person is; a dropped object stays where its holder was.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any, Iterable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.checks import check_choice, check_positive_int

TASK_IDS = (1, 2, 7)

PEOPLE = ("Mary", "John", "Sandra", "Daniel")
PLACES = ("kitchen", "garden", "hallway", "bathroom", "bedroom", "office")
OBJECTS = ("football", "apple", "milk")
MOVE_VERBS = ("went to", "journeyed to", "travelled to", "moved to", "went back to")
PICK_VERBS = ("picked up", "got", "grabbed", "took")
DROP_VERBS = ("dropped", "discarded", "put down", "left")
NUMBER_WORDS = ("none", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")

PAD, UNK = "<pad>", "<unk>"


@dataclasses.dataclass(frozen=True)
class BabiExample:
  """One question about one story.

  ``story``: the statement sentences before the question (questions of the same story in
  the real files are not included), e.g. ``"Mary went to the kitchen."``; ``supporting``:
  0-based indices into ``story`` of the facts the answer follows from.
  """
  story: tuple[str, ...]
  question: str
  answer: str
  supporting: tuple[int, ...]
  task_id: int


def tokenize(text: str) -> list[str]:
  """Lower-cased words; punctuation dropped: ``"Where is Mary?" -> ["where", "is", "mary"]``."""
  return re.findall(r"[a-z0-9]+", text.lower())


# ---------------------------------------------------------------------------- generator


def _rng_from_seed(seed: Any) -> np.random.Generator:
  """``np.random.default_rng`` from an int, or from the bits of a ``jax.random`` key."""
  if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
    if seed < 0:
      raise ValueError(f"`seed` must be a non-negative integer or a jax.random key, got {seed!r}.")
    return np.random.default_rng(int(seed))
  dtype = getattr(seed, "dtype", None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    seed = jax.random.key_data(seed)
    dtype = seed.dtype
  if dtype == jnp.uint32 and np.ndim(seed) == 1:
    return np.random.default_rng([int(v) for v in np.asarray(seed)])
  raise ValueError(f"`seed` must be a non-negative integer or a jax.random key, got {seed!r}.")


class _World:
  """The state the generator writes a story from (locations, who holds what)."""

  def __init__(self):
    self.person_at: dict[str, str] = {}
    self.last_move: dict[str, int] = {}        # person -> sentence index of their last move
    self.holder: dict[str, str] = {}           # object -> person holding it
    self.object_at: dict[str, str] = {}        # object -> place where it lies (not held)
    self.object_fact: dict[str, int] = {}      # object -> index of its last pick/drop
    self.drop_support: dict[str, int] = {}     # dropped object -> holder's move before the drop
    self.handling: dict[str, list[int]] = {}   # person -> indices of their picks and drops

  def where_object(self, obj: str) -> str | None:
    if obj in self.holder:
      return self.person_at[self.holder[obj]]
    return self.object_at.get(obj)

  def actions(self) -> list[tuple[str, str, str]]:
    acts = [("move", p, place) for p in PEOPLE for place in PLACES if self.person_at.get(p) != place]
    for p in PEOPLE:
      if p not in self.person_at:
        continue
      for obj in OBJECTS:
        if obj not in self.holder and self.object_at.get(obj, self.person_at[p]) == self.person_at[p]:
          acts.append(("pick", p, obj))
        if self.holder.get(obj) == p:
          acts.append(("drop", p, obj))
    return acts

  def apply(self, act: tuple[str, str, str], index: int) -> None:
    kind, p, what = act
    if kind == "move":
      self.person_at[p] = what
      self.last_move[p] = index
    elif kind == "pick":
      self.holder[what] = p
      self.object_at.pop(what, None)
      self.drop_support.pop(what, None)
      self.object_fact[what] = index
      self.handling.setdefault(p, []).append(index)
    else:
      del self.holder[what]
      self.object_at[what] = self.person_at[p]
      self.object_fact[what] = index
      self.drop_support[what] = self.last_move[p]
      self.handling.setdefault(p, []).append(index)


def _sentence(act: tuple[str, str, str], rng: np.random.Generator) -> str:
  kind, p, what = act
  verbs = {"move": MOVE_VERBS, "pick": PICK_VERBS, "drop": DROP_VERBS}[kind]
  return f"{p} {verbs[rng.integers(len(verbs))]} the {what}."


def _choose(rng: np.random.Generator, acts: list[tuple[str, str, str]], task_id: int):
  if task_id == 1:
    acts = [a for a in acts if a[0] == "move"]
  else:  # Favour object handling so that stories carry objects around.
    kinds = sorted({a[0] for a in acts})
    weights = {"move": 0.45, "pick": 0.35, "drop": 0.2}
    w = np.array([weights[k] for k in kinds])
    kind = kinds[rng.choice(len(kinds), p=w / w.sum())]
    acts = [a for a in acts if a[0] == kind]
  return acts[rng.integers(len(acts))]


def _question(world: _World, rng: np.random.Generator, task_id: int):
  """A (question, answer, supporting) the story answers, or None if there is none yet."""
  if task_id == 1:
    p = sorted(world.person_at)[rng.integers(len(world.person_at))]
    return f"Where is {p}?", world.person_at[p], (world.last_move[p],)
  if task_id == 2:
    placed = [o for o in OBJECTS if world.where_object(o) is not None]
    if not placed:
      return None
    obj = placed[rng.integers(len(placed))]
    if obj in world.holder:
      support = (world.object_fact[obj], world.last_move[world.holder[obj]])
    else:
      support = (world.object_fact[obj], world.drop_support[obj])
    return f"Where is the {obj}?", world.where_object(obj), tuple(sorted(set(support)))
  handlers = sorted(world.handling)
  if not handlers:
    return None
  p = handlers[rng.integers(len(handlers))]
  count = sum(1 for o in OBJECTS if world.holder.get(o) == p)
  return f"How many objects is {p} carrying?", NUMBER_WORDS[count], tuple(world.handling[p])


def generate_babi(task_id: int, n_examples: int, seed: Any, *, min_sentences: int = 2,
                  max_sentences: int = 10) -> list[BabiExample]:
  """``n_examples`` procedural bAbI-style examples of task 1, 2 or 7 (see module docstring).

  Each story has ``S ~ U{min_sentences..max_sentences}`` sentences (drawn again, with a new
  story, in the rare case that no question can be asked of it) and one question about the
  world at the end of the story. ``seed``: a non-negative int or a ``jax.random`` key; the
  same seed gives the same examples. Task 1 stories contain only moves; tasks 2 and 7 mix
  moves, pick-ups and drops. Answers: a place (1, 2) or a number word ``"none"``,
  ``"one"``, ... (7, as in the real task).
  """
  check_choice("task_id", task_id, TASK_IDS)
  check_positive_int("n_examples", n_examples)
  check_positive_int("min_sentences", min_sentences)
  check_positive_int("max_sentences", max_sentences)
  if min_sentences > max_sentences:
    raise ValueError(f"`min_sentences` ({min_sentences}) must be <= `max_sentences` ({max_sentences}).")
  rng = _rng_from_seed(seed)
  examples = []
  while len(examples) < n_examples:
    world, story = _World(), []
    for i in range(int(rng.integers(min_sentences, max_sentences + 1))):
      act = _choose(rng, world.actions(), task_id)
      story.append(_sentence(act, rng))
      world.apply(act, i)
    qa = _question(world, rng, task_id)
    if qa is not None:
      examples.append(BabiExample(tuple(story), qa[0], qa[1], qa[2], task_id))
  return examples


# ------------------------------------------------------------------------------- loader

_SPLITS = ("train", "valid", "test")


def _babi_files(path: pathlib.Path, task_id: int, split: str) -> list[pathlib.Path]:
  patterns = (f"qa{task_id}_*_{split}.txt", f"qa{task_id}_{split}.txt")
  return sorted({f for pattern in patterns for f in path.glob(pattern)})


def load_babi(path: str | pathlib.Path, task_id: int, split: str = "train") -> list[BabiExample]:
  """Reads a local copy of the real bAbI data, one :class:`BabiExample` per question.

  ``path``: a file, or a folder holding ``qa{task_id}_<name>_{split}.txt`` (e.g.
  ``tasks_1-20_v1-2/en/qa1_single-supporting-fact_train.txt``) or ``qa{task_id}_{split}.txt``
  (the ``en-valid`` layout). Format: numbered lines; ``n sentence`` is a statement,
  ``n question<TAB>answer<TAB>supporting ids`` a question; number 1 starts a new story.
  Each question's story is the statements of its story before it; supporting line numbers
  become indices into that list. ``split`` is one of ``train``, ``valid``, ``test``.
  """
  if isinstance(task_id, bool) or not isinstance(task_id, int) or not 1 <= task_id <= 20:
    raise ValueError(f"`task_id` must be an integer in 1..20, got {task_id!r}.")
  check_choice("split", split, _SPLITS)
  path = pathlib.Path(path).expanduser()
  if path.is_file():
    file = path
  else:
    files = _babi_files(path, task_id, split) if path.is_dir() else []
    if not files:
      raise FileNotFoundError(
          f"bAbI task {task_id} ({split}) not found: looked for qa{task_id}_*_{split}.txt and "
          f"qa{task_id}_{split}.txt in {str(path)!r}"
          f"{'' if path.is_dir() else ' (no such folder)'}. bAbI cannot be downloaded here: "
          "supply a local copy of the dataset (e.g. the folder tasks_1-20_v1-2/en from "
          "https://research.facebook.com/downloads/babi/) and pass its path, or use "
          "jaxmem.tasks.generate_babi for procedural bAbI-style data.")
    if len(files) > 1:
      raise ValueError(f"`path` {str(path)!r} holds several files for task {task_id} ({split}): "
                       f"{[f.name for f in files]}; pass one of them.")
    file = files[0]
  return parse_babi(file.read_text(encoding="utf-8").splitlines(), task_id, source=str(file))


def parse_babi(lines: Iterable[str], task_id: int, source: str = "<lines>") -> list[BabiExample]:
  """Parses lines in the bAbI file format (see :func:`load_babi`)."""
  examples: list[BabiExample] = []
  story: list[str] = []
  index_of: dict[int, int] = {}  # line number -> index into `story`
  for lineno, raw in enumerate(lines, start=1):
    line = raw.strip()
    if not line:
      continue
    number, _, text = line.partition(" ")
    if not number.isdigit() or not text:
      raise ValueError(f"{source}:{lineno}: expected 'number text', got {raw!r}.")
    n = int(number)
    if n == 1:
      story, index_of = [], {}
    if "\t" not in text:
      index_of[n] = len(story)
      story.append(text.strip())
      continue
    fields = [f.strip() for f in text.split("\t")]
    if len(fields) < 2 or not fields[1]:
      raise ValueError(f"{source}:{lineno}: a question line needs 'question<TAB>answer', got {raw!r}.")
    ids = fields[2].split() if len(fields) > 2 else []
    try:
      supporting = tuple(index_of[int(i)] for i in ids)
    except (KeyError, ValueError):
      raise ValueError(f"{source}:{lineno}: supporting ids {ids} are not statements of this story.") from None
    examples.append(BabiExample(tuple(story), fields[0], fields[1], supporting, task_id))
  return examples


# ---------------------------------------------------------------------------- encoding


class Vocabulary:
  """Word <-> id. Id 0 is ``<pad>``, id 1 is ``<unk>`` (any word not in the vocabulary)."""

  def __init__(self, words: Iterable[str] = ()):
    self._words = [PAD, UNK]
    self._ids = {PAD: 0, UNK: 1}
    for w in words:
      self.add(w)

  @classmethod
  def from_examples(cls, examples: Sequence[BabiExample]) -> Vocabulary:
    """All story and question words, and every answer as one word (e.g. ``apple,football``)."""
    words = set()
    for ex in examples:
      for sentence in (*ex.story, ex.question):
        words.update(tokenize(sentence))
      words.add(ex.answer.lower())
    return cls(sorted(words))

  @classmethod
  def for_generator(cls) -> Vocabulary:
    """Every word :func:`generate_babi` can write, in a fixed order (same ids everywhere)."""
    words = {"the", "where", "is", "how", "many", "objects", "carrying", *NUMBER_WORDS}
    for group in (PEOPLE, PLACES, OBJECTS, MOVE_VERBS, PICK_VERBS, DROP_VERBS):
      for phrase in group:
        words.update(tokenize(phrase))
    return cls(sorted(words))

  def add(self, word: str) -> int:
    if word not in self._ids:
      self._ids[word] = len(self._words)
      self._words.append(word)
    return self._ids[word]

  def __len__(self) -> int:
    return len(self._words)

  def __contains__(self, word: str) -> bool:
    return word in self._ids

  @property
  def words(self) -> tuple[str, ...]:
    return tuple(self._words)

  def id(self, word: str) -> int:
    return self._ids.get(word, 1)

  def word(self, i: int) -> str:
    return self._words[i]

  def encode(self, words: Iterable[str]) -> list[int]:
    return [self.id(w) for w in words]

  def decode(self, ids: Iterable[int], *, skip_pad: bool = True) -> list[str]:
    return [self._words[int(i)] for i in ids if not (skip_pad and int(i) == 0)]


class EncodedBabi(NamedTuple):
  """Integer arrays for ``N`` examples (numpy; 0 is padding)."""
  story: np.ndarray         # [N, S, W] int32: word ids, sentence s of example n
  story_length: np.ndarray  # [N] int32: number of sentences kept (<= S)
  question: np.ndarray      # [N, W] int32
  answer: np.ndarray        # [N] int32: vocabulary id of the answer (whole answer = one word)
  supporting: np.ndarray    # [N, S] float32: 1 at the supporting sentences kept


def encode_examples(examples: Sequence[BabiExample], vocab: Vocabulary, max_story_len: int | None = None,
                    max_sentence_len: int | None = None) -> EncodedBabi:
  """Encodes examples as padded word-id arrays (``S = max_story_len``, ``W = max_sentence_len``).

  ``None`` sizes become the largest in ``examples``. A story longer than ``max_story_len``
  keeps its **last** ``max_story_len`` sentences (as MemN2N, Sukhbaatar et al. 2015) and
  the supporting facts among them; a sentence or question longer than ``max_sentence_len``
  is an error. Words go through :func:`tokenize`; the answer is one vocabulary entry
  (lower-cased). Unknown words map to ``<unk>`` (id 1).
  """
  if len(examples) == 0:
    raise ValueError("`examples` must not be empty.")
  stories = [[tokenize(s) for s in ex.story] for ex in examples]
  questions = [tokenize(ex.question) for ex in examples]
  longest_sentence = max(len(w) for w in questions + [w for st in stories for w in st])
  if max_story_len is None:
    max_story_len = max(1, max(len(st) for st in stories))
  if max_sentence_len is None:
    max_sentence_len = longest_sentence
  check_positive_int("max_story_len", max_story_len)
  check_positive_int("max_sentence_len", max_sentence_len)
  if longest_sentence > max_sentence_len:
    raise ValueError(f"`max_sentence_len` ({max_sentence_len}) is shorter than a sentence or question "
                     f"of {longest_sentence} words in `examples`.")
  N, S, W = len(examples), max_story_len, max_sentence_len
  story_NSW = np.zeros((N, S, W), np.int32)
  length_N = np.zeros((N,), np.int32)
  question_NW = np.zeros((N, W), np.int32)
  answer_N = np.zeros((N,), np.int32)
  supporting_NS = np.zeros((N, S), np.float32)
  for n, (ex, sentences, q) in enumerate(zip(examples, stories, questions, strict=True)):
    first = max(0, len(sentences) - S)
    for s, words in enumerate(sentences[first:]):
      story_NSW[n, s, :len(words)] = vocab.encode(words)
    length_N[n] = len(sentences) - first
    question_NW[n, :len(q)] = vocab.encode(q)
    answer_N[n] = vocab.id(ex.answer.lower())
    for i in ex.supporting:
      if i >= first:
        supporting_NS[n, i - first] = 1.0
  return EncodedBabi(story_NSW, length_N, question_NW, answer_N, supporting_NS)
