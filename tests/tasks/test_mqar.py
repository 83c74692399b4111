"""MQAR and multi-hop recall generators checked against their specification with plain Python.

Each generator configuration is a compilation, so the module uses few: MQAR at one near-context
(``power_a = 0.01``, random filler) and one uniform (``power_a = 1``, zero filler) configuration,
multi-hop recall at hops 1 and 3 (zero filler) and 2 (random filler); the layout, jit, stream and
statistics checks all read these module-scoped batches.
"""

import jax
import numpy as np
import pytest

from jaxmem.tasks.mqar import mqar, mqar_stream, multihop_recall, multihop_stream

T, PAIRS = 128, 5
SPACE = (T - 2 * PAIRS) // 2  # query gaps 0 .. SPACE - 1
NEAR = dict(batch_size=256, vocab_size=512, seq_len=T, num_kv_pairs=PAIRS, power_a=0.01)  # random filler
FLAT = dict(NEAR, power_a=1.0, random_non_queries=False)


@jax.jit
def _mqar_jitted(key):
  return mqar(key, **NEAR)


@pytest.fixture(scope="module")
def near():
  return mqar(jax.random.key(1), **NEAR)


@pytest.fixture(scope="module")
def flat():
  return mqar(jax.random.key(1), **FLAT)


def check_mqar_layout(batch, kw):
  """Every row, in plain Python: distinct keys and values from their halves, each key queried once at an
  even offset after the context, the target is the paired value; zero filler is zero."""
  inputs, targets, mask = (np.asarray(x) for x in batch)
  B, V, n = kw["batch_size"], kw["vocab_size"], kw["num_kv_pairs"]
  context = 2 * n
  assert inputs.shape == targets.shape == mask.shape == (B, T)
  for x, y, m in zip(inputs, targets, mask, strict=True):
    keys, values = x[0:context:2], x[1:context:2]
    assert len(set(keys.tolist())) == n and len(set(values.tolist())) == n
    assert keys.min() >= 1 and keys.max() < V // 2 and values.min() >= V // 2 and values.max() < V
    pairs = dict(zip(keys.tolist(), values.tolist(), strict=True))
    q = np.flatnonzero(m)
    assert len(q) == n and all(p >= context and (p - context) % 2 == 0 for p in q)
    assert np.all(m[q] == 1)
    assert sorted(x[q].tolist()) == sorted(keys.tolist())          # each key queried once
    assert all(y[p] == pairs[x[p]] for p in q)                     # target = the paired value
    rest = np.setdiff1d(np.arange(context, T), q)
    assert np.all(y[rest] == 0)
    if not kw.get("random_non_queries", True):
      assert np.all(x[rest] == 0)
  return inputs, mask


