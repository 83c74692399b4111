"""Algorithmic tasks, checked against plain numpy / Python decodings of each spec."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.tasks import (
    TaskBatch,
    associative_recall,
    bit_error_rate,
    copy_task,
    masked_sigmoid_cross_entropy,
    priority_sort,
    repeat_copy,
)

COPY = dict(batch_size=16, num_bits=3, min_length=2, max_length=6)
REPEAT = dict(batch_size=16, num_bits=3, min_length=1, max_length=4, min_repeats=1, max_repeats=3,
              norm_max=10.0)
RECALL = dict(batch_size=16, num_bits=2, item_length=2, min_items=2, max_items=5)
SORT = dict(batch_size=4, num_bits=3, num_inputs=7, num_outputs=5)

TASKS = [(copy_task, COPY), (repeat_copy, REPEAT), (associative_recall, RECALL), (priority_sort, SORT)]
TASK_IDS = ["copy", "repeat_copy", "associative_recall", "priority_sort"]


def as_np(batch):
  return TaskBatch(*(np.asarray(x) for x in batch))


def check_common(batch, B, T, C_in, C_out):
  for x in batch:
    assert x.dtype == jnp.float32
  assert batch.observations.shape == (B, T, C_in)
  assert batch.targets.shape == (B, T, C_out)
  assert batch.mask.shape == (B, T)
  assert set(np.unique(batch.mask)) <= {0.0, 1.0}
  # Targets only where the mask is on.
  assert np.all(batch.targets[batch.mask == 0] == 0)


def test_copy_target_is_the_pattern():
  b = as_np(copy_task(jax.random.key(0), **COPY))
  nb, T = COPY["num_bits"], 2 * COPY["max_length"] + 1
  check_common(b, 16, T, nb + 1, nb)
  lengths = []
  for obs, targ, mask in zip(*b, strict=True):
    (delim,) = np.flatnonzero(obs[:, nb])  # exactly one delimiter, at t = L
    L = int(delim)
    lengths.append(L)
    assert COPY["min_length"] <= L <= COPY["max_length"]
    pattern = obs[:L, :nb]
    assert set(np.unique(pattern)) <= {0.0, 1.0}
    assert np.all(obs[L, :nb] == 0) and np.all(obs[L + 1:] == 0)
    np.testing.assert_array_equal(targ[L + 1:2 * L + 1], pattern)
    expected_mask = np.zeros(T)
    expected_mask[L + 1:2 * L + 1] = 1
    np.testing.assert_array_equal(mask, expected_mask)
  assert len(set(lengths)) > 1


def test_repeat_copy_matches_deepmind_layout():
  b = as_np(repeat_copy(jax.random.key(1), **REPEAT))
  nb, norm = REPEAT["num_bits"], REPEAT["norm_max"]
  T = REPEAT["max_length"] * (REPEAT["max_repeats"] + 1) + 3
  check_common(b, 16, T, nb + 2, nb + 1)
  seen = set()
  for obs, targ, mask in zip(*b, strict=True):
    assert obs[0, nb] == 1 and np.all(obs[1:, nb] == 0)  # start flag at t = 0 only
    (rep_t,) = np.flatnonzero(obs[:, nb + 1])  # repeat count right after the pattern
    L = int(rep_t) - 1
    R = int(round(float(obs[rep_t, nb + 1]) * norm))
    seen.add((L, R))
    assert REPEAT["min_length"] <= L <= REPEAT["max_length"]
    assert REPEAT["min_repeats"] <= R <= REPEAT["max_repeats"]
    assert obs[rep_t, nb + 1] == np.float32(R) / np.float32(norm)
    pattern = obs[1:L + 1, :nb]
    assert np.all(obs[0, :nb] == 0) and np.all(obs[L + 1:, :nb] == 0)
    # Response: the pattern tiled R times, then the end marker; nothing else anywhere.
    expected = np.zeros((T, nb + 1))
    expected[L + 2:L + 2 + L * R, :nb] = np.tile(pattern, (R, 1))
    expected[L + 2 + L * R, nb] = 1
    np.testing.assert_array_equal(targ, expected)
    expected_mask = np.zeros(T)
    expected_mask[L + 2:L + 2 + L * R + 1] = 1
    np.testing.assert_array_equal(mask, expected_mask)
    assert mask.sum() == L * R + 1
  assert len({l for l, _ in seen}) > 1 and len({r for _, r in seen}) > 1


def test_repeat_copy_zero_repeats_is_end_marker_only():
  args = dict(REPEAT, min_repeats=0, max_repeats=0)
  b = as_np(repeat_copy(jax.random.key(2), **args))
  nb = args["num_bits"]
  for obs, targ, mask in zip(*b, strict=True):
    (rep_t,) = np.flatnonzero(obs[:, nb]) + 1  # start flag is at 0, repeat count would be at L + 1
    assert np.all(obs[:, nb + 1] == 0)  # 0 / norm_max
    (end,) = np.flatnonzero(mask)
    assert targ[end, nb] == 1 and np.all(targ[end, :nb] == 0) and targ.sum() == 1
  assert b.observations.shape[1] == args["max_length"] + 3


def decode_recall(obs, nb, K):
  """Walks the observation left to right: items after item delimiters, the query between query ones."""
  items, query, t = [], None, 0
  while t < len(obs):
    if obs[t, nb] == 1:
      items.append(tuple(map(tuple, obs[t + 1:t + 1 + K, :nb])))
      t += K + 1
    elif obs[t, nb + 1] == 1:
      query = tuple(map(tuple, obs[t + 1:t + 1 + K, :nb]))
      assert obs[t + K + 1, nb + 1] == 1  # closing query delimiter
      return items, query, t + K + 2
    else:
      raise AssertionError(f"unexpected step {t}: {obs[t]}")
  raise AssertionError("no query")


def test_associative_recall_answer_is_the_item_after_the_query():
  b = as_np(associative_recall(jax.random.key(3), **RECALL))
  nb, K, M = RECALL["num_bits"], RECALL["item_length"], RECALL["max_items"]
  T = M * (K + 1) + 2 * K + 2
  check_common(b, 16, T, nb + 2, nb)
  counts = []
  for obs, targ, mask in zip(*b, strict=True):
    items, query, start = decode_recall(obs, nb, K)
    counts.append(len(items))
    assert RECALL["min_items"] <= len(items) <= RECALL["max_items"]
    assert len(set(items)) == len(items)  # distinct items: the answer is unambiguous
    answer = None
    for i in range(len(items) - 1):
      if items[i] == query:
        answer = items[i + 1]
    assert answer is not None, "the query must be an item with a successor"
    assert np.all(obs[start:] == 0)
    expected_mask = np.zeros(T)
    expected_mask[start:start + K] = 1
    np.testing.assert_array_equal(mask, expected_mask)
    np.testing.assert_array_equal(targ[start:start + K], np.array(answer))
  assert len(set(counts)) > 1


def test_associative_recall_paper_defaults():
  b = associative_recall(jax.random.key(4), batch_size=2)
  assert b.observations.shape == (2, 6 * 4 + 2 * 3 + 2, 8) and b.targets.shape == (2, 32, 6)


def test_priority_sort_outputs_sorted_by_priority():
  b = as_np(priority_sort(jax.random.key(5), **SORT))
  nb, n, m = SORT["num_bits"], SORT["num_inputs"], SORT["num_outputs"]
  T = n + 1 + m
  check_common(b, 4, T, nb + 2, nb)
  for obs, targ, mask in zip(*b, strict=True):
    vectors = [tuple(obs[t, :nb]) for t in range(n)]
    priorities = [float(obs[t, nb]) for t in range(n)]
    assert all(-1 <= p <= 1 for p in priorities) and len(set(priorities)) == n
    assert np.all(obs[:n, nb + 1] == 0) and obs[n, nb + 1] == 1 and np.all(obs[n + 1:] == 0)
    ranked = sorted(range(n), key=lambda i: priorities[i], reverse=True)[:m]
    np.testing.assert_array_equal(targ[n + 1:], np.array([vectors[i] for i in ranked]))
    np.testing.assert_array_equal(mask, np.r_[np.zeros(n + 1), np.ones(m)])


@pytest.mark.parametrize("fn,kwargs", TASKS, ids=TASK_IDS)
def test_jit_matches_eager_and_is_deterministic(fn, kwargs):
  jitted = jax.jit(fn, static_argnames=tuple(kwargs))
  key = jax.random.key(7)
  eager = fn(key, **kwargs)
  for a, b in zip(eager, jitted(key, **kwargs), strict=True):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(eager, fn(key, **kwargs), strict=True):
    np.testing.assert_array_equal(a, b)
  other = fn(jax.random.key(8), **kwargs)
  assert not np.array_equal(eager.observations, other.observations)


def test_raw_uint32_key():
  a, b = copy_task(jax.random.PRNGKey(7), **COPY), copy_task(jax.random.PRNGKey(7), **COPY)
  assert a.observations.shape == (16, 13, 4)
  np.testing.assert_array_equal(a.observations, b.observations)


BAD = [
    (copy_task, dict(COPY, min_length=7), "min_length"),
    (copy_task, dict(COPY, min_length=0), "min_length"),
    (copy_task, dict(COPY, num_bits=0), "num_bits"),
    (copy_task, dict(COPY, batch_size=-1), "batch_size"),
    (copy_task, dict(COPY, max_length=2.5), "max_length"),
    (repeat_copy, dict(REPEAT, min_repeats=4), "min_repeats"),
    (repeat_copy, dict(REPEAT, min_repeats=-1), "min_repeats"),
    (repeat_copy, dict(REPEAT, min_length=5), "min_length"),
    (repeat_copy, dict(REPEAT, norm_max=0.0), "norm_max"),
    (repeat_copy, dict(REPEAT, norm_max=float("inf")), "norm_max"),
    (associative_recall, dict(RECALL, min_items=1), "min_items"),
    (associative_recall, dict(RECALL, min_items=6), "min_items"),
    (associative_recall, dict(RECALL, item_length=0), "item_length"),
    (associative_recall, dict(RECALL, num_bits=1, item_length=2, max_items=5), "max_items"),
    (priority_sort, dict(SORT, num_outputs=8), "num_outputs"),
    (priority_sort, dict(SORT, num_inputs=0), "num_inputs"),
]


@pytest.mark.parametrize("fn,kwargs,name", BAD, ids=[f"{f.__name__}-{n}" for f, _, n in BAD])
def test_bad_arguments_name_the_argument(fn, kwargs, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    fn(jax.random.key(0), **kwargs)


def test_bad_key():
  with pytest.raises(ValueError, match="`key`"):
    copy_task(0, **COPY)
  with pytest.raises(ValueError, match="`key`"):
    copy_task(jax.random.split(jax.random.key(0), 2), **COPY)


# ----------------------------------------------------------------------------- losses


def numpy_xent(logits, targets, mask, reduction):
  """float64 loops: -z log σ(x) - (1 - z) log(1 - σ(x)), summed over channels."""
  x, z, m = (np.asarray(a, np.float64) for a in (logits, targets, mask))
  B, T, C = x.shape
  step = np.zeros((B, T))
  for b in range(B):
    for t in range(T):
      for c in range(C):
        p = 1 / (1 + np.exp(-x[b, t, c]))
        step[b, t] -= z[b, t, c] * np.log(p) + (1 - z[b, t, c]) * np.log(1 - p)
  step *= m
  if reduction == "mean":
    return step.sum() / m.sum()
  per_example = step.sum(axis=1)
  if reduction == "deepmind_time_average":
    per_example /= m.sum(axis=1) + np.finfo(np.float32).eps
  return per_example.mean()


@pytest.mark.parametrize("reduction", ["mean", "deepmind", "deepmind_time_average"])
def test_loss_matches_numpy(reduction):
  batch = repeat_copy(jax.random.key(9), **REPEAT)
  logits = 2.0 * jax.random.normal(jax.random.key(10), batch.targets.shape)
  loss = masked_sigmoid_cross_entropy(logits, batch.targets, batch.mask, reduction=reduction)
  assert loss.shape == () and loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, numpy_xent(logits, batch.targets, batch.mask, reduction), rtol=1e-5)


def test_loss_default_and_edge_cases():
  batch = copy_task(jax.random.key(11), **COPY)
  logits = jax.random.normal(jax.random.key(12), batch.targets.shape)
  np.testing.assert_allclose(masked_sigmoid_cross_entropy(logits, batch.targets, batch.mask),
                             numpy_xent(logits, batch.targets, batch.mask, "mean"), rtol=1e-5)
  # Unmasked steps do not count; an all-zero mask gives 0, not NaN.
  noisy = jnp.where(batch.mask[:, :, None] > 0, logits, 1e3)
  assert masked_sigmoid_cross_entropy(noisy, batch.targets, batch.mask) == pytest.approx(
      float(masked_sigmoid_cross_entropy(logits, batch.targets, batch.mask)), rel=1e-6)
  assert float(masked_sigmoid_cross_entropy(logits, batch.targets, jnp.zeros_like(batch.mask))) == 0.0
  # Confident, correct logits: loss ~ 0, and large logits stay finite.
  sure = 50.0 * (2 * batch.targets - 1)
  assert float(masked_sigmoid_cross_entropy(sure, batch.targets, batch.mask)) < 1e-6
  assert np.isfinite(float(masked_sigmoid_cross_entropy(-sure, batch.targets, batch.mask)))
  grad = jax.grad(lambda x: masked_sigmoid_cross_entropy(x, batch.targets, batch.mask))(logits)
  assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[np.asarray(batch.mask) == 0] == 0)


def test_bit_error_rate():
  batch = associative_recall(jax.random.key(13), **RECALL)
  perfect = 3.0 * (2 * batch.targets - 1)
  assert float(bit_error_rate(perfect, batch.targets, batch.mask)) == 0.0
  assert float(bit_error_rate(-perfect, batch.targets, batch.mask)) == 1.0
  # Random logits vs. a numpy count over masked steps only.
  logits = np.asarray(jax.random.normal(jax.random.key(14), batch.targets.shape))
  t, m = np.asarray(batch.targets), np.asarray(batch.mask)
  wrong = ((logits > 0) != (t > 0.5)) & (m[:, :, None] > 0)
  expected = wrong.sum() / (m.sum() * t.shape[-1])
  np.testing.assert_allclose(bit_error_rate(logits, batch.targets, batch.mask), expected, rtol=1e-6)
  assert float(bit_error_rate(logits, batch.targets, jnp.zeros_like(batch.mask))) == 0.0


@pytest.mark.parametrize("fn", [masked_sigmoid_cross_entropy, bit_error_rate])
def test_metric_shape_errors(fn):
  x, m = jnp.zeros((2, 5, 3)), jnp.ones((2, 5))
  with pytest.raises(ValueError, match="`logits`"):
    fn(jnp.zeros((2, 5)), x, m)
  with pytest.raises(ValueError, match="`mask`"):
    fn(x, x, jnp.ones((2, 5, 1)))
  with pytest.raises(ValueError, match="channels"):
    fn(x, jnp.zeros((2, 5, 4)), m)
  with pytest.raises(ValueError, match="lengths"):
    fn(x, x, jnp.ones((2, 6)))


def test_loss_bad_reduction():
  x = jnp.zeros((1, 2, 3))
  with pytest.raises(ValueError, match="`reduction`"):
    masked_sigmoid_cross_entropy(x, x, jnp.ones((1, 2)), reduction="sum")


def test_jitted_metrics():
  batch = copy_task(jax.random.key(15), **COPY)
  logits = jax.random.normal(jax.random.key(16), batch.targets.shape)
  for fn in (masked_sigmoid_cross_entropy, bit_error_rate, functools.partial(
      masked_sigmoid_cross_entropy, reduction="deepmind")):
    np.testing.assert_allclose(jax.jit(fn)(logits, batch.targets, batch.mask),
                               fn(logits, batch.targets, batch.mask), rtol=1e-6)
