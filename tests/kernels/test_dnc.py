"""DNC memory access re-derived from the Nature 2016 equations (independent numpy loops)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxmem.kernels import dnc

N, W, R = 7, 5, 3  # awkward sizes on purpose


def np_step(state, it):
  """The DNC step written directly from the paper with numpy loops, float64."""
  M, u, L, p, wr, ww_prev = (np.asarray(x, np.float64) for x in state)
  it = [np.asarray(x, np.float64) for x in it]
  rk, rs, wk, ws, e, v, f, ga, gw, pi = it
  n = M.shape[0]

  def content(Mx, k, beta):
    sims = np.array([k @ Mx[i] / (np.sqrt(k @ k + 1e-6) * np.sqrt(Mx[i] @ Mx[i] + 1e-6)) for i in range(n)])
    z = np.exp(beta * sims - (beta * sims).max())
    return z / z.sum()

  psi = np.ones(n)
  for i in range(len(f)):
    psi *= 1 - f[i] * wr[i]
  u = (u + ww_prev - u * ww_prev) * psi
  order = sorted(range(n), key=lambda i: (u[i], i))  # stable ascending
  a = np.zeros(n)
  prod = 1.0
  for j in order:
    a[j] = (1 - u[j]) * prod
    prod *= u[j]
  ww = gw * (ga * a + (1 - ga) * content(M, wk, ws))
  M = M * (1 - np.outer(ww, e)) + np.outer(ww, v)
  L_new = np.zeros_like(L)
  for i in range(n):
    for j in range(n):
      if i != j:
        L_new[i, j] = (1 - ww[i] - ww[j]) * L[i, j] + ww[i] * p[j]
  p = (1 - ww.sum()) * p + ww
  new_wr = np.zeros_like(wr)
  for i in range(len(rs)):
    fwd, bwd = L_new @ wr[i], L_new.T @ wr[i]
    new_wr[i] = pi[i, 0] * bwd + pi[i, 1] * content(M, rk[i], rs[i]) + pi[i, 2] * fwd
  reads = new_wr @ M
  return (M, u, L_new, p, new_wr, ww), reads


def random_interface(key, n_words=W, n_reads=R, scale=1.0):
  xi = scale * jax.random.normal(key, (dnc.interface_size(n_words, n_reads),))
  return dnc.parse_interface(xi, n_words, n_reads)


def test_steps_match_numpy_reference():
  state = dnc.init(N, W, R)
  np_state = tuple(np.asarray(x) for x in state)
  step = jax.jit(dnc.step)
  for t in range(6):
    it = random_interface(jax.random.key(t))
    state, reads = step(state, it)
    np_state, np_reads = np_step(np_state, it)
    np.testing.assert_allclose(reads, np_reads, rtol=1e-4, atol=1e-5)
    for name, a, b in zip(dnc.DNCState._fields, state, np_state, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"step {t}: {name}")


def test_link_diagonal_is_zero():
  state = dnc.init(N, W, R)
  for t in range(5):
    state, _ = dnc.step(state, random_interface(jax.random.key(10 + t)))
  assert np.all(np.diag(np.asarray(state.link)) == 0)
  assert np.abs(np.asarray(state.link)).sum() > 0


def _write_only(slot_n, n=N):
  """Interface writing a one-hot location via allocation (gates 1, free gates 0)."""
  return dnc.DNCInterface(
      read_keys=jnp.zeros((R, W)), read_strengths=jnp.ones((R,)), write_key=jnp.zeros((W,)),
      write_strength=jnp.ones(()), erase_vector=jnp.ones((W,)), write_vector=jnp.ones((W,)) * slot_n,
      free_gates=jnp.zeros((R,)), allocation_gate=jnp.ones(()), write_gate=jnp.ones(()),
      read_modes=jnp.tile(jnp.array([0.0, 1.0, 0.0]), (R, 1)),
  )


def test_writes_zero_then_one_link_column_zero_is_one_hot_one():
  link = jnp.zeros((N, N))
  prec = jnp.zeros((N,))
  for slot in (0, 1):
    link, prec = dnc.update_link(link, prec, jax.nn.one_hot(slot, N))
  np.testing.assert_array_equal(link[:, 0], jax.nn.one_hot(1, N))
  np.testing.assert_array_equal(prec, jax.nn.one_hot(1, N))


@pytest.mark.parametrize("seed", range(5))
def test_argmin_usage_is_argmax_allocation(seed):
  usage = jax.random.uniform(jax.random.key(seed), (11,))
  a = dnc.allocation_weights(usage)
  assert int(jnp.argmin(usage)) == int(jnp.argmax(a))
  assert 0 <= float(a.sum()) <= 1 + 1e-6


def test_allocation_ties_break_stably():
  a = dnc.allocation_weights(jnp.zeros(4))
  np.testing.assert_array_equal(a, jax.nn.one_hot(0, 4))


def test_erase_one_at_a_one_hot_location_clears_that_row():
  state = dnc.init(N, W, R)._replace(memory=jax.random.normal(jax.random.key(0), (N, W)))
  # full usage except slot 3 -> allocation is one-hot at 3
  state = state._replace(usage=jnp.ones(N).at[3].set(0.0))
  it = _write_only(0)._replace(write_vector=jnp.zeros((W,)))
  new, _ = dnc.step(state, it)
  np.testing.assert_allclose(new.write_weights, jax.nn.one_hot(3, N), atol=1e-6)
  np.testing.assert_allclose(new.memory[3], 0.0, atol=1e-6)
  np.testing.assert_allclose(np.delete(np.asarray(new.memory), 3, 0),
                             np.delete(np.asarray(state.memory), 3, 0), atol=1e-6)


def test_reduces_to_write_once_memory_with_shift_link():
  """Free gates 0, allocation & write gates 1: slot t gets write t; link = sub-diagonal shift."""
  T = N
  state = dnc.init(N, W, R)
  values = jax.random.normal(jax.random.key(1), (T, W))
  for t in range(T):
    state, _ = dnc.step(state, _write_only(0)._replace(write_vector=values[t]))
  np.testing.assert_allclose(state.memory, values, atol=1e-6)
  np.testing.assert_allclose(state.link, np.eye(N, k=-1), atol=1e-6)


def test_forward_mode_reads_the_successor():
  state = dnc.init(N, W, R)
  values = jax.random.normal(jax.random.key(2), (3, W))
  for t in range(3):
    state, _ = dnc.step(state, _write_only(0)._replace(write_vector=values[t]))
  # attend slot 0, then read forward with no write: should get slot 1
  state = state._replace(read_weights=jnp.tile(jax.nn.one_hot(0, N), (R, 1)))
  it = _write_only(0)._replace(write_gate=jnp.zeros(()),
                               read_modes=jnp.tile(jnp.array([0.0, 0.0, 1.0]), (R, 1)))
  _, reads = dnc.step(state, it)
  np.testing.assert_allclose(reads[0], values[1], atol=1e-5)


def _loss_over_steps(xis, n_steps=3, n_words=3, n_reads=2, n_slots=4):
  state = dnc.init(n_slots, n_words, n_reads, dtype=xis.dtype)
  total = 0.0
  for t in range(n_steps):
    state, reads = dnc.step(state, dnc.parse_interface(xis[t], n_words, n_reads))
    total = total + jnp.sum(reads * jnp.arange(1, reads.size + 1).reshape(reads.shape))
  return total


def test_gradients_match_finite_differences():
  with jax.enable_x64(True):
    xis = 0.5 * jax.random.normal(jax.random.key(3), (3, dnc.interface_size(3, 2)), jnp.float64)
    check_grads(_loss_over_steps, (xis,), order=1, modes=("rev",), eps=1e-5, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_no_nan_over_1000_steps_values_and_gradients(scale):
  n_words, n_reads, n_slots, T = 4, 2, 6, 1000
  xis = scale * jax.random.normal(jax.random.key(4), (T, dnc.interface_size(n_words, n_reads)))

  def loss(xis):
    its = jax.vmap(lambda x: dnc.parse_interface(x, n_words, n_reads))(xis)
    state, reads = dnc.scan(dnc.init(n_slots, n_words, n_reads), its)
    return jnp.sum(reads ** 2) + jnp.sum(state.memory)

  value, grad = jax.jit(jax.value_and_grad(loss))(xis)
  assert np.isfinite(float(value))
  assert np.isfinite(np.asarray(grad)).all()


def test_extreme_strengths_and_zero_memory_have_finite_gradients():
  state = dnc.init(N, W, R)
  def loss(strength):
    it = random_interface(jax.random.key(5))._replace(
        read_strengths=jnp.full((R,), strength), write_strength=strength)
    s, reads = dnc.step(state, it)
    s, reads = dnc.step(s, it)
    return jnp.sum(reads)
  for strength in (1.0, 1e3, 1e6):
    g = jax.grad(loss)(jnp.float32(strength))
    assert np.isfinite(float(g)), strength


def test_scan_equals_python_loop_of_steps():
  its = [random_interface(jax.random.key(20 + t)) for t in range(4)]
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *its)
  state_a, reads_a = dnc.scan(dnc.init(N, W, R), stacked)
  state_b = dnc.init(N, W, R)
  for t, it in enumerate(its):
    state_b, r = dnc.step(state_b, it)
    np.testing.assert_allclose(reads_a[t], r, rtol=1e-5, atol=1e-6)
  for a, b in zip(state_a, state_b, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_parse_interface_ranges_and_bad_length():
  it = random_interface(jax.random.key(6), scale=10.0)
  dnc.check_interface(it, dnc.init(N, W, R))  # in range: no error
  assert float(it.read_strengths.min()) >= 1 and float(it.write_strength) >= 1
  np.testing.assert_allclose(it.read_modes.sum(-1), 1.0, rtol=1e-6)
  with pytest.raises(ValueError, match=r"`xi` must have shape \[\d+\]"):
    dnc.parse_interface(jnp.zeros(10), W, R)


@pytest.mark.parametrize(
    "field,value,match",
    [("read_keys", jnp.zeros((R, W + 1)), r"interface.read_keys must have shape \[3, 5\]"),
     ("read_strengths", jnp.full((R,), 0.5), r"read_strengths must be >= 1"),
     ("free_gates", jnp.full((R,), 1.5), r"free_gates must be in \[0, 1\]"),
     ("read_modes", jnp.ones((R, 3)), r"read_modes must be on the simplex"),
     ("write_vector", jnp.full((W,), jnp.nan), r"write_vector must be finite")],
)
def test_bad_interfaces_raise(field, value, match):
  it = random_interface(jax.random.key(7))._replace(**{field: value})
  with pytest.raises(ValueError, match=match):
    dnc.check_interface(it, dnc.init(N, W, R))


def test_step_rejects_wrong_shapes_even_under_jit():
  it = random_interface(jax.random.key(8))._replace(write_key=jnp.zeros((W + 2,)))
  with pytest.raises(ValueError, match="write_key"):
    jax.jit(dnc.step)(dnc.init(N, W, R), it)
  with pytest.raises(ValueError, match="`memory_size`"):
    dnc.init(0, W, R)


def test_old_names_are_aliases_of_init_step_scan():
  assert (dnc.dnc_init, dnc.dnc_step, dnc.dnc_scan) == (dnc.init, dnc.step, dnc.scan)


@pytest.mark.parametrize("usage", [
    np.random.default_rng(0).uniform(size=9),
    np.array([0.5, 0.2, 0.5, 0.0, 0.2, 1.0, 0.0]),  # ties and extremes
    np.zeros(5),
])
def test_comparison_allocation_equals_sort_allocation_values_and_gradients(usage):
  u = jnp.asarray(usage, jnp.float32)
  np.testing.assert_allclose(dnc.allocation_weights(u), dnc.allocation_weights_sorted(u), atol=1e-7)
  cot = jnp.arange(1.0, u.shape[0] + 1)
  g1 = jax.grad(lambda u: jnp.sum(dnc.allocation_weights(u) * cot))(u)
  g2 = jax.grad(lambda u: jnp.sum(dnc.allocation_weights_sorted(u) * cot))(u)
  np.testing.assert_allclose(g1, g2, atol=1e-6)


# --- non-finite values: propagated by the allocation, located by check_state / check_interface ---

_USAGE = np.array([0.5, 0.2, 0.7, 0.1, 0.2, 0.9, 0.3], np.float32)  # N = 7 slots, a tie at 0.2


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("slot", [0, 2])  # slots where colliding comparison ranks used to hide the NaN
def test_non_finite_usage_propagates_through_allocation_and_step(bad, slot):
  u = jnp.asarray(_USAGE).at[slot].set(bad)
  a = np.asarray(dnc.allocation_weights(u))
  assert np.isnan(a).all(), a
  # the argsort form is non-finite too (NaN / -inf at the bad slot only): neither is silently finite
  assert not np.isfinite(np.asarray(dnc.allocation_weights_sorted(u))).all()
  state = dnc.init(N, W, R)._replace(usage=u)
  new, _ = jax.jit(dnc.step)(state, random_interface(jax.random.key(30)))
  assert not np.isfinite(np.asarray(new.write_weights)).any(), new.write_weights


def test_finiteness_guard_keeps_values_and_gradients_of_finite_usage():
  """Finite usage: the guard is an identity in value and gradient (no NaN from the unused branch)."""
  u = jnp.asarray(_USAGE)
  cot = jnp.arange(1.0, N + 1)
  g = jax.jit(jax.grad(lambda u: jnp.sum(dnc.allocation_weights(u) * cot)))(u)
  g_sorted = jax.grad(lambda u: jnp.sum(dnc.allocation_weights_sorted(u) * cot))(u)
  assert np.isfinite(np.asarray(g)).all()
  np.testing.assert_allclose(g, g_sorted, atol=1e-6)
  np.testing.assert_allclose(dnc.allocation_weights(u), dnc.allocation_weights_sorted(u), atol=1e-7)


def _some_state():
  state = dnc.init(N, W, R)
  for t in range(2):
    state, _ = dnc.step(state, random_interface(jax.random.key(40 + t)))
  return state


@pytest.mark.parametrize("field", dnc.DNCState._fields)
def test_check_state_names_the_field_and_index_of_a_nan(field):
  state = _some_state()
  dnc.check_state(state)  # finite: no error
  x = getattr(state, field)
  idx = tuple(s - 2 for s in x.shape)
  bad = state._replace(**{field: x.at[idx].set(jnp.nan).at[tuple(s - 1 for s in x.shape)].set(jnp.inf)})
  match = rf"state\.{field} has a non-finite value at index {re.escape(str(idx))}"  # the first (row-major) one
  with pytest.raises(ValueError, match=match):
    dnc.check_state(bad)


@pytest.mark.parametrize("field,shape", [
    ("memory", (N, W, 1)), ("usage", (N + 1,)), ("link", (N, N - 1)), ("precedence", (N, 1)),
    ("read_weights", (N,)), ("write_weights", (N - 1,)),
])
def test_check_state_wrong_shape_names_the_field_even_under_jit(field, shape):
  bad = _some_state()._replace(**{field: jnp.zeros(shape)})
  with pytest.raises(ValueError, match=rf"state\.{field} must have shape"):
    dnc.check_state(bad)
  with pytest.raises(ValueError, match=rf"state\.{field} must have shape"):
    jax.jit(dnc.step)(bad, random_interface(jax.random.key(31)))


def test_check_state_skips_values_of_traced_states():
  bad = _some_state()._replace(usage=jnp.full((N,), jnp.nan))
  out = jax.jit(lambda s: (dnc.check_state(s), s.usage)[1])(bad)  # traced: no value check, no error
  assert np.isnan(np.asarray(out)).all()


def test_check_interface_reports_nan_strength_as_non_finite_with_its_index():
  it = random_interface(jax.random.key(32))._replace(read_strengths=jnp.array([2.0, jnp.nan, 3.0]))
  with pytest.raises(ValueError, match=r"interface\.read_strengths must be finite.*index \(1,\)") as err:
    dnc.check_interface(it, dnc.init(N, W, R))
  assert ">= 1" not in str(err.value)


# --- dtypes: low-precision state, float32 arithmetic ---

# A bfloat16 state vs the float32 computation from the same (rounded) start: abs and rel tolerance over a
# few steps, while usages stay apart. Usages closer than bf16's spacing (2^-8 near 1) tie when stored in
# bf16, and the allocation may then pick another slot than float32 would (a discrete jump no tolerance
# covers; e.g. from dnc.init's zero memory, where uniform content weights make near-equal usages).
BF16_TOL = 2e-2


def _reference_step(state, it):
  """The step as the plain composition of the public helpers, in the inputs' own dtype (the old kernel)."""
  usage = dnc.update_usage(state.usage, state.write_weights, it.free_gates, state.read_weights)
  write_content = dnc.content_weights(state.memory, it.write_key[None], it.write_strength[None])[0]
  alloc = dnc.allocation_weights(usage)
  ww = it.write_gate * (it.allocation_gate * alloc + (1.0 - it.allocation_gate) * write_content)
  memory = state.memory * (1.0 - jnp.outer(ww, it.erase_vector)) + jnp.outer(ww, it.write_vector)
  link, precedence = dnc.update_link(state.link, state.precedence, ww)
  content = dnc.content_weights(memory, it.read_keys, it.read_strengths)
  m = it.read_modes
  rw = m[:, 0:1] * (state.read_weights @ link) + m[:, 1:2] * content + m[:, 2:3] * (state.read_weights @ link.T)
  return dnc.DNCState(memory, usage, link, precedence, rw, ww), rw @ memory


