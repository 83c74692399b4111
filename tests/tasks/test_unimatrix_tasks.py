"""UniMatrix recall and three-token generators, checked by the test's own plain-Python reading.

Every distinct (batch_size, num_pairs / num_tags, seq_len, ...) is a compilation: the recall tests share
four configurations (the paper's (4, 128) with a batch large enough for the uniformity statistics), the
three-token tests four; streams and determinism checks reuse them.
"""

import collections

import jax
import numpy as np
import pytest

from jaxmem.tasks.unimatrix import (
    RECALL_VOCAB,
    THREE_TOKEN_TASKS,
    THREE_TOKEN_VOCAB,
    decode_recall,
    decode_three_token,
    lookup_table,
    recall_batch,
    recall_stream,
    three_token_batch,
    three_token_stream,
    three_token_target,
)

# --- the test's own reading of the recall layout (the paper's token ids, written out) -------

R_BOS, R_SEP, R_QUERY, R_ANSWER = 1, 2, 3, 4
R_KEYS, R_VALUES, R_FILLER = range(5, 13), range(13, 21), range(21, 31)


def read_recall(x, num_pairs):
  """(pairs, query key) of one sequence, asserting the layout token by token."""
  x = [int(t) for t in x]
  assert x[0] == R_BOS
  pairs = {}
  for j in range(num_pairs):
    k, v, sep = x[1 + 3 * j: 4 + 3 * j]
    assert k in R_KEYS and v in R_VALUES and sep == R_SEP, (j, k, v, sep)
    pairs[k] = v
  assert len(pairs) == num_pairs and len(set(pairs.values())) == num_pairs  # distinct keys, values
  assert all(t in R_FILLER for t in x[1 + 3 * num_pairs:-3])
  assert x[-3] == R_QUERY and x[-1] == R_ANSWER and x[-2] in pairs
  return pairs, x[-2]


def check_last_position_only(targets, mask, answer):
  assert mask[-1] == 1.0 and mask[:-1].sum() == 0
  assert targets[-1] == answer and not targets[:-1].any()


# (num_pairs, seq_len) -> batch size; the paper's (4, 128) also carries the uniformity statistics.
RECALL_CONFIGS = {(4, 128): 2000, (1, 7): 64, (8, 28): 64, (6, 40): 64}


@pytest.mark.parametrize("num_pairs,seq_len", list(RECALL_CONFIGS))
def test_recall_layout_and_answer_in_plain_python(num_pairs, seq_len):
  B = RECALL_CONFIGS[num_pairs, seq_len]
  b = recall_batch(jax.random.key(num_pairs), batch_size=B, num_pairs=num_pairs, seq_len=seq_len)
  inputs, targets, mask = (np.asarray(x) for x in b)
  assert inputs.shape == targets.shape == mask.shape == (B, seq_len)
  assert inputs.dtype == targets.dtype == np.int32 and mask.dtype == np.float32
  assert inputs.max() < RECALL_VOCAB
  for x, y, m in zip(inputs, targets, mask, strict=True):
    pairs, q = read_recall(x, num_pairs)
    check_last_position_only(y, m, pairs[q])
    assert decode_recall(x) == (pairs, q)


def test_recall_queries_values_and_filler_are_uniform():
  b = recall_batch(jax.random.key(7), batch_size=2000, num_pairs=4, seq_len=128)  # compiled above
  inputs, targets = np.asarray(b.inputs), np.asarray(b.targets)
  slot = [next(j for j in range(4) if x[1 + 3 * j] == x[-2]) for x in inputs]  # which pair is asked
  freq = np.bincount(slot, minlength=4) / 2000
  assert np.all(np.abs(freq - 0.25) < 0.04)
  # answering the first present value is right about 1/num_pairs of the time
  assert abs(np.mean(inputs[:, 2] == targets[:, -1]) - 0.25) < 0.04
  assert set(np.unique(inputs[:, 1::3][:, :4])) == set(R_KEYS)
  assert set(np.unique(inputs[:, 2::3][:, :4])) == set(R_VALUES)
  assert set(np.unique(inputs[:, 13:-3])) == set(R_FILLER)
  # a key's value is drawn independently of the key: every (key, value) pair occurs about equally often
  # (8000 pairs over 64 combinations, about 125 each)
  pair_counts = np.zeros((8, 8), int)
  np.add.at(pair_counts, (inputs[:, 1:13:3].reshape(-1) - 5, inputs[:, 2:13:3].reshape(-1) - 13), 1)
  assert pair_counts.min() > 125 * 0.5 and pair_counts.max() < 125 * 1.5


def test_recall_is_deterministic_and_key_dependent():
  a = recall_batch(jax.random.key(3), batch_size=2000)  # the shapes of a test above: no new compile
  b = recall_batch(jax.random.key(3), batch_size=2000)
  c = recall_batch(jax.random.key(4), batch_size=2000)
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a.inputs, c.inputs)


