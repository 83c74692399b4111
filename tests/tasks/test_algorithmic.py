"""Algorithmic tasks, checked against plain numpy / Python decodings of each spec.

Each generator is compiled once, at one awkward canonical configuration per task (module-scoped
batches); one jitted program holds all four generators (and the copy task on a raw ``uint32`` key)
and must reproduce the eager batches bit for bit (random bits are integer arithmetic). The losses
are checked against float64 numpy loops, values and gradient, on one canonical batch.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.tasks import (
    TaskBatch,
    associative_recall,
    copy_task,
    priority_sort,
    repeat_copy,
)
from jaxmem.train.losses import bit_error_rate, masked_sigmoid_cross_entropy

COPY = dict(batch_size=16, num_bits=3, min_length=2, max_length=6)
# min_repeats = 0: some examples have no repeat at all (target = the end marker alone).
REPEAT = dict(batch_size=16, num_bits=3, min_length=1, max_length=4, min_repeats=0, max_repeats=3,
              norm_max=10.0)
RECALL = dict(batch_size=16, num_bits=2, item_length=2, min_items=2, max_items=5)
SORT = dict(batch_size=5, num_bits=3, num_inputs=7, num_outputs=5)

TASKS = {"copy": (copy_task, COPY), "repeat_copy": (repeat_copy, REPEAT),
         "associative_recall": (associative_recall, RECALL), "priority_sort": (priority_sort, SORT)}
SEED = 7


def as_np(batch):
  return TaskBatch(*(np.asarray(x) for x in batch))


@jax.jit
def _all_tasks_jitted(key, raw_key):
  """Every generator inside one jitted program, plus the copy task on a raw ``PRNGKey``."""
  out = {name: fn(key, **kw) for name, (fn, kw) in TASKS.items()}
  out["copy_raw_key"] = copy_task(raw_key, **COPY)
  return out


@pytest.fixture(scope="module")
def batches():
  """The eager (public-call) batch of every task at ``key(SEED)``: one compilation per task."""
  return {name: fn(jax.random.key(SEED), **kw) for name, (fn, kw) in TASKS.items()}


@pytest.fixture(scope="module")
def nb(batches):
  return {name: as_np(b) for name, b in batches.items()}


def check_common(batch, B, T, C_in, C_out):
  for x in batch:
    assert x.dtype == jnp.float32
  assert batch.observations.shape == (B, T, C_in)
  assert batch.targets.shape == (B, T, C_out)
  assert batch.mask.shape == (B, T)
  assert set(np.unique(batch.mask)) <= {0.0, 1.0}
  # Targets only where the mask is on.
  assert np.all(batch.targets[batch.mask == 0] == 0)


def test_copy_target_is_the_pattern(nb):
  b = nb["copy"]
  n_bits, T = COPY["num_bits"], 2 * COPY["max_length"] + 1
  check_common(b, COPY["batch_size"], T, n_bits + 1, n_bits)
  lengths = []
  for obs, targ, mask in zip(*b, strict=True):
    (delim,) = np.flatnonzero(obs[:, n_bits])  # exactly one delimiter, at t = L
    L = int(delim)
    lengths.append(L)
    assert COPY["min_length"] <= L <= COPY["max_length"]
    pattern = obs[:L, :n_bits]
    assert set(np.unique(pattern)) <= {0.0, 1.0}
    assert np.all(obs[L, :n_bits] == 0) and np.all(obs[L + 1:] == 0)
    np.testing.assert_array_equal(targ[L + 1:2 * L + 1], pattern)
    expected_mask = np.zeros(T)
    expected_mask[L + 1:2 * L + 1] = 1
    np.testing.assert_array_equal(mask, expected_mask)
  assert len(set(lengths)) > 1


def test_repeat_copy_matches_deepmind_layout_including_zero_repeats(nb):
  """DeepMind's layout step for step; with R = 0 the response is the end marker alone."""
  b = nb["repeat_copy"]
  n_bits, norm = REPEAT["num_bits"], REPEAT["norm_max"]
  T = REPEAT["max_length"] * (REPEAT["max_repeats"] + 1) + 3
  check_common(b, REPEAT["batch_size"], T, n_bits + 2, n_bits + 1)
  seen = set()
  for obs, targ, mask in zip(*b, strict=True):
    L = int(np.flatnonzero(mask)[0]) - 2  # the response starts at L + 2
    R = int(round(float(obs[L + 1, n_bits + 1]) * norm))  # repeat count right after the pattern
    seen.add((L, R))
    assert REPEAT["min_length"] <= L <= REPEAT["max_length"]
    assert REPEAT["min_repeats"] <= R <= REPEAT["max_repeats"]
    pattern = obs[1:L + 1, :n_bits]
    assert set(np.unique(pattern)) <= {0.0, 1.0}
    # Observation: start flag at t = 0, the pattern, R / norm_max at L + 1; nothing else anywhere.
    expected_obs = np.zeros((T, n_bits + 2), np.float32)
    expected_obs[0, n_bits] = 1
    expected_obs[1:L + 1, :n_bits] = pattern
    expected_obs[L + 1, n_bits + 1] = np.float32(R) / np.float32(norm)
    np.testing.assert_array_equal(obs, expected_obs)
    # Response: the pattern tiled R times, then the end marker; nothing else anywhere.
    expected = np.zeros((T, n_bits + 1))
    expected[L + 2:L + 2 + L * R, :n_bits] = np.tile(pattern, (R, 1))
    expected[L + 2 + L * R, n_bits] = 1
    np.testing.assert_array_equal(targ, expected)
    expected_mask = np.zeros(T)
    expected_mask[L + 2:L + 2 + L * R + 1] = 1
    np.testing.assert_array_equal(mask, expected_mask)
    assert mask.sum() == L * R + 1
    if R == 0:  # the end marker alone, right after the (zero) repeat count
      assert np.all(obs[:, n_bits + 1] == 0) and targ.sum() == 1 and targ[L + 2, n_bits] == 1
  lengths, repeats = {l for l, _ in seen}, {r for _, r in seen}
  assert len(lengths) > 1 and 0 in repeats and len(repeats) > 2


