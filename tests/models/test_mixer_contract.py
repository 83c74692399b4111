"""The mixer contract (jaxmem.models.mixers.registry.Mixer), checked for every registered name: a new memory
that passes this file is laid out on a mesh, weight-decayed, sized and decoded with no other edit.

Per mixer and each config of its ``examples()`` (which between them build every parameter; tiny sizes,
float32): built by name; ``[B, T, d] -> [B, T, d]`` in the input's dtype; causal (one Jacobian: output
``(b, t)`` never depends on input ``(c, s)`` with ``c ≠ b`` or ``s > t``); one compiled program for every
instance of the config; every parameter carries logical axes; its state size is a positive int, equal to what
``init_state`` holds; where the mixer decodes, ``step`` token by token equals the sequence call; and, for a
``QKVMixer``, its ``kernel`` on one batch row and head alone equals that row and head of the full read (what
running it per device under ``map_heads`` needs)."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem import sharding
from jaxmem.models import mixers
from jaxmem.models.mixers import Mixer
from tests.models.jitted import decode

D, H, B, T = 12, 2, 2, 7
CASES = [(name, i) for name in mixers.names() for i in range(len(mixers.lookup(name)[0].examples()))]


def _build(cfg, seed=0):
  return mixers.build(cfg, d_model=D, n_heads=H, n_layers=2, dtype="float32", rngs=nnx.Rngs(seed))


def _forward_and_jacobian(mixer, x_BTD, w_D):
  """``y`` and ``J[b, t, c, s] = Σ_e |∂ (y[b, t] · w) / ∂ x[c, s, e]|``, from one program."""
  graphdef, state = nnx.split(mixer)
  f = lambda x: nnx.merge(graphdef, state, copy=True)(x)
  y = f(x_BTD)
  J = jnp.abs(jax.jacrev(lambda x: f(x) @ w_D)(x_BTD)).sum(-1)
  return y, J


def _inputs(seed):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return jax.random.normal(k1, (B, T, D)), jax.random.normal(k2, (D,))


@pytest.mark.parametrize("name, example", CASES)
def test_mixer_contract(name, example):
  config_cls, module_cls = mixers.lookup(name)
  cfg = config_cls.examples()[example]
  assert cfg.name == name and mixers.MixerConfig.from_dict(cfg.to_dict()) == cfg
  assert issubclass(module_cls, Mixer), f"{name}: subclass jaxmem.models.mixers.Mixer"
  mixer = _build(cfg)

  # every parameter annotated (layout and weight decay derive from the annotations)
  params = nnx.state(mixer, nnx.Param)
  assert jax.tree.leaves(params), name
  assert sharding.unannotated(params) == [], f"{name}: parameters without logical axes"

  # shapes, dtype, causality: one program (chex: traced at most once), then the same program for another
  # instance of the config and other inputs
  chex.clear_trace_counter()   # chex counts per function across the parametrized cases
  forward_and_jacobian = nnx.jit(chex.assert_max_traces(_forward_and_jacobian, n=1))
  x, w = _inputs(0)
  y, J = forward_and_jacobian(mixer, x, w)
  assert y.shape == (B, T, D) and y.dtype == jnp.float32, (name, y.shape, y.dtype)
  assert np.isfinite(np.asarray(y)).all(), name
  J = np.asarray(J)
  allowed = np.eye(B, dtype=bool)[:, None, :, None] & np.tril(np.ones((T, T), bool))[None, :, None, :]
  leaks = np.argwhere((J != 0.0) & ~allowed)
  assert leaks.size == 0, f"{name}: output (b, t) depends on input (c, s) at {leaks[:5].tolist()}"
  # and it can see: every output after the first depends on some input (hard and top-K reads depend on the ones
  # they select; a memory of strictly earlier tokens reads nothing at t = 0)
  assert (J.sum((2, 3))[:, 1:] > 0).all(), f"{name}: an output depends on no input (the check would be blind)"
  x2, w2 = _inputs(1)
  forward_and_jacobian(_build(cfg, seed=1), x2, w2)   # a second trace raises chex's AssertionError

  # state size: a positive int; grows with T only for memories that keep every token
  size = lambda t: cfg.state_floats(d_model=D, n_heads=H, seq_len=t)
  assert isinstance(size(T), int) and size(T) > 0, (name, size(T))
  assert size(2 * T) >= size(T), name

  if module_cls.decodes():
    state = mixer.init_state(1, T)
    # floats: a KV cache's integer lengths are bookkeeping, not memory
    floats = [leaf for leaf in jax.tree.leaves(state) if jnp.issubdtype(leaf.dtype, jnp.floating)]
    assert sum(np.size(leaf) for leaf in floats) == size(T), name
    ys, final = decode(mixer, x)
    # two float32 evaluation orders of the same recurrence: rounding relative to the output's scale
    tol = dict(rtol=1e-4, atol=1e-5 * float(np.abs(y).max()), err_msg=name)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(y), **tol)
    if module_cls.scans():   # the sequence form from a state: a prefix, then the rest from its state
      split = _scan_split(mixer, x)
      np.testing.assert_allclose(np.asarray(split[1]), np.asarray(y), **tol)
      for a, b in zip(jax.tree.leaves(split[0]), jax.tree.leaves(final), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4,
                                   atol=1e-5 * float(np.abs(np.asarray(b)).max()), err_msg=name)
  else:
    assert not module_cls.scans(), f"{name}: scan without init_state / step"


@nnx.jit
def _scan_split(mixer, x_BTD):
  """``scan`` over the first 3 tokens from ``init_state``, then over the rest from the state it returned:
  ``(final state, y)``."""
  state, y1 = mixer.scan(mixer.init_state(x_BTD.shape[0], x_BTD.shape[1]), x_BTD[:, :3])
  state, y2 = mixer.scan(state, x_BTD[:, 3:])
  return state, jnp.concatenate([y1, y2], axis=1)


QKV_CASES = [(n, i) for n, i in CASES if issubclass(mixers.lookup(n)[1], mixers.QKVMixer)]


@pytest.mark.parametrize("name, example", QKV_CASES)
def test_qkv_kernel_computes_each_head_and_batch_row_alone(name, example):
  """A QKVMixer's ``kernel`` runs on one device's block of batch rows and heads under a mesh (the base class's
  map_heads): on the last batch row and head alone it gives that row and head of the full read, and its
  ``gates`` are per token and head."""
  mixer = _build(mixers.lookup(name)[0].examples()[example])
  x, _ = _inputs(0)
  q, k, v = mixer.heads(x)
  gates = mixer.gates(x)
  for g, a in gates.items():
    assert a is None or (a.ndim in (3, 4) and a.shape[:3] == (B, T, H)), (name, g, np.shape(a))
  # one device's block: the last batch row and the last head group (grouped heads: a key/value head with its
  # query heads, or a query/key head with its value heads)
  groups = min(q.shape[2], k.shape[2], v.shape[2])
  block = lambda a: None if a is None else a[B - 1:, :, a.shape[2] - a.shape[2] // groups:]
  full = np.asarray(mixer.kernel(q, k, v, **gates))
  alone = np.asarray(mixer.kernel(block(q), block(k), block(v), **{g: block(a) for g, a in gates.items()}))
  assert full.shape[:3] == (B, T, H), (name, full.shape)
  # the same per-head arithmetic on fewer rows: equal up to float32 rounding of a differently batched matmul
  np.testing.assert_allclose(alone, block(full), rtol=1e-5, atol=1e-6, err_msg=name)


# packed rows: row 0 holds two documents, the first with a padding token inside it; row 1 starts with padding.
# Every document is 4 tokens, so all four run alone as one batch [4, 4, D] (one program).
PACKED = np.array([[1, 1, 0, 1, 1, 2, 2, 2, 2], [0, 4, 4, 4, 4, 6, 6, 6, 6]], np.int32)
PACKED_RUNS = [(0, [0, 1, 3, 4]), (0, [5, 6, 7, 8]), (1, [1, 2, 3, 4]), (1, [5, 6, 7, 8])]


@nnx.jit
def _packed_and_alone(mixer, x_BTD, segment_ids, x_alone):
  return mixer(x_BTD, segment_ids), mixer(x_alone)


@pytest.mark.parametrize("name, example", CASES)
def test_packed_rows_equal_each_document_alone(name, example):
  # segment_ids [B, T]: each document's outputs equal the mixer run on that document alone (a padding token
  # inside a document is skipped; no state, window or attention crosses a boundary)
  cfg = mixers.lookup(name)[0].examples()[example]
  x = jax.random.normal(jax.random.key(7), PACKED.shape + (D,))
  x_alone = jnp.stack([x[b, np.asarray(ts)] for b, ts in PACKED_RUNS])
  mixer = _build(cfg)
  # perturbed parameters: an initialisation that is the identity (a short convolution's taps) cannot hide a leak
  params = nnx.state(mixer, nnx.Param)
  keys = iter(jax.random.split(jax.random.key(8), len(jax.tree.leaves(params))))
  nnx.update(mixer, jax.tree.map(lambda p: p + 0.1 * jax.random.normal(next(keys), p.shape, p.dtype), params))
  y, y_alone = _packed_and_alone(mixer, x, jnp.asarray(PACKED), x_alone)
  for i, (b, ts) in enumerate(PACKED_RUNS):
    np.testing.assert_allclose(y[b, np.asarray(ts)], y_alone[i], rtol=2e-5, atol=2e-6,
                               err_msg=f"{name} doc {i}")


def _perturbed(cfg, seed=8):
  """The mixer of ``cfg`` with every parameter moved by ``0.1·N(0, 1)``: an initialisation that is the identity
  (a short convolution's taps) cannot hide a leak."""
  mixer = _build(cfg)
  params = nnx.state(mixer, nnx.Param)
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))
  nnx.update(mixer, jax.tree.map(lambda p: p + 0.1 * jax.random.normal(next(keys), p.shape, p.dtype), params))
  return mixer