def test_recall_stream_is_resumable():
  s = recall_stream(5, batch_size=64, num_pairs=6, seq_len=40)
  first, second = next(s), next(s)
  assert set(first) == {"inputs", "targets", "mask"} and first["inputs"].shape == (64, 40)
  t = recall_stream(0, batch_size=64, num_pairs=6, seq_len=40)
  t.set_state({"seed": 5, "position": 1})
  np.testing.assert_array_equal(next(t)["inputs"], second["inputs"])
  assert not np.array_equal(first["inputs"], second["inputs"])
  for x in first["inputs"]:
    read_recall(x, 6)


def test_decode_recall_rejects_malformed_sequences():
  x = np.asarray(recall_batch(jax.random.key(0), batch_size=64, num_pairs=8, seq_len=28).inputs[0])
  no_answer = x.copy()
  no_answer[-1] = R_QUERY
  no_sep = x.copy()
  no_sep[3] = 30  # a filler where SEP belongs
  for broken in (x[1:], no_answer, no_sep):
    with pytest.raises(ValueError):
      decode_recall(broken)
  with pytest.raises(ValueError, match="inputs_T"):
    decode_recall(x[None])


@pytest.mark.parametrize("kw,match", [({"num_pairs": 0}, "num_pairs"), ({"num_pairs": 9}, "num_pairs"),
                                      ({"seq_len": 15}, "3·num_pairs \\+ 4"), ({"batch_size": 0}, "batch_size"),
                                      ({"seq_len": 16.0}, "seq_len")])
def test_recall_bad_arguments_raise(kw, match):
  args = {"batch_size": 2, "num_pairs": 4, "seq_len": 16, **kw}
  with pytest.raises(ValueError, match=match):
    recall_batch(jax.random.key(0), **args)
  with pytest.raises(ValueError, match=match):
    recall_stream(0, **args)


# --- the test's own reading of the three-token layout ---------------------------------------

T_TASKS = {1: "copy", 2: "affine", 3: "gate", 4: "lookup"}
T_A, T_B, T_C, T_QUERY = 5, 6, 7, 8
T_DIGITS, T_CLASSES, T_TAGS, T_FILLER = range(9, 17), range(17, 33), range(33, 41), range(41, 49)


def rule(task, a, b, c, table):
  return {"copy": a, "affine": (a + 2 * b + 3 * c) % 16,
          "gate": (a * (b + 1) + c * ((a ^ b) + 1)) % 16, "lookup": int(table[a][b][c])}[task]


def read_three_token(x, num_tags):
  """(task name, {tag: (a, b, c)} in order, queried tag, record start positions)."""
  x = [int(t) for t in x]
  task = T_TASKS[x[0]]
  assert x[-2] == T_QUERY and x[-1] in T_TAGS
  records, starts = {}, []
  body = x[1:-2]
  i = 0
  while i < len(body):
    t = body[i]
    if t in T_FILLER:
      i += 1
      continue
    assert t in T_TAGS and t not in records, (i, body)
    r = body[i:i + 7]
    assert [r[1], r[3], r[5]] == [T_A, T_B, T_C] and all(d in T_DIGITS for d in r[2::2]), r
    assert not starts or body[i - 1] in T_FILLER      # consecutive records are separated
    records[t] = (r[2] - 9, r[4] - 9, r[6] - 9)
    starts.append(i + 1)
    i += 7
  assert len(records) == num_tags and x[-1] in records
  return task, records, x[-1], starts


def test_lookup_table_is_fixed_and_covers_the_classes():
  t = lookup_table()
  assert t.shape == (8, 8, 8) and t.min() >= 0 and t.max() < 16
  np.testing.assert_array_equal(t, lookup_table(0))
  assert not np.array_equal(t, lookup_table(1))
  assert set(np.unique(t)) == set(range(16))
  t[0, 0, 0] += 1  # a copy: the table itself cannot be changed from outside
  np.testing.assert_array_equal(lookup_table(0)[1:], t[1:])
  assert lookup_table(0)[0, 0, 0] != t[0, 0, 0]


def test_three_token_target_matches_the_rules_on_every_record():
  table = lookup_table(0)
  for task in THREE_TOKEN_TASKS:
    for a in range(8):
      for b in range(8):
        for c in range(8):
          assert three_token_target(task, a, b, c, table) == rule(task, a, b, c, table.tolist())
  assert three_token_target("lookup", 1, 2, 3) == table[1, 2, 3]
  assert three_token_target("gate", 7, 0, 7) == (7 + 7 * 8) % 16


