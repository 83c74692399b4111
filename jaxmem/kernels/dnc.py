"""The Differentiable Neural Computer's memory access (Graves et al. 2016, Nature, Methods).

Pure functions on one example; vmap over a batch. Shapes: memory ``[N, W]`` (N slots of
width W), ``R`` read heads. Step order (one call of :func:`step`)::

    usage -> write weights -> erase-then-add write -> link, precedence -> read weights -> reads

Equations (Nature 2016, Methods, "Memory addressing"), pinned here because public
implementations disagree on them:

* content:  ``C(M, k, β)[n] = softmax_n(β · cos(k, M[n]))``; norms are
  ``sqrt(Σx² + ε)`` so that zero memory has finite values *and* gradients.
* retention ``ψ = Π_i (1 − f_i w^r_{i,t−1})``; usage
  ``u_t = (u_{t−1} + w^w_{t−1} − u_{t−1} ∘ w^w_{t−1}) ∘ ψ`` (no stop-gradient).
* allocation: ``φ`` = slots by ascending usage (stable sort),
  ``a[φ_j] = (1 − u[φ_j]) Π_{i<j} u[φ_i]`` (exclusive cumulative product).
* write weights ``w^w = g^w (g^a a + (1 − g^a) C(M_{t−1}, k^w, β^w))``.
* write ``M_t = M_{t−1} ∘ (1 − w^w eᵀ) + w^w vᵀ``.
* link ``L_t[i, j] = (1 − w^w[i] − w^w[j]) L_{t−1}[i, j] + w^w[i] p_{t−1}[j]``, diagonal 0;
  precedence ``p_t = (1 − Σ w^w) p_{t−1} + w^w``.
* forward ``f_i = L_t w^r_{i,t−1}`` (the slot written *after* the one read), backward
  ``b_i = L_tᵀ w^r_{i,t−1}``; read weights ``w^r_i = π_i[0] b_i + π_i[1] C(M_t, k^r_i, β^r_i)
  + π_i[2] f_i`` — read modes in the order **backward, content, forward**.
* read vectors ``r_i = M_tᵀ w^r_i``.

Interface values must already be in range (strengths ≥ 1, gates and erase in [0, 1],
modes on the simplex): :func:`parse_interface` maps a raw controller vector there with the
paper's oneplus / sigmoid / softmax, and :func:`check_interface` validates a hand-built one.
:func:`check_state` validates a :class:`DNCState` (shapes of the fields against each other,
and that every value is finite, naming the field and the first bad index) to find where a
NaN came from. Both check shapes always and values only for concrete arrays: under ``jit``
(traced values) the value checks are skipped. A non-finite usage makes every allocation
weight NaN (the sort order is undefined), so it propagates instead of hiding.

dtypes: :func:`step` computes in ``promote_types(dtype, float32)`` of all its inputs
(bfloat16 / float16 -> float32, float64 stays float64) and returns each state field in its
own dtype (a ``lax.scan`` carry keeps its type) and the reads in the memory's dtype; so a
bfloat16 state only rounds what it stores, and float32 is computed exactly as before. A
bfloat16 usage ties slots whose usages differ by less than its spacing (2^-8 near 1), and the
allocation may then pick another slot than float32 would; fields may differ in dtype, so keep
``usage`` float32 where that matters.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.checks import check_positive_int, is_concrete

EPS = 1e-6


class DNCState(NamedTuple):
  memory: jax.Array         # [N, W]
  usage: jax.Array          # [N]
  link: jax.Array           # [N, N]
  precedence: jax.Array     # [N]
  read_weights: jax.Array   # [R, N]
  write_weights: jax.Array  # [N]


class DNCInterface(NamedTuple):
  read_keys: jax.Array        # [R, W]
  read_strengths: jax.Array   # [R], >= 1
  write_key: jax.Array        # [W]
  write_strength: jax.Array   # [], >= 1
  erase_vector: jax.Array     # [W], in [0, 1]
  write_vector: jax.Array     # [W]
  free_gates: jax.Array       # [R], in [0, 1]
  allocation_gate: jax.Array  # [], in [0, 1]
  write_gate: jax.Array       # [], in [0, 1]
  read_modes: jax.Array       # [R, 3], simplex: (backward, content, forward)


def init(memory_size: int, word_size: int, num_reads: int, dtype=jnp.float32) -> DNCState:
  """All-zero memory, usage, link, precedence and weights: the first ``state`` of :func:`step`."""
  N = check_positive_int("memory_size", memory_size)
  W = check_positive_int("word_size", word_size)
  R = check_positive_int("num_reads", num_reads)
  z = lambda *s: jnp.zeros(s, dtype)
  return DNCState(z(N, W), z(N), z(N, N), z(N), z(R, N), z(N))


def interface_size(word_size: int, num_reads: int) -> int:
  """Length of the flat controller vector: ``R·W + 3W + 5R + 3``."""
  return num_reads * word_size + 3 * word_size + 5 * num_reads + 3


def oneplus(x):
  return 1.0 + jax.nn.softplus(x)


def parse_interface(xi: jax.Array, word_size: int, num_reads: int) -> DNCInterface:
  """Splits a flat ``[interface_size]`` vector and applies oneplus / sigmoid / softmax."""
  W, R = check_positive_int("word_size", word_size), check_positive_int("num_reads", num_reads)
  size = interface_size(W, R)
  if jnp.ndim(xi) != 1 or xi.shape[0] != size:
    raise ValueError(
        f"`xi` must have shape [{size}] (R·W + 3W + 5R + 3 for W={W}, R={R}), got {jnp.shape(xi)}."
    )
  sizes = [R * W, R, W, 1, W, W, R, 1, 1, 3 * R]
  parts = jnp.split(xi, np.cumsum(sizes)[:-1])
  rk, rs, wk, ws, e, v, f, ga, gw, pi = parts
  return DNCInterface(
      read_keys=rk.reshape(R, W), read_strengths=oneplus(rs), write_key=wk,
      write_strength=oneplus(ws[0]), erase_vector=jax.nn.sigmoid(e), write_vector=v,
      free_gates=jax.nn.sigmoid(f), allocation_gate=jax.nn.sigmoid(ga[0]),
      write_gate=jax.nn.sigmoid(gw[0]), read_modes=jax.nn.softmax(pi.reshape(R, 3), axis=-1),
  )


def _first_non_finite(x):
  """Index (a tuple) of the first non-finite entry of a concrete array, or None."""
  bad = ~np.isfinite(np.asarray(x, np.float64))
  return tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else None


def _is_traced(xs):
  return not all(is_concrete(x) for x in xs)


def _check_fields(prefix, fields, want, sizes, check_values, non_finite) -> bool:
  """Shapes of a NamedTuple's fields against ``want``; then, for concrete values, finiteness.

  Returns whether the values were checked (False under ``jit`` or with ``check_values=False``).
  """
  for name, shape, x in zip(type(want)._fields, want, fields, strict=True):
    if tuple(jnp.shape(x)) != shape:
      raise ValueError(f"{prefix}.{name} must have shape {list(shape)} ({sizes}), got {list(jnp.shape(x))}.")
  if not check_values or _is_traced(fields):
    return False
  for name, x in zip(type(want)._fields, fields, strict=True):
    idx = _first_non_finite(x)
    if idx is not None:
      raise ValueError(f"{prefix}.{name} {non_finite} at index {idx}.")
  return True


def check_interface(interface: DNCInterface, state: DNCState, *, check_values: bool = True) -> None:
  """ValueError on wrong shapes; with concrete (non-traced) arrays, also on non-finite (first,
  naming the field and index) or out-of-range values. Under ``jit`` the value checks are skipped."""
  N, W = state.memory.shape
  R = state.read_weights.shape[0]
  want = DNCInterface((R, W), (R,), (W,), (), (W,), (W,), (R,), (), (), (R, 3))
  if not _check_fields("interface", interface, want, f"N={N}, W={W}, R={R}", check_values,
                       "must be finite, got a non-finite value"):
    return
  def bad(name, cond, what):
    if not bool(np.all(np.asarray(cond))):
      raise ValueError(f"interface.{name} must be {what}; map raw controller outputs with "
                       f"parse_interface().")
  bad("read_strengths", interface.read_strengths >= 1, ">= 1")
  bad("write_strength", interface.write_strength >= 1, ">= 1")
  for name in ("erase_vector", "free_gates", "allocation_gate", "write_gate"):
    x = getattr(interface, name)
    bad(name, (x >= 0) & (x <= 1), "in [0, 1]")
  m = interface.read_modes
  on_simplex = (m >= 0) & (jnp.abs(m.sum(-1) - 1) < 1e-4)[..., None]
  bad("read_modes", on_simplex, "on the simplex (rows >= 0 summing to 1)")


def check_state(state: DNCState, *, check_values: bool = True) -> None:
  """ValueError unless the fields' shapes agree: memory ``[N, W]``, usage ``[N]``, link
  ``[N, N]``, precedence ``[N]``, read_weights ``[R, N]``, write_weights ``[N]``; with concrete
  (non-traced) arrays and ``check_values``, also unless every value is finite, naming the field
  and the first bad index. Under ``jit`` (traced values) only the shapes are checked."""
  shape = lambda x: tuple(jnp.shape(x))
  if len(shape(state.memory)) != 2:
    raise ValueError(f"state.memory must have shape [N, W], got {list(shape(state.memory))}.")
  N, W = shape(state.memory)
  rw = shape(state.read_weights)
  if len(rw) != 2 or rw[1] != N:
    raise ValueError(f"state.read_weights must have shape [R, N] with N={N} (memory [N, W]={[N, W]}), "
                     f"got {list(rw)}.")
  R = rw[0]
  want = DNCState((N, W), (N,), (N, N), (N,), (R, N), (N,))
  _check_fields("state", state, want, f"N={N}, W={W}, R={R}", check_values, "has a non-finite value")


def content_weights(memory_NW, keys_KW, strengths_K):
  """``softmax_n(β_k cos(key_k, M[n]))`` for K keys at once -> ``[K, N]``."""
  dot = keys_KW @ memory_NW.T
  m_norm = jnp.sqrt(jnp.sum(memory_NW * memory_NW, axis=-1) + EPS)
  k_norm = jnp.sqrt(jnp.sum(keys_KW * keys_KW, axis=-1) + EPS)
  cos = dot / (k_norm[:, None] * m_norm[None, :])
  return jax.nn.softmax(strengths_K[:, None] * cos, axis=-1)


def update_usage(usage_N, write_weights_N, free_gates_R, read_weights_RN):
  """``u_t = (u + w^w − u∘w^w) ∘ Π_i (1 − f_i w^r_i)``, all from step t−1."""
  retention = jnp.prod(1.0 - free_gates_R[:, None] * read_weights_RN, axis=0)
  return (usage_N + write_weights_N - usage_N * write_weights_N) * retention


def allocation_weights(usage_N):
  """``a[φ_j] = (1 − u[φ_j]) Π_{i<j} u[φ_i]``, φ the stable ascending sort of usage.

  The stable order is computed without a sort: slot i precedes slot j iff ``u_i < u_j``
  or (``u_i == u_j`` and ``i < j``), so ``rank_j = #{i : i precedes j}`` from an
  ``[N, N]`` comparison, and ``φ`` is its inverse. Then the exclusive cumulative product
  runs in sorted order and is gathered back by rank. Same values and gradients as
  :func:`allocation_weights_sorted` for finite usage (tested equal); XLA's sort otherwise
  dominates the DNC step on CPU. A non-finite usage (NaN, ±inf) has no order (comparisons
  with NaN are all false, so ranks would collide and the result could look finite): every
  entry is then NaN. The guard selects between finite values and a constant, so it changes
  neither values nor gradients of finite usage.
  """
  u = usage_N
  n = u.shape[0]
  idx = jnp.arange(n)
  u_ng = jax.lax.stop_gradient(u)  # the order is piecewise constant: no gradient through it
  ties_IJ = (u_ng[:, None] == u_ng[None, :]) & (idx[:, None] < idx[None, :])
  before_IJ = (u_ng[:, None] < u_ng[None, :]) | ties_IJ
  rank = jnp.sum(before_IJ, axis=0)
  phi = jnp.zeros((n,), idx.dtype).at[rank].set(idx)
  u_sorted = u[phi]
  exclusive = jnp.concatenate([jnp.ones((1,), u.dtype), jnp.cumprod(u_sorted)[:-1]])
  alloc = ((1.0 - u_sorted) * exclusive)[rank]
  return jnp.where(jnp.all(jnp.isfinite(u_ng)), alloc, jnp.nan)


def allocation_weights_sorted(usage_N):
  """The literal form: stable argsort, exclusive cumulative product, scatter back."""
  phi = jnp.argsort(usage_N, stable=True)
  u_sorted = usage_N[phi]
  exclusive = jnp.concatenate([jnp.ones((1,), usage_N.dtype), jnp.cumprod(u_sorted)[:-1]])
  return jnp.zeros_like(usage_N).at[phi].set((1.0 - u_sorted) * exclusive)


def update_link(link_NN, precedence_N, write_weights_N):
  """Temporal link and precedence; ``L[i, j]``: slot i was written right after slot j."""
  w = write_weights_N
  link = (1.0 - w[:, None] - w[None, :]) * link_NN + w[:, None] * precedence_N[None, :]
  link = link * (1.0 - jnp.eye(link.shape[0], dtype=link.dtype))
  precedence = (1.0 - jnp.sum(w)) * precedence_N + w
  return link, precedence


def _out_dtype(x, compute_dtype):
  """A field's own (canonical) dtype; a non-float field (nonsense, but accepted) keeps the compute dtype."""
  dtype = jnp.result_type(x)
  return dtype if jnp.issubdtype(dtype, jnp.inexact) else compute_dtype