# right-padded pieces (a mixed-length prefill): piece 1 is 5 wide with rows of 3 and 5 tokens, piece 2 is 2 wide
# with rows of 2 and 0 (row 1's prompt has ended), piece 3 continues both rows with 2 tokens each
PIECE_LENGTHS = (np.array([3, 5], np.int32), np.array([2, 0], np.int32))


@nnx.jit
def _sequence_and_padded_scans(mixer, x_BTD, junk_BTD):
  """``__call__`` on ``x``, and ``scan`` over the same tokens of each row in the three pieces of
  :data:`PIECE_LENGTHS` with ``junk`` at every padding position: ``(y, y_pieces [B, T, d])``, ``y_pieces``
  holding each row's outputs at its own tokens' positions."""
  y = mixer(x_BTD)
  (l1, l2), rows = PIECE_LENGTHS, jnp.arange(B)[:, None]
  t5 = jnp.arange(5)[None]
  piece1 = jnp.where((t5 < l1[:, None])[..., None], x_BTD[:, :5], junk_BTD[:, :5])
  state, y1 = mixer.scan(mixer.init_state(B, T), piece1, lengths=l1)
  t2 = jnp.arange(2)[None]
  piece2 = jnp.where((t2 < l2[:, None])[..., None], x_BTD[rows, l1[:, None] + t2], junk_BTD[:, 5:])
  state, y2 = mixer.scan(state, piece2, lengths=l2)
  at3 = (l1 + l2)[:, None] + t2                     # each row's next two tokens
  state, y3 = mixer.scan(state, x_BTD[rows, at3])
  got = jnp.zeros_like(y)
  got = got.at[rows, jnp.where(t5 < l1[:, None], t5, T)].set(y1, mode="drop")
  got = got.at[rows, jnp.where(t2 < l2[:, None], l1[:, None] + t2, T)].set(y2, mode="drop")
  return y, got.at[rows, at3].set(y3)


