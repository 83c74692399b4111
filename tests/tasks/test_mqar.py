"""MQAR generator checked against its specification with plain Python."""

import jax
import numpy as np
import pytest

from jaxmem.tasks.mqar import mqar


def test_layout_matches_the_specification():
  b = mqar(jax.random.key(0), batch_size=16, vocab_size=128, seq_len=40, num_kv_pairs=5,
           random_non_queries=False)
  inputs, targets, mask = (np.asarray(x) for x in b)
  assert inputs.shape == targets.shape == mask.shape == (16, 40)
  for x, y, m in zip(inputs, targets, mask, strict=True):
    keys, values = x[0:10:2], x[1:10:2]
    assert len(set(keys.tolist())) == 5 and len(set(values.tolist())) == 5
    assert keys.min() >= 1 and keys.max() < 64 and values.min() >= 64 and values.max() < 128
    pairs = dict(zip(keys.tolist(), values.tolist(), strict=True))
    q = np.flatnonzero(m)
    assert len(q) == 5 and all(p >= 10 and (p - 10) % 2 == 0 for p in q)
    assert sorted(x[q].tolist()) == sorted(keys.tolist())          # each key queried once
    assert all(y[p] == pairs[x[p]] for p in q)                     # target = the paired value
    rest = np.setdiff1d(np.arange(10, 40), q)
    assert np.all(x[rest] == 0)


def test_power_law_puts_queries_near_the_context():
  near = mqar(jax.random.key(1), batch_size=256, vocab_size=512, seq_len=128, num_kv_pairs=4,
              power_a=0.01)
  flat = mqar(jax.random.key(1), batch_size=256, vocab_size=512, seq_len=128, num_kv_pairs=4,
              power_a=1.0)
  gap = lambda b: (np.flatnonzero(np.asarray(b.mask).reshape(-1)) % 128 - 8).mean() / 2
  assert gap(near) < 0.6 * gap(flat)
  assert abs(gap(flat) - (60 - 1) / 2) < 3  # uniform over 0..59


def test_random_fill_keeps_queries_and_is_deterministic_under_jit():
  a = mqar(jax.random.key(2), batch_size=4, vocab_size=256, seq_len=32, num_kv_pairs=4)
  b = jax.jit(lambda k: mqar(k, batch_size=4, vocab_size=256, seq_len=32, num_kv_pairs=4))(jax.random.key(2))
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x, y)
  m = np.asarray(a.mask) > 0
  assert np.all(np.asarray(a.inputs)[m] < 128)
  assert not np.array_equal(np.asarray(a.inputs),
                            np.asarray(mqar(jax.random.key(3), batch_size=4, vocab_size=256, seq_len=32,
                                            num_kv_pairs=4).inputs))


@pytest.mark.parametrize("kw,match", [({"seq_len": 33}, "even"), ({"vocab_size": 32}, "must exceed"),
                                      ({"num_kv_pairs": 9}, "4 \\* num_kv_pairs"),
                                      ({"power_a": 0.0}, "power_a")])
def test_bad_arguments_raise(kw, match):
  args = dict(batch_size=2, vocab_size=128, seq_len=32, num_kv_pairs=4)
  with pytest.raises(ValueError, match=match):
    mqar(jax.random.key(0), **{**args, **kw})


# --- multi-hop recall ------------------------------------------------------------------

from jaxmem.tasks.mqar import multihop_recall  # noqa: E402


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_multihop_answers_follow_the_chain_in_plain_python(hops):
  n, T = 5, 2 * 5 * (hops + 1) + 10
  b = multihop_recall(jax.random.key(hops), batch_size=12, vocab_size=97, seq_len=T, num_chains=n, hops=hops,
                      random_non_queries=False)
  inputs, targets, mask = (np.asarray(x) for x in b)
  context = 2 * n * hops
  for x, y, m in zip(inputs, targets, mask, strict=True):
    keys, values = x[0:context:2].tolist(), x[1:context:2].tolist()
    assert len(set(keys)) == n * hops                      # every link's key is distinct
    link = dict(zip(keys, values, strict=True))
    assert all(0 < t < 97 for t in keys + values)
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
    rest = np.setdiff1d(np.arange(context, T), q)
    assert np.all(x[rest] == 0) and np.all(y[rest] == 0)


def test_multihop_link_order_is_shuffled_and_fill_is_random():
  b = multihop_recall(jax.random.key(0), batch_size=64, vocab_size=256, seq_len=48, num_chains=4, hops=2)
  x = np.asarray(b.inputs)
  # the first link is a chain's first hop in about half the sequences (4 of the 8 links), not always
  firsts = [int(r[0]) not in set(r[1:16:2].tolist()) for r in x]
  assert 0.2 < np.mean(firsts) < 0.8
  rest = np.asarray(b.mask) == 0
  rest[:, :16] = False
  assert np.all(x[rest] > 0) and len(np.unique(x[rest])) > 50


@pytest.mark.parametrize("kw,match", [({"seq_len": 31}, "even"), ({"seq_len": 20}, "seq_len"),
                                      ({"vocab_size": 12}, "vocab_size"), ({"hops": 0}, "hops")])
def test_multihop_bad_arguments_raise(kw, match):
  args = dict(batch_size=2, vocab_size=128, seq_len=32, num_chains=4, hops=2)
  with pytest.raises(ValueError, match=match):
    multihop_recall(jax.random.key(0), **{**args, **kw})


# --- resumable streams -----------------------------------------------------------------

from jaxmem.tasks.mqar import mqar_stream, multihop_stream  # noqa: E402


@pytest.mark.parametrize("make,fn,kw", [
    (mqar_stream, mqar, dict(batch_size=3, vocab_size=64, seq_len=16, num_kv_pairs=2)),
    (multihop_stream, multihop_recall, dict(batch_size=3, vocab_size=64, seq_len=24, num_chains=2, hops=2))])
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
