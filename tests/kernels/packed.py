"""Shared by the kernels' packed-sequence tests: two packed rows and their four documents, and the check that a
kernel called with ``segment_ids`` equals the kernel on each document alone, in values and gradients.

Row 0 holds two documents, the first with a padding token inside it; row 1 starts with padding. Every document
is 4 tokens, so the four run alone as one batch ``[4, 4, ...]`` (one program)."""

import jax
import jax.numpy as jnp
import numpy as np

PACKED = np.array([[1, 1, 0, 1, 1, 2, 2, 2, 2], [0, 4, 4, 4, 4, 6, 6, 6, 6]], np.int32)
RUNS_B = np.array([0, 0, 1, 1])
RUNS_T = np.array([[0, 1, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4], [5, 6, 7, 8]])


def runs(ids):
  """The segments of one row: lists of token indices (padding skipped, equal neighbours joined)."""
  out = []
  for t in np.flatnonzero(ids):
    if out and ids[out[-1][-1]] == ids[t]:
      out[-1].append(t)
    else:
      out.append([t])
  return [np.asarray(r) for r in out]


def check_packed_equals_alone(fn, xs, *, rtol, atol, seed=0):
  """``fn(*xs, segment_ids=None) -> o [B, T, ...]`` with ``xs`` token inputs ``[2, 9, ...]``: the packed call's
  outputs and the gradients of ``<c, o>`` (a random ``c``, zero at padding) w.r.t. every ``x`` equal those of
  the four documents run alone; padding outputs are 0 and padding inputs get zero gradient."""
  valid = PACKED != 0
  o_shape = jax.eval_shape(lambda *a: fn(*a, segment_ids=PACKED), *xs).shape
  cot = np.random.default_rng(seed).normal(size=o_shape).astype(np.float32)
  cot = cot * valid.reshape(valid.shape + (1,) * (len(o_shape) - 2))
  take = lambda x: x[RUNS_B[:, None], RUNS_T]
  alone_xs = [take(np.asarray(x)) for x in xs]

  def packed(*a):
    o = fn(*a, segment_ids=PACKED)
    return jnp.vdot(cot, o), o

  def alone(*a):
    o = fn(*a)
    return jnp.vdot(take(cot), o), o

  argnums = tuple(range(len(xs)))
  (_, o_p), g_p = jax.jit(jax.value_and_grad(packed, argnums, has_aux=True))(*xs)
  (_, o_a), g_a = jax.jit(jax.value_and_grad(alone, argnums, has_aux=True))(*alone_xs)
  np.testing.assert_allclose(take(np.asarray(o_p)), o_a, rtol=rtol, atol=atol, err_msg="outputs")
  assert not np.any(np.asarray(o_p)[~valid]), "padding outputs are 0"
  for i, (a, b) in enumerate(zip(g_p, g_a, strict=True)):
    np.testing.assert_allclose(take(np.asarray(a)), b, rtol=rtol, atol=atol, err_msg=f"d/dx{i}")
    assert not np.any(np.asarray(a)[~valid]), f"d/dx{i} at padding"