@pytest.mark.parametrize("name, example", [c for c in CASES if mixers.lookup(c[0])[1].scans()])
def test_scan_of_right_padded_rows_continues_each_row_from_its_own_tokens(name, example):
  # scan(state, x, lengths): the state returned for row b is the one after its first lengths[b] tokens, whatever
  # the padding holds and however many rows have ended (a zero-length row keeps its state): each row's outputs
  # over the three pieces equal the sequence call on its own tokens
  mixer = _perturbed(mixers.lookup(name)[0].examples()[example])
  x, _ = _inputs(0)
  junk = 3.0 * _inputs(1)[0]
  y, got = (np.asarray(a) for a in _sequence_and_padded_scans(mixer, x, junk))
  # two float32 evaluation orders of the same recurrence: rounding relative to the output's scale
  np.testing.assert_allclose(got, y, rtol=1e-4, atol=1e-5 * float(np.abs(y).max()), err_msg=name)


def test_base_class_says_what_a_mixer_without_decoding_lacks():
  @dataclasses.dataclass(frozen=True)
  class _Cfg(mixers.MixerConfig):
    name: str = dataclasses.field(default="_none", init=False)

  class _NoDecoding(Mixer):
    pass

  assert not _NoDecoding.decodes()
  with pytest.raises(NotImplementedError, match="_NoDecoding has no token-by-token decoding"):
    _NoDecoding().init_state(1, 4)
  with pytest.raises(NotImplementedError, match="does not report its state size"):
    _Cfg().state_floats(d_model=4, n_heads=1, seq_len=3)
