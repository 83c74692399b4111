"""ROSA: the scanned JAX kernel == the online suffix automaton == a brute-force search.

Proven: predictions and match lengths of all three agree on hand-made sequences (runs, periods,
ties between recent and longer matches) and on random sequences with long repeats; hand-computed
values; the streaming automaton equals the batch one; the kernel is causal; jit, integer dtypes,
empty input and bad input; the streaming form (rosa_scan) fed in pieces, rows at different
positions, equals the automaton. The kernel runs through a module-level jit, the hand-made sequences
as one padded batch, so each shape compiles once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.rosa import (
  SuffixAutomaton,
  rosa,
  rosa_automaton,
  rosa_automaton_batched,
  rosa_init,
  rosa_scan,
)

rosa_jit = jax.jit(rosa, static_argnames=("none_id", "return_length"))


def brute_force_rosa(x, none_id=-1):
  """For each t: the longest L >= 1 with x[t-L+1..t] == x[j-L+1..j] for some j < t, the
  most recent such j, and x[j+1]; plain Python, O(T^3)."""
  x = [int(v) for v in x]
  preds, lengths = [], []
  for t in range(len(x)):
    best_len, best_j = 0, -1
    for j in range(t):  # ascending, so ">=" keeps the most recent j among equal lengths
      n = 0
      while n <= j and x[j - n] == x[t - n]:
        n += 1
      if n > 0 and n >= best_len:
        best_len, best_j = n, j
    preds.append(x[best_j + 1] if best_len > 0 else none_id)
    lengths.append(best_len)
  return preds, lengths


HAND_MADE = {
    "single": [7],
    "two_same": [4, 4],
    "all_distinct": [0, 1, 2, 3, 4, 5],
    "run": [2] * 9,
    "periodic_2": [0, 1] * 6,
    "periodic_3": [5, 6, 7] * 4 + [5],
    "abracadabra": [ord(c) for c in "abracadabra"],
    "most_recent_wins": [0, 1, 0, 2, 0],  # suffix "0" ends at 0 and 2: predicts x[3] = 2
    "longer_beats_recent": [0, 1, 2, 9, 1, 3, 0, 1],  # "0 1" (j=1, -> 2) beats "1" at j=4
    "mississippi": [ord(c) for c in "mississippi"],
}


def test_rosa_equals_automaton_equals_brute_force_hand_made():
  # the kernel runs once on all sequences, each padded at its end with a token none of them holds;
  # the kernel is causal (test_rosa_is_causal), so a row's prefix is the kernel on the sequence alone
  names = sorted(HAND_MADE)
  T = max(len(HAND_MADE[n]) for n in names)
  x_BT = np.full((len(names), T), 1000, np.int32)
  for b, name in enumerate(names):
    x_BT[b, :len(HAND_MADE[name])] = HAND_MADE[name]
  jax_pred, jax_len = (np.asarray(a) for a in rosa_jit(x_BT, return_length=True))
  for b, name in enumerate(names):
    x = HAND_MADE[name]
    ref_pred, ref_len = brute_force_rosa(x)
    auto_pred, auto_len = rosa_automaton(x, return_length=True)
    np.testing.assert_array_equal(auto_pred, ref_pred, err_msg=name)
    np.testing.assert_array_equal(auto_len, ref_len, err_msg=name)
    np.testing.assert_array_equal(jax_pred[b, :len(x)], ref_pred, err_msg=name)
    np.testing.assert_array_equal(jax_len[b, :len(x)], ref_len, err_msg=name)


def test_hand_computed_values():
  assert list(rosa_automaton([0, 1, 0, 2, 0])) == [-1, -1, 1, -1, 2]
  assert list(rosa_automaton([3, 3, 3, 3])) == [-1, 3, 3, 3]
  assert list(rosa_automaton([0, 1, 2, 9, 1, 3, 0, 1])) == [-1, -1, -1, -1, 2, -1, 1, 2]
  pred, length = rosa_automaton([3, 3, 3, 3], return_length=True)
  assert list(length) == [0, 1, 2, 3]
  assert list(rosa_automaton([5, 5], none_id=99)) == [99, 5]
  assert rosa_jit(np.int32([[1]]), none_id=-7).tolist() == [[-7]]


@pytest.mark.parametrize("alphabet,B,T", [(2, 3, 200), (3, 2, 157), (5, 4, 61), (3, 5, 1)])
def test_rosa_equals_automaton_equals_brute_force_random(alphabet, B, T):
  x_BT = np.random.default_rng(alphabet * 1000 + T).integers(0, alphabet, (B, T))
  x_BT[0, : T // 3] = x_BT[0, T // 3: 2 * (T // 3)]  # a long exact repeat
  jax_pred, jax_len = rosa_jit(x_BT.astype(np.int32), return_length=True)
  auto_pred, auto_len = rosa_automaton_batched(x_BT, return_length=True)
  np.testing.assert_array_equal(jax_pred, auto_pred)
  np.testing.assert_array_equal(jax_len, auto_len)
  for b in range(min(B, 2)):  # the O(T^3) reference on two rows
    ref_pred, ref_len = brute_force_rosa(x_BT[b])
    np.testing.assert_array_equal(auto_pred[b], ref_pred)
    np.testing.assert_array_equal(auto_len[b], ref_len)


def test_packed_rows_match_each_segment_alone():
  # rosa(tokens, segment_ids): every segment is matched against its own earlier tokens only, padding inside
  # a segment skipped (the automaton on the segment's tokens alone is the reference); padding predicts none
  from tests.kernels.packed import runs
  rng = np.random.default_rng(7)
  B, T = 3, 48
  x_BT = rng.integers(0, 3, (B, T)).astype(np.int32)
  x_BT[:, 24:36] = x_BT[:, 4:16]  # a repeat that crosses into the next segment
  seg = np.repeat(np.arange(1, 5), 12)[None].repeat(B, 0).astype(np.int32)
  seg[0, 17:19] = 0          # padding inside a segment, inside matches: "0 1 2 0 1 | 2 0 1 2 0" runs across it
  x_BT[0, 12:24] = [0, 1, 2, 0, 1, 1, 1, 2, 0, 1, 2, 0]
  seg[1, :5] = 0             # left padding
  seg[2, 12:24] = 1          # one long segment, then a run equal to nothing before
  pred, length = rosa_jit(x_BT, return_length=True, none_id=-5, segment_ids=seg)
  pred, length = np.asarray(pred), np.asarray(length)
  for b in range(B):
    for r in runs(seg[b]):
      ref_pred, ref_len = rosa_automaton(x_BT[b, r], none_id=-5, return_length=True)
      np.testing.assert_array_equal(pred[b, r], ref_pred)
      np.testing.assert_array_equal(length[b, r], ref_len)
  assert np.all(pred[seg == 0] == -5) and np.all(length[seg == 0] == 0)
  with pytest.raises(ValueError, match=r"`segment_ids` must have shape \[B, T\]"):
    rosa(x_BT, segment_ids=seg[:, 1:])


def test_streaming_automaton_matches_batch():
  x = np.random.default_rng(3).integers(0, 3, 40)
  sam = SuffixAutomaton(none_id=-2)
  streamed = [sam.append(int(v))[0] for v in x]
  np.testing.assert_array_equal(streamed, rosa_automaton(x, none_id=-2))


rosa_scan_jit = jax.jit(rosa_scan, static_argnames=("none_id", "return_length"))


def test_streaming_rosa_in_pieces_with_rows_at_different_positions_equals_the_automaton():
  rng = np.random.default_rng(5)
  x_BT = rng.integers(0, 3, (3, 40)).astype(np.int32)
  x_BT[1, :12] = x_BT[1, 12:24]  # a long repeat
  ref_pred, ref_len = rosa_automaton_batched(x_BT, none_id=-3, return_length=True)
  state = rosa_init(3, 48)        # capacity above the length: unused cells are never read
  # row b starts b tokens late (its first b tokens fed one at a time before the pieces)
  offsets = np.arange(3)
  preds = [[] for _ in range(3)]
  lens = [[] for _ in range(3)]
  for b in range(3):
    for i in range(b):   # advance row b alone by its first b tokens
      one = jax.tree.map(lambda a: a[b:b + 1], state)
      one, (p, n) = rosa_scan_jit(one, x_BT[b:b + 1, i:i + 1], none_id=-3, return_length=True)
      state = jax.tree.map(lambda s, o: s.at[b:b + 1].set(o), state, one)
      preds[b].append(int(p[0, 0]))
      lens[b].append(int(n[0, 0]))
  for lo, hi in ((0, 7), (7, 8), (8, 30), (30, 38)):
    cols = np.stack([x_BT[b, offsets[b] + lo: offsets[b] + hi] for b in range(3)])
    state, (p, n) = rosa_scan_jit(state, cols, none_id=-3, return_length=True)
    for b in range(3):
      preds[b] += np.asarray(p[b]).tolist()
      lens[b] += np.asarray(n[b]).tolist()
  for b in range(3):
    np.testing.assert_array_equal(preds[b], ref_pred[b, :38 + b])
    np.testing.assert_array_equal(lens[b], ref_len[b, :38 + b])
  np.testing.assert_array_equal(np.asarray(state["length"]), 38 + offsets)
  with pytest.raises(ValueError, match="`capacity` must be a positive integer"):
    rosa_init(2, 0)


def test_rosa_is_causal():
  rng = np.random.default_rng(0)
  x_BT = rng.integers(0, 3, (2, 50))
  base = np.asarray(rosa_jit(x_BT.astype(np.int32)))
  for t in (0, 17, 48):
    changed = x_BT.copy()
    changed[:, t + 1:] = rng.integers(0, 3, changed[:, t + 1:].shape)
    assert (changed != x_BT).any()
    np.testing.assert_array_equal(np.asarray(rosa_jit(changed.astype(np.int32)))[:, : t + 1], base[:, : t + 1])


def test_rosa_jits_and_handles_dtypes():
  x_BT = np.random.default_rng(1).integers(0, 4, (3, 33))
  ref = rosa_automaton_batched(x_BT)
  pred, length = rosa_jit(x_BT.astype(np.int32), return_length=True)
  assert pred.dtype == jnp.int32 and length.dtype == jnp.int32 and pred.shape == (3, 33)
  np.testing.assert_array_equal(pred, ref)
  np.testing.assert_array_equal(rosa(jnp.asarray(x_BT, jnp.uint8)), ref)  # eager
  assert rosa(jnp.zeros((2, 0), jnp.int32)).shape == (2, 0)
  assert rosa_automaton([]).shape == (0,)


def test_bad_input_raises():
  with pytest.raises(ValueError, match="`tokens_BT` must have rank 2"):
    rosa(np.zeros((5,), np.int32))
  with pytest.raises(ValueError, match="`tokens_BT` must hold integer"):
    rosa(np.zeros((1, 5), np.float32))
  with pytest.raises(ValueError, match="`tokens_BT` must hold integer"):
    rosa(np.zeros((1, 5), bool))
  with pytest.raises(ValueError, match="`none_id` must be an integer"):
    rosa(np.zeros((1, 5), np.int32), none_id=0.5)
  with pytest.raises(ValueError, match="`tokens_T` must have rank 1"):
    rosa_automaton(np.zeros((2, 3), np.int32))
  with pytest.raises(ValueError, match="`tokens_T` must hold integer"):
    rosa_automaton([0.5, 1.0])
  with pytest.raises(ValueError, match="`tokens_BT` must have rank 2"):
    rosa_automaton_batched(np.zeros((3,), np.int32))
