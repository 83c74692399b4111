"""RULER subset: every answer recomputed from the context text by the test's own checker."""

import collections
import re

import numpy as np
import pytest

from jaxmem.tasks.ruler import (
    RULER_MAX_LENGTH,
    RULER_TASKS,
    RulerExample,
    encode,
    generate,
    min_length,
    ruler_batch,
    score,
)

# --- the test's own reading of each task ------------------------------------------------

NOISE_LINE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for (\S+) is: (\S+)\.")


def check_niah(ex, task):
  kind = "uuid" if task == "niah_multikey_3" else "number"
  key = re.fullmatch(rf"What is the special magic {kind} for (\S+) mentioned in the provided text\?",
                     ex.question).group(1)
  lines = ex.context.split("\n")
  needles = [NEEDLE.fullmatch(line) for line in lines]
  found = [m.groups() for m in needles if m]
  assert all(k == kind + "s" for k, _, _ in found)
  value_of = collections.defaultdict(list)
  for _, k, v in found:
    value_of[k].append(v)
  assert len(value_of[key]) == 1, "the queried key must have exactly one needle"
  if task == "niah_single_1":
    assert len(found) == 1 and all(line == NOISE_LINE for line, m in zip(lines, needles, strict=True) if not m)
    assert re.fullmatch(r"[a-z]{6}-[a-z]{6}", key) and re.fullmatch(r"[1-9]\d{6}", value_of[key][0])
  else:
    assert all(needles), "a multikey haystack is made of needles only"
    assert len(found) >= 5 and len(value_of) == len(found), "keys are distinct"
    pattern = UUID if task == "niah_multikey_3" else r"[1-9]\d{6}"
    assert all(re.fullmatch(pattern, v) for _, _, v in found)
    if task == "niah_multikey_3":
      assert re.fullmatch(UUID, key)
  return (value_of[key][0],)


def check_vt(ex):
  value = re.fullmatch(r"Question: Find all variables that are assigned the value (\d+) in the text above\.",
                       ex.question).group(1)
  assigned = {}
  for line in ex.context.split("\n"):
    if line == NOISE_LINE:
      continue
    m = re.fullmatch(r"VAR ([A-Z]{5}) = (?:(\d{5})|VAR ([A-Z]{5}))", line)
    assert m, line
    name, number, source = m.groups()
    assigned[name] = number if number else assigned[source]  # a reference must come after its source
  chain = [name for name, v in assigned.items() if v == value]   # insertion order = text order
  assert len(chain) == 5
  return tuple(chain)


def check_cwe(ex):
  entries = re.findall(r"(\d+)\. ([a-z]+)", ex.context)
  assert " ".join(f"{i}. {w}" for i, w in entries) == ex.context
  assert [int(i) for i, _ in entries] == list(range(1, len(entries) + 1))
  counts = collections.Counter(w for _, w in entries)
  ranked = counts.most_common()
  assert len(ranked) >= 20 and ranked[9][1] > ranked[10][1], "the top 10 must be unambiguous"
  top = {w for w, _ in ranked[:10]}
  order = []
  for _, w in entries:
    if w in top and w not in order:
      order.append(w)
  return tuple(order)


def check_fwe(ex):
  words = ex.context.split(" ")
  counts = collections.Counter(words)
  assert counts.most_common(1)[0][0] == "..."
  del counts["..."]
  ranked = counts.most_common()
  assert all(re.fullmatch(r"[a-z]{6}", w) for w in counts)
  assert ranked[0][1] > ranked[1][1] > ranked[2][1] > ranked[3][1], "the top 3 must be unambiguous"
  return tuple(w for w, _ in ranked[:3])


def recompute(ex, task):
  if task.startswith("niah"):
    return check_niah(ex, task)
  return {"vt": check_vt, "cwe": check_cwe, "fwe": check_fwe}[task](ex)


# --- generation -------------------------------------------------------------------------

@pytest.mark.parametrize("task", RULER_TASKS)
@pytest.mark.parametrize("length", [0, 3000, 20000])  # 0: the task's minimum
def test_answers_recomputed_from_the_context(task, length):
  length = length or min_length(task)
  for seed in range(4):
    ex = generate(task, seed=seed, length=length)
    assert isinstance(ex, RulerExample) and ex.task == task
    assert ex.prompt.isascii() and ex.context in ex.prompt and ex.question in ex.prompt
    assert ex.prompt.index(ex.context) < ex.prompt.index(ex.question)
    assert recompute(ex, task) == ex.answers


@pytest.mark.parametrize("task", RULER_TASKS)
def test_prompt_length_is_at_most_and_close_to_the_target(task):
  lo = min_length(task)
  lengths = [lo, lo + 1, lo + 97, 2 * lo + 13, 5000, 16383, 16384, 77777]
  for seed, length in enumerate(lengths):
    n = len(generate(task, seed=seed, length=length).prompt.encode())
    slack = 0 if length == lo else 130  # one haystack item: a noise line, a needle or a few words
    assert length - slack <= n <= length, (length, n)
  with pytest.raises(ValueError, match="min_length"):
    generate(task, seed=0, length=lo - 1)


def test_cwe_repetitions_switch_at_16384_bytes():
  def repeats(length):
    counts = collections.Counter(w for _, w in re.findall(r"(\d+)\. ([a-z]+)",
                                                          generate("cwe", seed=1, length=length).context))
    return sorted(set(counts.values()))
  assert repeats(16383) == [1, 6] and repeats(16384) == [3, 30]


