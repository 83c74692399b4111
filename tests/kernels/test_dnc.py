"""DNC memory access re-derived from the Nature 2016 equations (independent float64 numpy loops).

Proven: every state field and the reads of ``dnc.step`` against a numpy loop written from the
paper (usage, stable-sort allocation, erase-then-add write, link matrix with zero diagonal,
precedence, backward / content / forward reads); hand-built cases (link of two writes, argmin
usage = argmax allocation, stable ties, erase clears a row, the write-once memory with the shift
link, forward reads); gradients against float64 finite differences; 1000 steps (one ``lax.scan``
in one jit) finite in value and gradient; ``dnc.scan`` == a loop of steps; the comparison
allocation == the argsort allocation in values and gradients; non-finite usage propagates and
``check_state`` / ``check_interface`` name the field; bfloat16 states. Every kernel call goes
through a module-level jit at the sizes N, W, R = 7, 5, 3, so each program compiles once.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


# ---- module-level jits: each compiles once per shape and dtype ----

step = jax.jit(dnc.step)
scan = jax.jit(dnc.scan)
parse = jax.jit(dnc.parse_interface, static_argnums=(1, 2))
update_link = jax.jit(dnc.update_link)
_scan = jax.jit(lambda s, i: jax.lax.scan(dnc.step, s, i))


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


_scan_reference = jax.jit(lambda s, i: jax.lax.scan(_reference_step, s, i))


@jax.jit
def allocations_and_gradients(u, cot):
  """Both allocations and the gradients of ⟨cot, allocation⟩ w.r.t. the usage."""
  def vg(fn):
    return jax.value_and_grad(lambda u: jnp.sum(fn(u) * cot))(u)[1], fn(u)
  (g, a), (g_sorted, a_sorted) = vg(dnc.allocation_weights), vg(dnc.allocation_weights_sorted)
  return a, a_sorted, g, g_sorted


def init(dtype=jnp.float32):
  """``dnc.init(N, W, R)`` as numpy arrays (no JAX program)."""
  return dnc.DNCState(*(np.asarray(x) for x in dnc.init(N, W, R, dtype)))


def random_interface(seed, n_words=W, n_reads=R, scale=1.0):
  xi = scale * np.random.default_rng(seed).normal(size=(dnc.interface_size(n_words, n_reads),))
  return parse(xi.astype(np.float32), n_words, n_reads)


def _stacked_interfaces(T, seed, dtype=np.float32):
  its = [random_interface(seed + t) for t in range(T)]
  fields = zip(*its, strict=True)
  return dnc.DNCInterface(*(np.stack([np.asarray(x) for x in xs]).astype(dtype) for xs in fields))


def test_steps_match_numpy_reference():
  state = init()
  np_state = tuple(np.asarray(x) for x in state)
  for t in range(6):
    it = random_interface(t)
    state, reads = step(state, it)
    np_state, np_reads = np_step(np_state, it)
    np.testing.assert_allclose(reads, np_reads, rtol=1e-4, atol=1e-5)
    for name, a, b in zip(dnc.DNCState._fields, state, np_state, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"step {t}: {name}")


def test_link_diagonal_is_zero():
  state = init()
  for t in range(5):
    state, _ = step(state, random_interface(10 + t))
  assert np.all(np.diag(np.asarray(state.link)) == 0)
  assert np.abs(np.asarray(state.link)).sum() > 0


def _write_only(slot_n, n=N):
  """Interface writing a one-hot location via allocation (gates 1, free gates 0)."""
  f = lambda *s: np.zeros(s, np.float32)
  return dnc.DNCInterface(
      read_keys=f(R, W), read_strengths=f(R) + 1, write_key=f(W),
      write_strength=np.float32(1), erase_vector=f(W) + 1, write_vector=f(W) + slot_n,
      free_gates=f(R), allocation_gate=np.float32(1), write_gate=np.float32(1),
      read_modes=np.tile(np.float32([0.0, 1.0, 0.0]), (R, 1)),
  )


def test_writes_zero_then_one_link_column_zero_is_one_hot_one():
  link = np.zeros((N, N), np.float32)
  prec = np.zeros((N,), np.float32)
  for slot in (0, 1):
    link, prec = update_link(link, prec, np.eye(N, dtype=np.float32)[slot])
  np.testing.assert_array_equal(link[:, 0], np.eye(N)[1])
  np.testing.assert_array_equal(prec, np.eye(N)[1])


allocation = jax.jit(dnc.allocation_weights)
allocation_sorted = jax.jit(dnc.allocation_weights_sorted)


@pytest.mark.parametrize("seed", range(5))
def test_argmin_usage_is_argmax_allocation(seed):
  usage = np.random.default_rng(seed).uniform(size=(11,)).astype(np.float32)
  a = np.asarray(allocation(usage))
  assert int(np.argmin(usage)) == int(np.argmax(a))
  assert 0 <= float(a.sum()) <= 1 + 1e-6


def test_allocation_ties_break_stably():
  a = allocation(np.zeros(11, np.float32))
  np.testing.assert_array_equal(a, np.eye(11)[0])


def test_erase_one_at_a_one_hot_location_clears_that_row():
  memory = np.random.default_rng(0).normal(size=(N, W)).astype(np.float32)
  usage = np.ones(N, np.float32)
  usage[3] = 0.0  # full usage except slot 3 -> allocation is one-hot at 3
  state = init()._replace(memory=memory, usage=usage)
  it = _write_only(0)._replace(write_vector=np.zeros((W,), np.float32))
  new, _ = step(state, it)
  np.testing.assert_allclose(new.write_weights, np.eye(N)[3], atol=1e-6)
  np.testing.assert_allclose(new.memory[3], 0.0, atol=1e-6)
  np.testing.assert_allclose(np.delete(np.asarray(new.memory), 3, 0), np.delete(memory, 3, 0), atol=1e-6)


def test_reduces_to_write_once_memory_with_shift_link():
  """Free gates 0, allocation & write gates 1: slot t gets write t; link = sub-diagonal shift."""
  T = N
  state = init()
  values = np.random.default_rng(1).normal(size=(T, W)).astype(np.float32)
  for t in range(T):
    state, _ = step(state, _write_only(0)._replace(write_vector=values[t]))
  np.testing.assert_allclose(state.memory, values, atol=1e-6)
  np.testing.assert_allclose(state.link, np.eye(N, k=-1), atol=1e-6)


def test_forward_mode_reads_the_successor():
  state = init()
  values = np.random.default_rng(2).normal(size=(3, W)).astype(np.float32)
  for t in range(3):
    state, _ = step(state, _write_only(0)._replace(write_vector=values[t]))
  # attend slot 0, then read forward with no write: should get slot 1
  state = state._replace(read_weights=np.tile(np.eye(N, dtype=np.float32)[0], (R, 1)))
  it = _write_only(0)._replace(write_gate=np.float32(0),
                               read_modes=np.tile(np.float32([0.0, 0.0, 1.0]), (R, 1)))
  _, reads = step(state, it)
  np.testing.assert_allclose(reads[0], values[1], atol=1e-5)


def _loss_over_steps(xis, n_words=3, n_reads=2, n_slots=4):
  """Σ_t ⟨c, reads_t⟩ over ``len(xis)`` steps from the empty memory (a scan of ``dnc.step``)."""
  its = jax.vmap(lambda x: dnc.parse_interface(x, n_words, n_reads))(xis)
  _, reads_TRW = jax.lax.scan(dnc.step, dnc.init(n_slots, n_words, n_reads, dtype=xis.dtype), its)
  return jnp.sum(reads_TRW * jnp.arange(1, n_reads * n_words + 1).reshape(1, n_reads, n_words))


@jax.jit
def _loss_fd_and_vjp(xis, u, eps):
  """Central difference of the loss along ``u`` and the gradient's projection on ``u``, one program."""
  fd = (_loss_over_steps(xis + eps * u) - _loss_over_steps(xis - eps * u)) / (2 * eps)
  return fd, jnp.sum(jax.grad(_loss_over_steps)(xis) * u)