def test_static_lengths_of_repeat_copy_without_repeats_and_recall_paper_defaults():
  """The static T formulas at two more configurations (traced only, nothing compiled)."""
  key = jax.random.key(0)
  zero = jax.eval_shape(lambda k: repeat_copy(k, **dict(REPEAT, min_repeats=0, max_repeats=0)), key)
  assert zero.observations.shape == (16, REPEAT["max_length"] + 3, 5) and zero.mask.shape == (16, 7)
  paper = jax.eval_shape(lambda k: associative_recall(k, batch_size=2), key)
  assert paper.observations.shape == (2, 6 * 4 + 2 * 3 + 2, 8) and paper.targets.shape == (2, 32, 6)


def decode_recall(obs, n_bits, K):
  """Walks the observation left to right: items after item delimiters, the query between query ones."""
  items, query, t = [], None, 0
  while t < len(obs):
    if obs[t, n_bits] == 1:
      items.append(tuple(map(tuple, obs[t + 1:t + 1 + K, :n_bits])))
      t += K + 1
    elif obs[t, n_bits + 1] == 1:
      query = tuple(map(tuple, obs[t + 1:t + 1 + K, :n_bits]))
      assert obs[t + K + 1, n_bits + 1] == 1  # closing query delimiter
      return items, query, t + K + 2
    else:
      raise AssertionError(f"unexpected step {t}: {obs[t]}")
  raise AssertionError("no query")