def test_examples_are_deterministic_per_seed_and_task():
  for task in RULER_TASKS:
    a, b = generate(task, seed=11, length=2500), generate(task, seed=11, length=2500)
    assert a == b
    c = generate(task, seed=12, length=2500)
    assert c.prompt != a.prompt and c.answers != a.answers
    assert len(c.prompt) == len(a.prompt)  # fixed-width strings: the size depends on the length only
  assert generate("niah_single_1", seed=3, length=900) != generate("niah_multikey_2", seed=3, length=900)


def test_needle_depth_and_answers_vary_with_the_seed():
  depths, values = set(), set()
  for seed in range(40):
    ex = generate("niah_single_1", seed=seed, length=3000)
    depths.add(ex.context.split("\n").index(next(s for s in ex.context.split("\n") if s != NOISE_LINE)))
    values.add(ex.answers[0])
  assert len(depths) > 10 and len(values) == 40


# --- scoring and encoding -----------------------------------------------------------------

def test_score_is_string_match_all():
  ex = generate("vt", seed=0, length=1500)
  assert score("vt", ex.completion, ex.answers) == 1.0
  assert score("vt", " ".join(ex.answers).lower(), ex.answers) == 1.0       # case-insensitive
  assert score("vt", f"{ex.answers[0]} and {ex.answers[3]}", ex.answers) == pytest.approx(0.4)
  assert score("vt", "no idea", ex.answers) == 0.0
  assert score("niah_single_1", "it is 1234567", ["1234567"]) == 1.0
  assert score("niah_single_1", "it is 123456", "1234567") == 0.0


@pytest.mark.parametrize("task", ["niah_multikey_3", "cwe"])
def test_encode_is_prompt_then_completion_shifted_by_one(task):
  ex = generate(task, seed=5, length=2000)
  p, c = ex.prompt.encode(), ex.completion.encode()
  inputs, targets, mask = encode(ex)
  assert inputs.shape == targets.shape == mask.shape == (len(p) + len(c) - 1,)
  assert inputs.dtype == targets.dtype == np.int32 and mask.dtype == np.float32
  assert bytes(inputs.astype(np.uint8).tolist()) == (p + c)[:-1]
  assert bytes(targets.astype(np.uint8).tolist()) == (p + c)[1:]
  assert bytes(targets[mask == 1].astype(np.uint8).tolist()) == c
  assert np.flatnonzero(mask)[0] == len(p) - 1 and mask.sum() == len(c)
  assert score(task, bytes(targets[mask == 1].astype(np.uint8).tolist()).decode(), ex.answers) == 1.0
  padded = encode(ex, answer_bytes=len(c) + 10)
  assert padded.inputs.shape == (len(p) + len(c) + 9,) and padded.mask.sum() == len(c)
  assert not padded.inputs[len(p) + len(c) - 1:].any() and not padded.mask[len(p) + len(c) - 1:].any()
  with pytest.raises(ValueError, match="answer_bytes"):
    encode(ex, answer_bytes=len(c) - 1)
  with pytest.raises(ValueError, match="seq_len"):
    encode(ex, seq_len=len(p))


def test_ruler_batch_rows_are_encoded_examples():
  batch, examples = ruler_batch("fwe", seed=7, batch_size=3, length=1200, return_examples=True)
  a = len(examples[0].completion)
  assert batch.inputs.shape == batch.targets.shape == batch.mask.shape == (3, 1200 + a - 1)
  for i, ex in enumerate(examples):
    assert ex == generate("fwe", seed=7 + i, length=1200)
    row = encode(ex, seq_len=1200 + a - 1)
    for x, y in zip(batch, row, strict=True):
      np.testing.assert_array_equal(x[i], y)
  plain = ruler_batch("fwe", seed=7, batch_size=3, length=1200, answer_bytes=a + 4)
  assert plain.inputs.shape == (3, 1200 + a + 3)
  np.testing.assert_array_equal(plain.mask.sum(axis=1), [a] * 3)


# --- bad inputs ------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,match", [
    ({"task": "niah_single_2"}, "task"), ({"task": None}, "task"), ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"), ({"seed": True}, "seed"), ({"length": 0}, "length"),
    ({"length": 100}, "min_length"), ({"length": RULER_MAX_LENGTH + 1}, "RULER_MAX_LENGTH"),
    ({"length": 2000.0}, "length")])
def test_generate_bad_arguments_raise(kw, match):
  args = {"task": "vt", "seed": 0, "length": 2000, **kw}
  with pytest.raises(ValueError, match=match):
    generate(args.pop("task"), **args)


def test_other_bad_arguments_raise():
  with pytest.raises(ValueError, match="task"):
    min_length("qa_1")
  with pytest.raises(ValueError, match="task"):
    score("qa_1", "x", ["x"])
  with pytest.raises(ValueError, match="prediction"):
    score("cwe", None, ["x"])
  with pytest.raises(ValueError, match="answers"):
    score("cwe", "x", [])
  with pytest.raises(ValueError, match="example"):
    encode("a prompt")
  with pytest.raises(ValueError, match="batch_size"):
    ruler_batch("cwe", seed=0, batch_size=0, length=2000)
  with pytest.raises(ValueError, match="seed"):
    ruler_batch("cwe", seed=-3, batch_size=2, length=2000)
  with pytest.raises(ValueError, match="answer_bytes"):
    ruler_batch("cwe", seed=0, batch_size=2, length=2000, answer_bytes=5)