def step(state: DNCState, interface: DNCInterface) -> tuple[DNCState, jax.Array]:
  """One DNC memory step for one example: ``(state, interface) -> (state, reads [R, W])``.

  Computes in ``promote_types(dtype, float32)`` over every state field and interface value
  (usage, the allocation's cumulative product, the softmaxes, the link update), then returns
  each state field in its own dtype and the reads in the memory's dtype.
  """
  check_state(state, check_values=False)
  check_interface(interface, state, check_values=False)
  dtype = functools.reduce(jnp.promote_types, (jnp.result_type(x) for x in (*state, *interface)),
                           jnp.dtype(jnp.float32))
  s = DNCState(*(jnp.asarray(x, dtype) for x in state))
  it = DNCInterface(*(jnp.asarray(x, dtype) for x in interface))
  usage = update_usage(s.usage, s.write_weights, it.free_gates, s.read_weights)
  write_content = content_weights(s.memory, it.write_key[None], it.write_strength[None])[0]
  alloc = allocation_weights(usage)
  ww = it.write_gate * (it.allocation_gate * alloc + (1.0 - it.allocation_gate) * write_content)
  memory = s.memory * (1.0 - jnp.outer(ww, it.erase_vector)) + jnp.outer(ww, it.write_vector)
  link, precedence = update_link(s.link, s.precedence, ww)
  forward = s.read_weights @ link.T     # f_i = L w_i
  backward = s.read_weights @ link      # b_i = Lᵀ w_i
  content = content_weights(memory, it.read_keys, it.read_strengths)
  m = it.read_modes
  rw = m[:, 0:1] * backward + m[:, 1:2] * content + m[:, 2:3] * forward
  reads = rw @ memory
  new = DNCState(memory, usage, link, precedence, rw, ww)
  new = DNCState(*(x.astype(_out_dtype(old, dtype)) for x, old in zip(new, state, strict=True)))
  return new, reads.astype(_out_dtype(state.memory, dtype))


def scan(state: DNCState, interfaces: DNCInterface, *, remat: bool = True):
  """:func:`step` over a leading time axis of ``interfaces`` with ``lax.scan``.

  With ``remat=True`` each step is wrapped in ``jax.checkpoint``: the reverse pass keeps
  only the carried state per step (the ``[N, N]`` link among it) and recomputes the
  step's intermediates (content weights, sorted usage, outer products) instead of storing
  them.

  Returns ``(final state, reads [T, R, W])``.
  """
  check_interface(jax.tree.map(lambda x: x[0], interfaces), state, check_values=False)
  body = jax.checkpoint(step) if remat else step
  return jax.lax.scan(body, state, interfaces)

