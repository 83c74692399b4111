"""bAbI-style generator (checked by an independent replay of the text), encoder and loader."""

import re

import jax
import numpy as np
import pytest

from jaxmem.tasks import (
    BabiExample,
    Vocabulary,
    encode_examples,
    generate_babi,
    load_babi,
    parse_babi,
    tokenize,
)

# The test's own reading of the story language (not imported from the module under test).
TEST_PLACES = {"kitchen", "garden", "hallway", "bathroom", "bedroom", "office"}
TEST_OBJECTS = {"football", "apple", "milk"}
TEST_PICK = {"picked up", "got", "grabbed", "took"}
TEST_DROP = {"dropped", "discarded", "put down", "left"}
COUNT_WORDS = ["none", "one", "two", "three", "four"]
SENTENCE = re.compile(r"^([A-Z][a-z]+) ([a-z ]+) the ([a-z]+)\.$")


def parse_sentence(sentence):
  person, verb, what = SENTENCE.match(sentence).groups()
  if what in TEST_PLACES:
    return "move", person, what
  assert what in TEST_OBJECTS, sentence
  if verb in TEST_PICK:
    return "pick", person, what
  assert verb in TEST_DROP, sentence
  return "drop", person, what


def replay(sentences, strict=True):
  """Replays sentences; strict mode asserts every action is possible in the world so far."""
  at, holder, lies = {}, {}, {}
  for sentence in sentences:
    kind, person, what = parse_sentence(sentence)
    if kind == "move":
      at[person] = what
    elif kind == "pick":
      if strict:
        assert person in at and what not in holder, sentence
        assert lies.get(what, at[person]) == at[person], sentence
      holder[what] = person
      lies.pop(what, None)
    else:
      if strict:
        assert holder.get(what) == person, sentence
      holder.pop(what, None)
      lies[what] = at.get(person)
  return at, holder, lies


def answer_from(world, question):
  at, holder, lies = world
  if m := re.fullmatch(r"Where is ([A-Z][a-z]+)\?", question):
    return at.get(m.group(1))
  if m := re.fullmatch(r"Where is the ([a-z]+)\?", question):
    obj = m.group(1)
    return at.get(holder[obj]) if obj in holder else lies.get(obj)
  m = re.fullmatch(r"How many objects is ([A-Z][a-z]+) carrying\?", question)
  return COUNT_WORDS[sum(1 for p in holder.values() if p == m.group(1))]


@pytest.mark.parametrize("task_id", [1, 2, 7])
def test_generated_answers_match_an_independent_replay(task_id):
  examples = generate_babi(task_id, 150, seed=task_id, min_sentences=2, max_sentences=12)
  assert len(examples) == 150
  answers = set()
  for ex in examples:
    assert isinstance(ex, BabiExample) and ex.task_id == task_id
    assert 2 <= len(ex.story) <= 12
    assert ex.answer == answer_from(replay(ex.story), ex.question), ex
    answers.add(ex.answer)
    # The supporting facts alone (replayed leniently) give the same answer.
    assert ex.supporting and all(0 <= i < len(ex.story) for i in ex.supporting)
    support = [ex.story[i] for i in sorted(ex.supporting)]
    assert ex.answer == answer_from(replay(support, strict=False), ex.question), ex
    if task_id == 1:
      assert len(ex.supporting) == 1 and ex.question.startswith("Where is ")
      assert all(parse_sentence(s)[0] == "move" for s in ex.story)
    elif task_id == 2:
      assert len(ex.supporting) == 2 and ex.question.startswith("Where is the ")
  assert len(answers) > 2  # not a constant answer
  kinds = {parse_sentence(s)[0] for ex in examples for s in ex.story}
  assert kinds == ({"move"} if task_id == 1 else {"move", "pick", "drop"})


def test_generator_is_deterministic_per_seed():
  a = generate_babi(2, 20, seed=5)
  assert a == generate_babi(2, 20, seed=5)
  assert a != generate_babi(2, 20, seed=6)
  k = jax.random.key(3)
  assert generate_babi(7, 10, seed=k) == generate_babi(7, 10, seed=jax.random.key(3))
  assert generate_babi(7, 10, seed=k) != generate_babi(7, 10, seed=jax.random.key(4))
  assert generate_babi(7, 10, seed=jax.random.PRNGKey(3)) == generate_babi(7, 10, seed=jax.random.PRNGKey(3))