def test_layout_matches_the_specification(near, flat):
  check_mqar_layout(flat, FLAT)
  inputs, mask = check_mqar_layout(near, NEAR)
  # random filler: the non-query positions after the context hold tokens of the whole vocabulary,
  # the queries are kept (keys, below vocab_size / 2)
  rest = mask == 0
  rest[:, :2 * PAIRS] = False
  assert np.all(inputs[mask > 0] < NEAR["vocab_size"] // 2)
  assert inputs[rest].max() >= NEAR["vocab_size"] // 2 and len(np.unique(inputs[rest])) > 400


def test_power_law_puts_queries_near_the_context(near, flat):
  gap = lambda b: (np.flatnonzero(np.asarray(b.mask).reshape(-1)) % T - 2 * PAIRS).mean() / 2
  assert gap(near) < 0.6 * gap(flat)
  assert abs(gap(flat) - (SPACE - 1) / 2) < 3  # uniform over 0 .. SPACE - 1


def test_random_fill_is_deterministic_under_jit_and_key_dependent(near):
  for x, y in zip(near, _mqar_jitted(jax.random.key(1)), strict=True):
    np.testing.assert_array_equal(x, y)
  for x, y in zip(near, mqar(jax.random.key(1), **NEAR), strict=True):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(np.asarray(near.inputs), np.asarray(mqar(jax.random.key(3), **NEAR).inputs))


@pytest.mark.parametrize("kw,match", [({"seq_len": 33}, "even"), ({"vocab_size": 32}, "must exceed"),
                                      ({"num_kv_pairs": 9}, "4 \\* num_kv_pairs"),
                                      ({"power_a": 0.0}, "power_a")])
def test_bad_arguments_raise(kw, match):
  args = dict(batch_size=2, vocab_size=128, seq_len=32, num_kv_pairs=4)
  with pytest.raises(ValueError, match=match):
    mqar(jax.random.key(0), **{**args, **kw})


# --- multi-hop recall ------------------------------------------------------------------

CHAINS = 5
# hops 1 and 3 with zero filler; hops 2 (the default) with random filler and a larger batch
MULTIHOP = {
    1: dict(batch_size=12, vocab_size=97, seq_len=2 * CHAINS * 2 + 10, num_chains=CHAINS, hops=1,
            random_non_queries=False),
    2: dict(batch_size=64, vocab_size=256, seq_len=2 * CHAINS * 3 + 12, num_chains=CHAINS, hops=2),
    3: dict(batch_size=12, vocab_size=97, seq_len=2 * CHAINS * 4 + 10, num_chains=CHAINS, hops=3,
            random_non_queries=False),
}


@pytest.fixture(scope="module")
def multihop():
  return {hops: multihop_recall(jax.random.key(hops), **kw) for hops, kw in MULTIHOP.items()}


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_multihop_answers_follow_the_chain_in_plain_python(multihop, hops):
  kw = MULTIHOP[hops]
  n, V, L = kw["num_chains"], kw["vocab_size"], kw["seq_len"]
  inputs, targets, mask = (np.asarray(x) for x in multihop[hops])
  assert inputs.shape == targets.shape == mask.shape == (kw["batch_size"], L)
  context = 2 * n * hops
  for x, y, m in zip(inputs, targets, mask, strict=True):
    keys, values = x[0:context:2].tolist(), x[1:context:2].tolist()
    assert len(set(keys)) == n * hops                      # every link's key is distinct
    link = dict(zip(keys, values, strict=True))
    assert all(0 < t < V for t in keys + values)
    starts = set(keys) - set(values)                       # chain heads: never a value
    assert len(starts) == n
    q = np.flatnonzero(m)
    assert len(q) == n and all(p >= context and (p - context) % 2 == 0 for p in q)
    assert set(x[q].tolist()) == starts
    for p in q:
      node = int(x[p])
      for _ in range(hops):
        node = link[node]
      assert y[p] == node and node not in link             # the answer is the chain's end
    rest = np.setdiff1d(np.arange(context, L), q)
    assert np.all(y[rest] == 0)
    if not kw.get("random_non_queries", True):
      assert np.all(x[rest] == 0)


def test_multihop_link_order_is_shuffled_and_fill_is_random(multihop):
  kw = MULTIHOP[2]
  context = 2 * kw["num_chains"] * 2
  x = np.asarray(multihop[2].inputs)
  # the first link is a chain's first hop in about half the sequences (5 of the 10 links), not always
  firsts = [int(r[0]) not in set(r[1:context:2].tolist()) for r in x]
  assert 0.2 < np.mean(firsts) < 0.8
  rest = np.asarray(multihop[2].mask) == 0
  rest[:, :context] = False
  assert np.all(x[rest] > 0) and len(np.unique(x[rest])) > 50


@pytest.mark.parametrize("kw,match", [({"seq_len": 31}, "even"), ({"seq_len": 20}, "seq_len"),
                                      ({"vocab_size": 12}, "vocab_size"), ({"hops": 0}, "hops")])
def test_multihop_bad_arguments_raise(kw, match):
  args = dict(batch_size=2, vocab_size=128, seq_len=32, num_chains=4, hops=2)
  with pytest.raises(ValueError, match=match):
    multihop_recall(jax.random.key(0), **{**args, **kw})


# --- resumable streams -----------------------------------------------------------------


STREAMS = [(mqar_stream, mqar, NEAR), (multihop_stream, multihop_recall, MULTIHOP[2])]


@pytest.mark.parametrize("make,fn,kw", STREAMS, ids=["mqar", "multihop"])
def test_streams_are_resumable_and_keyed_by_seed_and_position(make, fn, kw):
  it = make(5, **kw)
  batches = [next(it) for _ in range(3)]
  assert set(batches[0]) == {"inputs", "targets", "mask"}
  for i in (2, 0, 1):                                # batch_at(i) of a fresh stream = the i-th batch
    fresh = make(5, **kw).batch_at(i)
    for k in batches[i]:
      np.testing.assert_array_equal(fresh[k], batches[i][k])
  want = fn(jax.random.fold_in(jax.random.key(5), 2), **kw)   # the generator at fold_in(key(seed), position)
  np.testing.assert_array_equal(batches[2]["inputs"], np.asarray(want.inputs))
  resumed = make(0, **kw)
  resumed.set_state(it.get_state())                  # {seed, position} is the whole state
  np.testing.assert_array_equal(next(resumed)["inputs"], next(it)["inputs"])
  assert not np.array_equal(make(6, **kw).batch_at(0)["inputs"], batches[0]["inputs"])