def _stacked_interfaces(T, seed, dtype=jnp.float32):
  its = [random_interface(jax.random.key(seed + t)) for t in range(T)]
  return jax.tree.map(lambda *x: jnp.stack(x).astype(dtype), *its)


def _spread_state(seed, dtype):
  """Random memory and read weights, usages spread over [0.1, 0.9]: values rounded to ``dtype``."""
  k_m, k_u, k_r = jax.random.split(jax.random.key(seed), 3)
  state = dnc.init(N, W, R)._replace(
      memory=jax.random.normal(k_m, (N, W)), usage=jax.random.permutation(k_u, jnp.linspace(0.1, 0.9, N)),
      read_weights=jax.nn.softmax(jax.random.normal(k_r, (R, N)), axis=-1))
  return dnc.DNCState(*(x.astype(dtype) for x in state))


_scan = jax.jit(lambda s, i: jax.lax.scan(dnc.step, s, i))


def test_float32_step_is_bitwise_unchanged():
  its = _stacked_interfaces(6, 50)
  state_a, reads_a = jax.jit(lambda s, i: jax.lax.scan(dnc.step, s, i))(dnc.init(N, W, R), its)
  state_b, reads_b = jax.jit(lambda s, i: jax.lax.scan(_reference_step, s, i))(dnc.init(N, W, R), its)
  names = dnc.DNCState._fields + ("reads",)
  for name, a, b in zip(names, (*state_a, reads_a), (*state_b, reads_b), strict=True):
    assert a.dtype == jnp.float32, name
    np.testing.assert_array_equal(a, b, err_msg=name)