@pytest.mark.parametrize("kwargs,name", [
    (dict(task_id=3, n_examples=2, seed=0), "task_id"),
    (dict(task_id=1, n_examples=0, seed=0), "n_examples"),
    (dict(task_id=1, n_examples=2, seed=-1), "seed"),
    (dict(task_id=1, n_examples=2, seed="x"), "seed"),
    (dict(task_id=1, n_examples=2, seed=0, min_sentences=5, max_sentences=4), "min_sentences"),
    (dict(task_id=1, n_examples=2, seed=0, min_sentences=0), "min_sentences"),
])
def test_generator_bad_arguments(kwargs, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    generate_babi(**kwargs)


def test_vocabulary_and_encoding_round_trip():
  examples = [ex for t in (1, 2, 7) for ex in generate_babi(t, 20, seed=11)]
  vocab = Vocabulary.for_generator()
  assert vocab.word(0) == "<pad>" and vocab.word(1) == "<unk>" and vocab.id("zebra") == 1
  enc = encode_examples(examples, vocab)
  N = len(examples)
  S = max(len(ex.story) for ex in examples)
  W = max(len(tokenize(s)) for ex in examples for s in (*ex.story, ex.question))
  assert enc.story.shape == (N, S, W) and enc.story.dtype == np.int32
  assert enc.question.shape == (N, W) and enc.answer.shape == (N,) and enc.supporting.shape == (N, S)
  assert not np.any(enc.story == 1) and not np.any(enc.question == 1)  # every word known
  for n, ex in enumerate(examples):
    assert enc.story_length[n] == len(ex.story)
    for s, sentence in enumerate(ex.story):
      assert vocab.decode(enc.story[n, s]) == tokenize(sentence)
    assert not enc.story[n, len(ex.story):].any()
    assert vocab.decode(enc.question[n]) == tokenize(ex.question)
    assert vocab.word(int(enc.answer[n])) == ex.answer
    assert sorted(np.flatnonzero(enc.supporting[n])) == sorted(ex.supporting)
  # Vocabulary built from the examples encodes the same words (ids may differ).
  own = Vocabulary.from_examples(examples)
  enc2 = encode_examples(examples, own, S, W)
  assert [own.decode(r) for r in enc2.question] == [vocab.decode(r) for r in enc.question]


def test_encoding_keeps_the_last_sentences_and_checks_lengths():
  ex = BabiExample(("Mary went to the kitchen.", "John got the milk.", "Mary went to the garden."),
                   "Where is Mary?", "garden", (0, 2), 1)
  vocab = Vocabulary(["mary", "went", "to", "the", "kitchen", "garden", "where", "is"])
  enc = encode_examples([ex], vocab, max_story_len=2, max_sentence_len=6)
  assert enc.story_length[0] == 2
  assert vocab.decode(enc.story[0, 0]) == ["<unk>", "<unk>", "the", "<unk>"]  # john got the milk
  assert vocab.decode(enc.story[0, 1]) == ["mary", "went", "to", "the", "garden"]
  np.testing.assert_array_equal(enc.supporting[0], [0.0, 1.0])  # fact 0 was dropped
  with pytest.raises(ValueError, match="`max_sentence_len`"):
    encode_examples([ex], vocab, max_story_len=3, max_sentence_len=4)
  with pytest.raises(ValueError, match="`max_story_len`"):
    encode_examples([ex], vocab, max_story_len=0, max_sentence_len=6)
  with pytest.raises(ValueError, match="`examples`"):
    encode_examples([], vocab)


# A hand-written sample in the real bAbI format (note the space before the tab, as in the files).
QA1 = """1 Mary moved to the bathroom.
2 John went to the hallway.
3 Where is Mary? \tbathroom\t1
4 Daniel went back to the hallway.
5 Sandra moved to the garden.
6 Where is Daniel? \thallway\t4
1 Sandra travelled to the office.
2 Where is Sandra? \toffice\t1
"""
QA2 = """1 Mary got the milk there.
2 John moved to the bedroom.
3 Mary travelled to the hallway.
4 Where is the milk? \thallway\t3 1
"""


def test_loader_parses_the_real_format(tmp_path):
  (tmp_path / "qa1_single-supporting-fact_train.txt").write_text(QA1)
  (tmp_path / "qa10_indefinite-knowledge_train.txt").write_text("1 Nothing here.\n")
  (tmp_path / "qa2_two-supporting-facts_test.txt").write_text(QA2)
  examples = load_babi(tmp_path, 1, "train")
  assert examples == [
      BabiExample(("Mary moved to the bathroom.", "John went to the hallway."), "Where is Mary?",
                  "bathroom", (0,), 1),
      BabiExample(("Mary moved to the bathroom.", "John went to the hallway.",
                   "Daniel went back to the hallway.", "Sandra moved to the garden."),
                  "Where is Daniel?", "hallway", (2,), 1),
      BabiExample(("Sandra travelled to the office.",), "Where is Sandra?", "office", (0,), 1),
  ]
  assert load_babi(tmp_path / "qa1_single-supporting-fact_train.txt", 1) == examples
  (qa2,) = load_babi(str(tmp_path), 2, "test")
  assert qa2.supporting == (2, 0) and qa2.answer == "hallway" and len(qa2.story) == 3
  # en-valid layout: qa1_valid.txt
  (tmp_path / "qa1_valid.txt").write_text(QA1)
  assert load_babi(tmp_path, 1, "valid") == examples


def test_generated_examples_survive_the_file_format(tmp_path):
  examples = generate_babi(2, 30, seed=2)
  lines = []
  for ex in examples:  # one story per question, numbered from 1, as in the files
    lines += [f"{i + 1} {s}" for i, s in enumerate(ex.story)]
    ids = " ".join(str(i + 1) for i in ex.supporting)
    lines.append(f"{len(ex.story) + 1} {ex.question} \t{ex.answer}\t{ids}")
  (tmp_path / "qa2_two-supporting-facts_train.txt").write_text("\n".join(lines) + "\n")
  assert load_babi(tmp_path, 2) == examples


def test_loader_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="cannot be downloaded") as err:
    load_babi(tmp_path, 1, "train")
  assert str(tmp_path) in str(err.value) and "qa1_*_train.txt" in str(err.value)
  with pytest.raises(FileNotFoundError, match="no such folder"):
    load_babi(tmp_path / "missing", 1, "train")
  with pytest.raises(ValueError, match="`split`"):
    load_babi(tmp_path, 1, "dev")
  with pytest.raises(ValueError, match="`task_id`"):
    load_babi(tmp_path, 21, "train")
  (tmp_path / "qa1_a_train.txt").write_text(QA1)
  (tmp_path / "qa1_b_train.txt").write_text(QA1)
  with pytest.raises(ValueError, match="several files"):
    load_babi(tmp_path, 1, "train")
  with pytest.raises(ValueError, match="supporting ids"):
    parse_babi(["1 Mary went to the office.", "2 Where is Mary?\toffice\t5"], 1)
  with pytest.raises(ValueError, match="<lines>:1"):
    parse_babi(["Mary went to the office."], 1)
