"""Random training windows (deterministic, resumable), exhaustive eval windows, keyed generator streams."""

import functools
from typing import NamedTuple

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxmem.data import KeyedBatches, RandomWindows, eval_windows, ngram_bpb


def test_targets_are_inputs_shifted_by_one():
  tokens = np.arange(1000) % 251
  b = RandomWindows(tokens, seq_len=17, batch_size=5, seed=3).batch_at(0)
  assert b["inputs"].shape == (5, 17) and b["inputs"].dtype == np.int32
  np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])
  np.testing.assert_array_equal((b["inputs"] + 1) % 251, b["targets"])


def test_iterator_state_restores_the_exact_stream():
  tokens = np.random.default_rng(0).integers(0, 256, 5000)
  a = RandomWindows(tokens, 32, 4, seed=7)
  first = [next(a) for _ in range(5)]
  state = a.get_state()
  later = [next(a) for _ in range(3)]
  b = RandomWindows(tokens, 32, 4, seed=7)
  b.set_state(state)
  for x, y in zip(later, [next(b) for _ in range(3)], strict=True):
    np.testing.assert_array_equal(x["inputs"], y["inputs"])
  assert not np.array_equal(first[0]["inputs"], first[1]["inputs"])
  with pytest.raises(ValueError, match="seed"):
    RandomWindows(tokens, 32, 4, seed=8).set_state(state)


def test_processes_draw_their_own_rows_of_the_one_global_batch():
  tokens = np.arange(10_000) % 256
  whole = RandomWindows(tokens, 16, 6, seed=0).batch_at(3)
  parts = [RandomWindows(tokens, 16, 6, seed=0, process_index=i, process_count=3).batch_at(3) for i in range(3)]
  for k in ("inputs", "targets"):
    assert all(p[k].shape == (2, 16) for p in parts)
    np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k])
  assert not np.array_equal(parts[0]["inputs"], parts[1]["inputs"])
  with pytest.raises(ValueError, match="`process_count`=4"):
    RandomWindows(tokens, 16, 6, process_count=4)
  with pytest.raises(ValueError, match="`process_index`=2"):
    RandomWindows(tokens, 16, 6, process_index=2, process_count=2)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 300), seq_len=st.integers(1, 40))
def test_eval_windows_cover_every_target_exactly_once(n, seq_len):
  tokens = np.random.default_rng(n).integers(0, 256, n)
  w = eval_windows(tokens, seq_len)
  assert w["mask"].sum() == n - 1
  flat_t = w["targets"].reshape(-1)[w["mask"].reshape(-1) > 0]
  flat_i = w["inputs"].reshape(-1)[w["mask"].reshape(-1) > 0]
  np.testing.assert_array_equal(flat_t, tokens[1:])
  np.testing.assert_array_equal(flat_i, tokens[:-1])


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="fewer than seq_len"):
    RandomWindows(np.arange(10), seq_len=10, batch_size=2)
  with pytest.raises(ValueError, match="`seq_len`"):
    RandomWindows(np.arange(100), seq_len=0, batch_size=2)
  with pytest.raises(ValueError, match="`batch_size`"):
    RandomWindows(np.arange(100), seq_len=4, batch_size=-1)
  with pytest.raises(ValueError, match="1-D"):
    eval_windows(np.zeros((3, 3)), 4)
  with pytest.raises(ValueError, match="`order`"):
    ngram_bpb(np.arange(5), np.arange(5), order=3)


def test_ngram_bpb_of_a_deterministic_cycle():
  cycle = np.tile(np.arange(4), 500)
  # bigram: each byte predicts the next with prob (count + a) / (count_row + 256 a)
  bpb = ngram_bpb(cycle, cycle, 2, alpha=1e-9)
  assert bpb < 1e-6
  assert ngram_bpb(cycle, cycle, 1, alpha=1e-9) == pytest.approx(2.0, abs=1e-6)


class _Draw(NamedTuple):
  values: jax.Array
  ids: jax.Array


@functools.partial(jax.jit, static_argnames=("n",))
def _draw(key, *, n):
  """A tiny pure generator (one cheap compilation): the stream logic, not a task, is under test."""
  k1, k2 = jax.random.split(key)
  return _Draw(jax.random.uniform(k1, (n,)), jax.random.randint(k2, (n,), 0, 1000))


def test_keyed_batches_resume_the_exact_stream():
  a = KeyedBatches(_draw, 3, n=5)
  [next(a) for _ in range(3)]
  state = a.get_state()
  assert state == {"seed": 3, "position": 3}
  want = next(a)
  b = KeyedBatches(_draw, 0, n=5)
  b.set_state(state)
  got = next(b)
  assert set(got) == {"values", "ids"} and all(isinstance(v, np.ndarray) for v in got.values())
  for k in got:
    np.testing.assert_array_equal(got[k], want[k])
  # the batch at position p is the generator at fold_in(key(seed), p)
  at3 = _draw(jax.random.fold_in(jax.random.key(3), 3), n=5)
  for k in got:
    np.testing.assert_array_equal(got[k], np.asarray(getattr(at3, k)))
  assert not np.array_equal(a.batch_at(0)["values"], a.batch_at(1)["values"])
  assert not np.array_equal(KeyedBatches(_draw, 4, n=5).batch_at(0)["values"], a.batch_at(0)["values"])