def test_gradients_match_finite_differences():
  # check_grads(order=1, modes=("rev",), eps=1e-5, atol=rtol=1e-4) as one jitted float64 program,
  # along two random directions
  with jax.enable_x64(True):
    r = np.random.default_rng(3)
    xis = jnp.asarray(0.5 * r.normal(size=(3, dnc.interface_size(3, 2))))
    for _ in range(2):
      fd, grad_u = _loss_fd_and_vjp(xis, jnp.asarray(r.normal(size=xis.shape)), 1e-5)
      assert abs(float(fd)) > 1e-3
      np.testing.assert_allclose(grad_u, fd, atol=1e-4, rtol=1e-4)


@jax.jit
def _long_run_value_and_grad(xis):
  n_words, n_reads, n_slots = 4, 2, 6

  def loss(xis):
    its = jax.vmap(lambda x: dnc.parse_interface(x, n_words, n_reads))(xis)
    state, reads = dnc.scan(dnc.init(n_slots, n_words, n_reads), its)
    return jnp.sum(reads ** 2) + jnp.sum(state.memory)

  return jax.value_and_grad(loss)(xis)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_no_nan_over_1000_steps_values_and_gradients(scale):
  xis = scale * np.random.default_rng(4).normal(size=(1000, dnc.interface_size(4, 2)))
  value, grad = _long_run_value_and_grad(xis.astype(np.float32))
  assert np.isfinite(float(value))
  assert np.isfinite(np.asarray(grad)).all()


