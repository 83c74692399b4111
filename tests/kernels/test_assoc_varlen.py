"""associative_memory with ``cu_seqlens`` and a state per sequence (``jaxmem/kernels/assoc/varlen.py``) against
each sequence run alone.

One packed row, ``T = 67`` tokens in ``CU``'s four sequences (lengths 1, 0, 30, 36: a one-token and an empty
sequence, two over several chunks) with ``H = 3``, ``D_k = 12``, ``D_v = 5``; the layout's chunk is 4 there
(:func:`sequence_chunk`), so two sequences end in a padded chunk. Every rule, in the chunked and recurrent forms
(each one compiled program of values and the pullback of a random cotangent), and ``auto``: outputs and final
states against the float64 numpy loop of ``test_assoc.py`` run on each sequence alone from its own initial
state, gradients w.r.t. every input and the initial states against separate recurrent runs of each sequence
(no ``cu_seqlens``). The index arithmetic of the layout is checked on its own.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.assoc import associative_memory
from jaxmem.kernels.assoc.varlen import chunk_layout, sequence_chunk
from tests.kernels.test_assoc import DECAYS, RULES, assert_grads_close, make_inputs, numpy_assoc

CU = np.array([0, 1, 1, 31, 67], np.int32)
N, T, H, DK, DV = len(CU) - 1, 67, 3, 12, 5
CHUNK = 16


@functools.cache
def inputs():
  """``(q, k, v, beta, decay [1, T, ...], S_0 [N, H, D_v, D_k])`` in the stable regime of ``make_inputs``."""
  q, k, v, beta, decay, _ = make_inputs(1, T, H, DK, DV, seed=7)
  S0 = jnp.asarray(0.3 * np.random.default_rng(8).normal(size=(N, H, DV, DK)), jnp.float32)
  return q, k, v, beta, decay, S0


@functools.cache
def cotangents():
  r = np.random.default_rng(9)
  return (jnp.asarray(r.normal(size=(1, T, H, DV)), jnp.float32),
          jnp.asarray(r.normal(size=(N, H, DV, DK)), jnp.float32))


def call(rule, mode, q, k, v, beta, decay, S0, cu=CU):
  return associative_memory(q, k, v, beta, rule=rule, mode=mode, chunk_size=CHUNK,
                            decay=decay if rule in DECAYS else None, initial_state=S0, return_state=True,
                            cu_seqlens=cu)


def each_alone(run_one, q, k, v, beta, decay, S0):
  """``(o [1, T, ...], finals [N, ...])`` from ``run_one(q, k, v, beta, decay, S_0) -> (o, S)`` on each sequence
  of ``CU`` (``[1, len, ...]`` slices, ``S_0 [1, ...]``); an empty sequence keeps its initial state."""
  outs, finals = [], []
  for n in range(N):
    s = slice(CU[n], CU[n + 1])
    if CU[n] == CU[n + 1]:
      finals.append(S0[n])
      continue
    o, S = run_one(q[:, s], k[:, s], v[:, s], beta[:, s], decay[:, s], S0[n:n + 1])
    outs.append(o)
    finals.append(S[0])
  cat = np.concatenate if isinstance(outs[0], np.ndarray) else jnp.concatenate
  return cat(outs, axis=1), (np.stack if cat is np.concatenate else jnp.stack)(finals)


@functools.cache
def packed(rule, mode):
  """One jitted program (``cu_seqlens`` traced): ``(o, finals, pullback of cotangents())``."""
  def run(cot_o, cot_S, cu, *xs):
    (o, S), pullback = jax.vjp(lambda *xs: call(rule, mode, *xs, cu=cu), *xs)
    return o, S, pullback((cot_o, cot_S))
  return jax.jit(run)


@functools.cache
def alone(rule):
  """The same from separate recurrent runs of each sequence (no ``cu_seqlens``), one jitted program."""
  def run(cot_o, cot_S, *xs):
    one = lambda q, k, v, b, d, S: associative_memory(q, k, v, b, rule=rule, mode="recurrent",
                                                      decay=d if rule in DECAYS else None, initial_state=S,
                                                      return_state=True)
    (o, S), pullback = jax.vjp(lambda *xs: each_alone(one, *xs), *xs)
    return o, S, pullback((cot_o, cot_S))
  return jax.jit(run)


layout = jax.jit(chunk_layout, static_argnums=(1, 2))


def test_the_layout_puts_every_token_once_and_no_chunk_holds_two_sequences():
  assert sequence_chunk(T, N, CHUNK) == 4  # the chunk the tests below run with
  assert (sequence_chunk(4096, 64, 64), sequence_chunk(4096, 16, 64), sequence_chunk(8, 8, 64)) == (16, 64, 1)
  layouts = ((CU, 4), (CU, 1), (CU, 67), (np.array([0, 5], np.int32), 8), (np.array([0, 0, 3, 3], np.int32), 2))
  for cu, C in layouts:
    Tc, Nc = int(cu[-1]), len(cu) - 1
    src, valid, load, store, pos = (np.asarray(a) for a in layout(jnp.asarray(cu), Tc, C))
    n_chunks = (Tc + Nc * (C - 1)) // C
    assert src.shape == valid.shape == (n_chunks * C,) and load.shape == store.shape == (n_chunks,)
    np.testing.assert_array_equal(src[pos], np.arange(Tc))  # token t sits at slot pos[t] ...
    assert valid[pos].all() and valid.sum() == Tc  # ... and nowhere else
    seq_of_token = np.repeat(np.arange(Nc), np.diff(cu))
    for n in range(Nc):
      slots = pos[cu[n]:cu[n + 1]]
      if len(slots) == 0:
        assert n not in load and n not in store
        continue
      np.testing.assert_array_equal(slots, slots[0] + np.arange(len(slots)))  # in order, contiguous
      assert slots[0] % C == 0 and load[slots[0] // C] == n  # starts a chunk, which loads its state
      assert store[slots[-1] // C] == n and list(store).count(n) == 1  # ends in its last chunk
      chunks = np.unique(slots // C)
      assert all(set(seq_of_token[src[j * C:(j + 1) * C][valid[j * C:(j + 1) * C]]]) == {n} for j in chunks)
    for idx in (load, store):  # each sequence once, in order; N elsewhere
      assert (np.diff(idx[idx < Nc]) > 0).all() and set(idx[idx >= Nc]) <= {Nc}


@pytest.mark.parametrize("rule", RULES)
def test_a_state_per_sequence_equals_each_sequence_alone(rule):
  q, k, v, beta, decay, S0 = inputs()
  numpy_one = lambda q, k, v, b, d, S: numpy_assoc(q, k, v, b, d if rule in DECAYS else None, S, rule)
  ref_o, ref_S = each_alone(numpy_one, *(np.asarray(x, np.float64) for x in (q, k, v, beta, decay, S0)))
  want = alone(rule)(*cotangents(), q, k, v, beta, decay, S0)
  # float32 over at most 36 unit-norm writes: values of order 1, rounding ~1e-6 per token
  np.testing.assert_allclose(want[0], ref_o, rtol=1e-4, atol=2e-5)
  for mode in ("chunked", "recurrent"):
    o, S, grads = packed(rule, mode)(*cotangents(), jnp.asarray(CU), q, k, v, beta, decay, S0)
    assert o.shape == (1, T, H, DV) and S.shape == (N, H, DV, DK)
    np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5, err_msg=f"{rule} {mode} o")
    np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5, err_msg=f"{rule} {mode} final states")
    assert_grads_close(grads, want[2], rule, f"{rule} {mode} packed")
  o, S = call(rule, "auto", q, k, v, beta, decay, S0, cu=list(CU))  # concrete, a list: forward only
  np.testing.assert_allclose(o, ref_o, rtol=1e-4, atol=2e-5, err_msg=f"{rule} auto o")
  np.testing.assert_allclose(S, ref_S, rtol=1e-4, atol=2e-5, err_msg=f"{rule} auto final states")


def test_auto_differentiates_through_the_chunked_form():
  q, k, v, beta, decay, S0 = inputs()
  def loss(mode):
    return lambda *xs: sum(jnp.vdot(c, x) for c, x in zip(cotangents(), call("gated_delta", mode, *xs),
                                                          strict=True))
  got = jax.grad(loss("auto"), argnums=tuple(range(6)))(q, k, v, beta, decay, S0)
  want = packed("gated_delta", "chunked")(*cotangents(), jnp.asarray(CU), q, k, v, beta, decay, S0)[2]
  assert_grads_close(got, want, "gated_delta", "auto")


@pytest.mark.parametrize("change,match", [
    (dict(cu_seqlens=[0, 5, 60]), r"`cu_seqlens` must rise from 0 to T = 67"),
    (dict(cu_seqlens=[0.0, 67.0]), r"`cu_seqlens` must hold integers"),
    (dict(cu_seqlens=[[0, 67]]), r"`cu_seqlens` must have shape \[N \+ 1\]"),
    (dict(cu_seqlens=[0, [1, 2], 67]), r"`cu_seqlens` must be a flat list of integers"),
    (dict(cu_seqlens=CU, mode="parallel"), r"not 'parallel'"),
    (dict(cu_seqlens=CU, segment_ids=np.ones((1, T), np.int32)), r"pass `cu_seqlens` .* or `segment_ids`"),
    (dict(cu_seqlens=CU, initial_state=np.zeros((N + 1, H, DV, DK), np.float32)),
     r"`initial_state` must have shape \[N, H, D_v, D_k\] = \(4, 3, 5, 12\)"),
])
def test_bad_cu_seqlens_raise_value_error_naming_it(change, match):
  q, k, v, beta, decay, S0 = inputs()
  kw = {**dict(rule="delta", initial_state=S0, return_state=True), **change}
  with pytest.raises(ValueError, match=match):
    associative_memory(q, k, v, beta, **kw)