def test_associative_recall_answer_is_the_item_after_the_query(nb):
  b = nb["associative_recall"]
  n_bits, K, M = RECALL["num_bits"], RECALL["item_length"], RECALL["max_items"]
  T = M * (K + 1) + 2 * K + 2
  check_common(b, RECALL["batch_size"], T, n_bits + 2, n_bits)
  counts = []
  for obs, targ, mask in zip(*b, strict=True):
    items, query, start = decode_recall(obs, n_bits, K)
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


def test_priority_sort_outputs_sorted_by_priority(nb):
  b = nb["priority_sort"]
  n_bits, n, m = SORT["num_bits"], SORT["num_inputs"], SORT["num_outputs"]
  T = n + 1 + m
  check_common(b, SORT["batch_size"], T, n_bits + 2, n_bits)
  for obs, targ, mask in zip(*b, strict=True):
    vectors = [tuple(obs[t, :n_bits]) for t in range(n)]
    priorities = [float(obs[t, n_bits]) for t in range(n)]
    assert all(-1 <= p <= 1 for p in priorities) and len(set(priorities)) == n
    assert np.all(obs[:n, n_bits + 1] == 0) and obs[n, n_bits + 1] == 1 and np.all(obs[n + 1:] == 0)
    ranked = sorted(range(n), key=lambda i: priorities[i], reverse=True)[:m]
    np.testing.assert_array_equal(targ[n + 1:], np.array([vectors[i] for i in ranked]))
    np.testing.assert_array_equal(mask, np.r_[np.zeros(n + 1), np.ones(m)])


def test_jit_matches_eager_is_deterministic_and_takes_raw_keys(batches):
  """Under jit every generator gives the eager batch; the same key gives the same batch and another
  key another; a raw ``uint32[2]`` ``PRNGKey(s)`` gives the batch of the typed ``key(s)``."""
  key = jax.random.key(SEED)
  jitted = _all_tasks_jitted(key, jax.random.PRNGKey(SEED))
  assert jax.random.PRNGKey(SEED).dtype == jnp.uint32
  for name, (fn, kw) in TASKS.items():
    for a, b in zip(batches[name], jitted[name], strict=True):
      np.testing.assert_array_equal(a, b)
    for a, b in zip(batches[name], fn(key, **kw), strict=True):
      np.testing.assert_array_equal(a, b)
    other = fn(jax.random.key(SEED + 1), **kw)
    assert not np.array_equal(batches[name].observations, other.observations), name
  for a, b in zip(batches["copy"], jitted["copy_raw_key"], strict=True):
    np.testing.assert_array_equal(a, b)


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

REDUCTIONS = ("mean", "deepmind", "deepmind_time_average")


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


@jax.jit
def _metrics_jitted(logits, targets, mask):
  """Every loss and metric, and the gradient of the mean loss, in one jitted program."""
  loss, grad = jax.value_and_grad(lambda x: masked_sigmoid_cross_entropy(x, targets, mask))(logits)
  losses = {r: masked_sigmoid_cross_entropy(logits, targets, mask, reduction=r) for r in REDUCTIONS}
  return loss, grad, losses, bit_error_rate(logits, targets, mask)


@pytest.fixture(scope="module")
def metric_case(nb):
  """The canonical repeat-copy batch and random float32 logits (numpy: nothing to compile)."""
  b = nb["repeat_copy"]
  logits = (2.0 * np.random.default_rng(10).standard_normal(b.targets.shape)).astype(np.float32)
  return logits, b.targets, b.mask


def test_loss_matches_numpy_for_every_reduction(metric_case):
  logits, targets, mask = metric_case
  for reduction in REDUCTIONS:
    loss = masked_sigmoid_cross_entropy(logits, targets, mask, reduction=reduction)
    assert loss.shape == () and loss.dtype == jnp.float32
    np.testing.assert_allclose(loss, numpy_xent(logits, targets, mask, reduction), rtol=1e-5)
  np.testing.assert_allclose(masked_sigmoid_cross_entropy(logits, targets, mask),   # default: "mean"
                             numpy_xent(logits, targets, mask, "mean"), rtol=1e-5)