def test_bf16_state_scan_keeps_carry_dtypes_and_stays_close_to_float32():
  its = _stacked_interfaces(4, 60)  # a float32 controller driving a bfloat16 memory
  state16 = _spread_state(1, jnp.bfloat16)
  out16 = _scan(state16, its)  # lax.scan raises if a carry dtype changes
  out32 = _scan(dnc.DNCState(*(x.astype(jnp.float32) for x in state16)), its)
  for name, a, b in zip(dnc.DNCState._fields + ("reads",), jax.tree.leaves(out16), jax.tree.leaves(out32),
                        strict=True):
    assert a.dtype == jnp.bfloat16, name
    np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=BF16_TOL, rtol=BF16_TOL, err_msg=name)


def test_bf16_state_is_closer_to_float32_than_pure_bf16_arithmetic():
  """Same bf16 inputs; only the arithmetic differs: the kernel's float32 vs the helpers run in bfloat16."""
  its = _stacked_interfaces(4, 70, jnp.bfloat16)
  state16 = _spread_state(2, jnp.bfloat16)
  ref = _scan(dnc.DNCState(*(x.astype(jnp.float32) for x in state16)), its)
  got = _scan(state16, its)
  pure = jax.jit(lambda s, i: jax.lax.scan(_reference_step, s, i))(state16, its)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(pure))  # the baseline really is pure bf16

  def err(out):  # summed over the state fields and the reads: mean absolute error vs float32
    return sum(float(np.mean(np.abs(np.asarray(a, np.float32) - np.asarray(b))))
               for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True))

  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=BF16_TOL, rtol=BF16_TOL)
  assert err(got) < 0.75 * err(pure), (err(got), err(pure))