def test_three_token_default_layout_and_targets_in_plain_python():
  b, task = three_token_batch(jax.random.key(0), batch_size=512, return_task=True)
  inputs, targets, mask, task = (np.asarray(x) for x in (*b, task))
  assert inputs.shape == (512, 49) and task.shape == (512,) and inputs.max() < THREE_TOKEN_VOCAB
  table = lookup_table(0).tolist()
  first_starts, asked = set(), []
  for x, y, m, k in zip(inputs, targets, mask, task, strict=True):
    name, records, q, starts = read_three_token(x, 4)
    assert THREE_TOKEN_TASKS[k] == name
    check_last_position_only(y, m, 17 + rule(name, *records[q], table))
    first_starts.add(starts[0])
    asked.append(list(records).index(q))
    ex = decode_three_token(x)
    assert (ex.task, ex.records, ex.query) == (name, {t - 33: v for t, v in records.items()}, q - 33)
  assert len(first_starts) > 5  # the filler gaps are random, not a fixed layout
  counts = collections.Counter(task.tolist())
  assert sorted(counts) == [0, 1, 2, 3] and min(counts.values()) > 512 / 4 * 0.75
  asked = collections.Counter(asked)                                 # the queried record is uniform
  assert sorted(asked) == [0, 1, 2, 3] and min(asked.values()) > 512 / 4 * 0.75
  assert len(set(targets[:, -1].tolist())) == 16                    # every class token occurs


@pytest.mark.parametrize("num_tags,seq_len,tasks,table_seed", [
    (1, 10, ("lookup",), 3), (8, 66, ("gate", "copy"), 0), (3, 40, ("affine",), 0)])
def test_three_token_configurations_in_plain_python(num_tags, seq_len, tasks, table_seed):
  b, task = three_token_batch(jax.random.key(num_tags), batch_size=64, tasks=tasks, seq_len=seq_len,
                              num_tags=num_tags, table_seed=table_seed, return_task=True)
  table = lookup_table(table_seed).tolist()
  assert np.asarray(b.inputs).shape == (64, seq_len)
  assert {THREE_TOKEN_TASKS[k] for k in np.asarray(task)} == set(tasks)
  for x, y, m in zip(*(np.asarray(v) for v in b), strict=True):
    name, records, q, _ = read_three_token(x, num_tags)
    assert name in tasks
    check_last_position_only(y, m, 17 + rule(name, *records[q], table))


def test_three_token_stream_is_resumable_and_carries_the_task():
  kw = dict(batch_size=64, tasks=("gate", "copy"), seq_len=66, num_tags=8)  # compiled above
  s = three_token_stream(2, **kw)
  first, second = next(s), next(s)
  assert set(first) == {"inputs", "targets", "mask", "task"} and first["task"].shape == (64,)
  t = three_token_stream(2, **kw)
  t.set_state({"seed": 2, "position": 1})
  again = next(t)
  for k in second:
    np.testing.assert_array_equal(again[k], second[k])
  for x, k in zip(first["inputs"], first["task"], strict=True):
    assert read_three_token(x, 8)[0] == THREE_TOKEN_TASKS[k] in ("gate", "copy")


def test_decode_three_token_rejects_malformed_sequences():
  x = np.asarray(three_token_batch(jax.random.key(1), batch_size=512).inputs[0])
  _, _, _, starts = read_three_token(x, 4)
  bad_role = x.copy()
  bad_role[starts[0] + 1] = T_B
  bad_query = x.copy()
  bad_query[-2] = 41
  for broken in (bad_role, bad_query, x[1:]):
    with pytest.raises(ValueError):
      decode_three_token(broken)


@pytest.mark.parametrize("kw,match", [({"tasks": ("copy", "sort")}, "tasks"), ({"tasks": ()}, "tasks"),
                                      ({"tasks": "copy"}, "tasks"), ({"tasks": ("copy", "copy")}, "repeat"),
                                      ({"num_tags": 9}, "num_tags"), ({"num_tags": 0}, "num_tags"),
                                      ({"seq_len": 33}, "8·num_tags \\+ 2"), ({"table_seed": -1}, "table_seed"),
                                      ({"batch_size": -2}, "batch_size")])
def test_three_token_bad_arguments_raise(kw, match):
  with pytest.raises(ValueError, match=match):
    three_token_batch(jax.random.key(0), **{"batch_size": 2, **kw})
  with pytest.raises(ValueError, match=match):
    three_token_stream(0, **{"batch_size": 2, **kw})


@pytest.mark.parametrize("args,match", [
    (("sort", 0, 0, 0), "task"), (("copy", 8, 0, 0), "`a`"), (("gate", 0, -1, 0), "`b`"),
    (("lookup", 0, 0, 0, np.zeros((8, 8))), "table")])
def test_three_token_target_bad_arguments_raise(args, match):
  with pytest.raises(ValueError, match=match):
    three_token_target(*args)