def test_loss_edge_cases(metric_case):
  logits, targets, mask = metric_case
  # Unmasked steps do not count; an all-zero mask gives 0, not NaN.
  noisy = np.where(mask[:, :, None] > 0, logits, np.float32(1e3))
  assert masked_sigmoid_cross_entropy(noisy, targets, mask) == pytest.approx(
      float(masked_sigmoid_cross_entropy(logits, targets, mask)), rel=1e-6)
  assert float(masked_sigmoid_cross_entropy(logits, targets, np.zeros_like(mask))) == 0.0
  # Confident, correct logits: loss ~ 0, and large logits stay finite.
  sure = (50.0 * (2 * targets - 1)).astype(np.float32)
  assert float(masked_sigmoid_cross_entropy(sure, targets, mask)) < 1e-6
  assert np.isfinite(float(masked_sigmoid_cross_entropy(-sure, targets, mask)))


def test_jitted_metrics_and_loss_gradient(metric_case):
  """Under jit the losses and the bit error rate equal the eager ones; the gradient of the mean loss
  is m·(σ(x) − z) / Σm (float64 reference): finite, and exactly 0 at unmasked steps."""
  logits, targets, mask = metric_case
  loss, grad, losses, ber = _metrics_jitted(logits, targets, mask)
  np.testing.assert_allclose(loss, masked_sigmoid_cross_entropy(logits, targets, mask), rtol=1e-6)
  for r in REDUCTIONS:
    np.testing.assert_allclose(losses[r], masked_sigmoid_cross_entropy(logits, targets, mask, reduction=r),
                               rtol=1e-6)
  np.testing.assert_allclose(ber, bit_error_rate(logits, targets, mask), rtol=1e-6)
  grad = np.asarray(grad)
  assert np.all(np.isfinite(grad)) and np.all(grad[mask == 0] == 0)
  x, z, m = (np.asarray(a, np.float64) for a in (logits, targets, mask))
  want = m[:, :, None] * (1 / (1 + np.exp(-x)) - z) / m.sum()
  # Each entry is (σ(x) − z) / Σm from O(1) float32 terms: |err| ≤ ~8·2⁻²⁴ < 1e-6.
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)


def test_bit_error_rate(metric_case):
  logits, targets, mask = metric_case
  perfect = (3.0 * (2 * targets - 1)).astype(np.float32)
  assert float(bit_error_rate(perfect, targets, mask)) == 0.0
  assert float(bit_error_rate(-perfect, targets, mask)) == 1.0
  # Random logits vs. a numpy count over masked steps only.
  wrong = ((logits > 0) != (targets > 0.5)) & (mask[:, :, None] > 0)
  expected = wrong.sum() / (mask.sum() * targets.shape[-1])
  np.testing.assert_allclose(bit_error_rate(logits, targets, mask), expected, rtol=1e-6)
  assert float(bit_error_rate(logits, targets, np.zeros_like(mask))) == 0.0


@pytest.mark.parametrize("fn", [masked_sigmoid_cross_entropy, bit_error_rate])
def test_metric_shape_errors(fn):
  x, m = np.zeros((2, 5, 3), np.float32), np.ones((2, 5), np.float32)
  with pytest.raises(ValueError, match="`logits`"):
    fn(np.zeros((2, 5), np.float32), x, m)
  with pytest.raises(ValueError, match="`mask`"):
    fn(x, x, np.ones((2, 5, 1), np.float32))
  with pytest.raises(ValueError, match="channels"):
    fn(x, np.zeros((2, 5, 4), np.float32), m)
  with pytest.raises(ValueError, match="lengths"):
    fn(x, x, np.ones((2, 6), np.float32))


def test_loss_bad_reduction():
  x = np.zeros((1, 2, 3), np.float32)
  with pytest.raises(ValueError, match="`reduction`"):
    masked_sigmoid_cross_entropy(x, x, np.ones((1, 2), np.float32), reduction="sum")