@jax.jit
def _two_steps_grad_of_strength(state, it, strength):
  def loss(strength):
    i = it._replace(read_strengths=jnp.full((R,), strength), write_strength=strength)
    s, _ = dnc.step(state, i)
    _, reads = dnc.step(s, i)
    return jnp.sum(reads)
  return jax.grad(loss)(strength)


def test_extreme_strengths_and_zero_memory_have_finite_gradients():
  it = random_interface(5)
  for strength in (1.0, 1e3, 1e6):
    g = _two_steps_grad_of_strength(init(), it, np.float32(strength))
    assert np.isfinite(float(g)), strength


def test_scan_equals_python_loop_of_steps():
  stacked = _stacked_interfaces(4, 20)
  state_a, reads_a = scan(init(), stacked)
  state_b = init()
  for t in range(4):
    state_b, r = step(state_b, dnc.DNCInterface(*(x[t] for x in stacked)))
    np.testing.assert_allclose(reads_a[t], r, rtol=1e-5, atol=1e-6)
  for a, b in zip(state_a, state_b, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_parse_interface_ranges_and_bad_length():
  it = random_interface(6, scale=10.0)
  dnc.check_interface(it, init())  # in range: no error
  assert float(it.read_strengths.min()) >= 1 and float(it.write_strength) >= 1
  np.testing.assert_allclose(it.read_modes.sum(-1), 1.0, rtol=1e-6)
  with pytest.raises(ValueError, match=r"`xi` must have shape \[\d+\]"):
    dnc.parse_interface(np.zeros(10, np.float32), W, R)


@pytest.mark.parametrize(
    "field,value,match",
    [("read_keys", np.zeros((R, W + 1)), r"interface.read_keys must have shape \[3, 5\]"),
     ("read_strengths", np.full((R,), 0.5), r"read_strengths must be >= 1"),
     ("free_gates", np.full((R,), 1.5), r"free_gates must be in \[0, 1\]"),
     ("read_modes", np.ones((R, 3)), r"read_modes must be on the simplex"),
     ("write_vector", np.full((W,), np.nan), r"write_vector must be finite")],
)
def test_bad_interfaces_raise(field, value, match):
  it = random_interface(7)._replace(**{field: value.astype(np.float32)})
  with pytest.raises(ValueError, match=match):
    dnc.check_interface(it, init())


def test_step_rejects_wrong_shapes_even_under_jit():
  it = random_interface(8)._replace(write_key=np.zeros((W + 2,), np.float32))
  with pytest.raises(ValueError, match="write_key"):
    step(init(), it)
  with pytest.raises(ValueError, match="`memory_size`"):
    dnc.init(0, W, R)


@pytest.mark.parametrize("usage", [
    np.random.default_rng(0).uniform(size=9),
    np.array([0.5, 0.2, 0.5, 0.0, 0.2, 1.0, 0.0]),  # ties and extremes
    np.zeros(5),
])
def test_comparison_allocation_equals_sort_allocation_values_and_gradients(usage):
  u = usage.astype(np.float32)
  a, a_sorted, g1, g2 = allocations_and_gradients(u, np.arange(1.0, u.shape[0] + 1, dtype=np.float32))
  np.testing.assert_allclose(a, a_sorted, atol=1e-7)
  np.testing.assert_allclose(g1, g2, atol=1e-6)


# --- non-finite values: propagated by the allocation, located by check_state / check_interface ---

_USAGE = np.array([0.5, 0.2, 0.7, 0.1, 0.2, 0.9, 0.3], np.float32)  # N = 7 slots, a tie at 0.2


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("slot", [0, 2])  # slots where colliding comparison ranks used to hide the NaN
def test_non_finite_usage_propagates_through_allocation_and_step(bad, slot):
  u = _USAGE.copy()
  u[slot] = bad
  a = np.asarray(allocation(u))
  assert np.isnan(a).all(), a
  # the argsort form is non-finite too (NaN / -inf at the bad slot only): neither is silently finite
  assert not np.isfinite(np.asarray(allocation_sorted(u))).all()
  state = init()._replace(usage=u)
  new, _ = step(state, random_interface(30))
  assert not np.isfinite(np.asarray(new.write_weights)).any(), new.write_weights


def test_finiteness_guard_keeps_values_and_gradients_of_finite_usage():
  """Finite usage: the guard is an identity in value and gradient (no NaN from the unused branch)."""
  a, a_sorted, g, g_sorted = allocations_and_gradients(_USAGE, np.arange(1.0, N + 1, dtype=np.float32))
  assert np.isfinite(np.asarray(g)).all()
  np.testing.assert_allclose(g, g_sorted, atol=1e-6)
  np.testing.assert_allclose(a, a_sorted, atol=1e-7)


def _some_state():
  state = init()
  for t in range(2):
    state, _ = step(state, random_interface(40 + t))
  return dnc.DNCState(*(np.asarray(x) for x in state))


@pytest.mark.parametrize("field", dnc.DNCState._fields)
def test_check_state_names_the_field_and_index_of_a_nan(field):
  state = _some_state()
  dnc.check_state(state)  # finite: no error
  x = getattr(state, field).copy()
  idx = tuple(s - 2 for s in x.shape)
  x[idx] = np.nan
  x[tuple(s - 1 for s in x.shape)] = np.inf
  match = rf"state\.{field} has a non-finite value at index {re.escape(str(idx))}"  # the first (row-major) one
  with pytest.raises(ValueError, match=match):
    dnc.check_state(state._replace(**{field: x}))


@pytest.mark.parametrize("field,shape", [
    ("memory", (N, W, 1)), ("usage", (N + 1,)), ("link", (N, N - 1)), ("precedence", (N, 1)),
    ("read_weights", (N,)), ("write_weights", (N - 1,)),
])
def test_check_state_wrong_shape_names_the_field_even_under_jit(field, shape):
  bad = _some_state()._replace(**{field: np.zeros(shape, np.float32)})
  with pytest.raises(ValueError, match=rf"state\.{field} must have shape"):
    dnc.check_state(bad)
  with pytest.raises(ValueError, match=rf"state\.{field} must have shape"):
    step(bad, random_interface(31))


_usage_after_traced_check = jax.jit(lambda s: (dnc.check_state(s), s.usage)[1])


def test_check_state_skips_values_of_traced_states():
  bad = _some_state()._replace(usage=np.full((N,), np.nan, np.float32))
  out = _usage_after_traced_check(bad)  # traced: no value check, no error
  assert np.isnan(np.asarray(out)).all()


def test_check_interface_reports_nan_strength_as_non_finite_with_its_index():
  it = random_interface(32)._replace(read_strengths=np.float32([2.0, np.nan, 3.0]))
  with pytest.raises(ValueError, match=r"interface\.read_strengths must be finite.*index \(1,\)") as err:
    dnc.check_interface(it, init())
  assert ">= 1" not in str(err.value)


# --- dtypes: low-precision state, float32 arithmetic ---

# A bfloat16 state vs the float32 computation from the same (rounded) start: abs and rel tolerance over a
# few steps, while usages stay apart. Usages closer than bf16's spacing (2^-8 near 1) tie when stored in
# bf16, and the allocation may then pick another slot than float32 would (a discrete jump no tolerance
# covers; e.g. from dnc.init's zero memory, where uniform content weights make near-equal usages).
BF16_TOL = 2e-2


def _spread_state(seed, dtype):
  """Random memory and read weights, usages spread over [0.1, 0.9]: values rounded to ``dtype``."""
  r = np.random.default_rng(seed)
  z = r.normal(size=(R, N))
  state = init()._replace(
      memory=r.normal(size=(N, W)), usage=r.permutation(np.linspace(0.1, 0.9, N)),
      read_weights=np.exp(z) / np.exp(z).sum(-1, keepdims=True))
  return dnc.DNCState(*(np.asarray(x).astype(dtype) for x in state))


def _as_float32(state):
  return dnc.DNCState(*(np.asarray(x, np.float32) for x in state))


def test_float32_step_is_bitwise_unchanged():
  # bitwise by construction: for float32 inputs the kernel's casts are no-ops and it runs the same
  # operations in the same order as the composition of the helpers
  its = _stacked_interfaces(6, 50)
  state_a, reads_a = _scan(init(), its)
  state_b, reads_b = _scan_reference(init(), its)
  names = dnc.DNCState._fields + ("reads",)
  for name, a, b in zip(names, (*state_a, reads_a), (*state_b, reads_b), strict=True):
    assert a.dtype == jnp.float32, name
    np.testing.assert_array_equal(a, b, err_msg=name)


def test_bf16_state_scan_keeps_carry_dtypes_and_stays_close_to_float32():
  its = _stacked_interfaces(4, 60)  # a float32 controller driving a bfloat16 memory
  state16 = _spread_state(1, jnp.bfloat16)
  out16 = _scan(state16, its)  # lax.scan raises if a carry dtype changes
  out32 = _scan(_as_float32(state16), its)
  for name, a, b in zip(dnc.DNCState._fields + ("reads",), jax.tree.leaves(out16), jax.tree.leaves(out32),
                        strict=True):
    assert a.dtype == jnp.bfloat16, name
    np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=BF16_TOL, rtol=BF16_TOL, err_msg=name)


def test_bf16_state_is_closer_to_float32_than_pure_bf16_arithmetic():
  """Same bf16 inputs; only the arithmetic differs: the kernel's float32 vs the helpers run in bfloat16."""
  its = _stacked_interfaces(4, 70, jnp.bfloat16)
  state16 = _spread_state(2, jnp.bfloat16)
  ref = _scan(_as_float32(state16), its)
  got = _scan(state16, its)
  pure = _scan_reference(state16, its)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(pure))  # the baseline really is pure bf16

  def err(out):  # summed over the state fields and the reads: mean absolute error vs float32
    return sum(float(np.mean(np.abs(np.asarray(a, np.float32) - np.asarray(b))))
               for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True))

  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=BF16_TOL, rtol=BF16_TOL)
  assert err(got) < 0.75 * err(pure), (err(got), err(pure))
