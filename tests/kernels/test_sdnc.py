"""The theorem as a test: causal attention == the read of a write-once (stateless) DNC memory.

Proven against softmax_attention (itself tested against a float64 numpy loop): the sDNC's reads,
values and gradients, and its read weights (against a float64 numpy softmax); cross-attention as a
fixed encoder memory. The hybrids (selective write, erase, DNC temporal-link reads): the parallel
form equals the literal memory scan (which uses the DNC link matrix) in values and gradients for
every subset of operations; with everything off it is softmax attention bitwise, at neutral gates
numerically; hand-built cases for forward / backward link reads, erase and the write gate; erase
over 4096 steps against a float64 reference. Module-level jits over one canonical awkward shape per
family, so each configuration compiles once.

Decoding from a memory (a KV cache): ``sdnc_scan`` on rows at different positions of a longer memory (one
past its end) equals the float64 loop over each row's written slots, values, and gradients against
``softmax_attention(q_offset=...)``; writes land at each row's own slots. ``sdnc_hybrid_scan`` (three
subsets of operations), a prefix then the rest, equals the parallel form (itself the memory scan, above)
on the whole sequence in values and gradients (q, k, v, every gate); rows started at different lengths are
tests/models/test_mixers.py's (the sdnc_hybrid mixer with every operation).

Packed sequences (``segment_ids``): a packed batch (three segments in a row, padding inside a segment and at
a row's start) equals each segment run alone without segment_ids, values and gradients, for ``sdnc_attention``
(its read weights stay inside the query's segment) and both hybrid forms with every operation on; padding
reads 0 and bad ids raise.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.attention import kv_cache_init, softmax_attention
from jaxmem.kernels.sdnc import (
  sdnc_attention,
  sdnc_cross_attention,
  sdnc_hybrid_attention,
  sdnc_hybrid_init,
  sdnc_hybrid_memory,
  sdnc_hybrid_scan,
  sdnc_scan,
)
from jaxmem.kernels.segments import segment_index
from tests.kernels.packed import runs
from tests.kernels.test_attention import numpy_attention


def rand(seed, shape, dtype=np.float32):
  """Standard normal inputs drawn in numpy (no JAX program per shape)."""
  return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def _vjp(fn, args, cot):
  out, pullback = jax.vjp(fn, *args)
  return out, pullback(cot)


@jax.jit
def sdnc_and_attention(q, k, v, cot):
  """Values and (q, k, v)-cotangents of the causal sDNC and of causal softmax attention."""
  return (_vjp(sdnc_attention, (q, k, v), cot),
          _vjp(lambda q, k, v: softmax_attention(q, k, v, causal=True), (q, k, v), cot))


@jax.jit
def cross_sdnc_and_attention(q, k, v, cot):
  return (_vjp(sdnc_cross_attention, (q, k, v), cot),
          _vjp(lambda q, k, v: softmax_attention(q, k, v, causal=False), (q, k, v), cot))


sdnc_weights = jax.jit(functools.partial(sdnc_attention, return_weights=True), static_argnames=("scale",))
attend = jax.jit(softmax_attention)
hybrid = jax.jit(sdnc_hybrid_attention, static_argnames=("scale",))


@jax.jit
def hybrid_parallel_and_memory(q, k, v, gates, cot):
  """Values and cotangents (q, k, v and every gate given) of the parallel form and the memory scan."""
  def run(fn):
    return _vjp(lambda q, k, v, gates: fn(q, k, v, **gates), (q, k, v, gates), cot)
  return run(sdnc_hybrid_attention), run(sdnc_hybrid_memory)


# The canonical shape: odd T and D, D != E, B > 1, H > 1.
B, T, H, D, E = 2, 7, 3, 5, 4


@pytest.mark.parametrize("shape", [(B, T, H, D, E), (1, 1, 2, 3, 3)], ids=["canonical", "T1"])
def test_attention_is_sdnc_read_values_and_gradients(shape):
  b, t, h, d, e = shape
  q, k, v = rand(0, (b, t, h, d)), rand(1, (b, t, h, d)), rand(2, (b, t, h, e))
  cot = rand(3, (b, t, h, e))
  (o_s, g_s), (o_a, g_a) = sdnc_and_attention(q, k, v, cot)
  assert o_s.shape == (b, t, h, e)
  np.testing.assert_allclose(o_s, o_a, rtol=1e-5, atol=1e-6)
  for name, a, b_ in zip("qkv", g_s, g_a, strict=True):
    np.testing.assert_allclose(a, b_, rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")


def test_read_weights_are_attention_weights_and_ignore_unwritten_slots():
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  _, w = sdnc_weights(q, k, v, scale=0.7)  # [B, H, T, T]
  logits = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k.astype(np.float64)) * 0.7
  mask = np.tril(np.ones((T, T), bool))
  e = np.where(mask, np.exp(logits - np.where(mask, logits, -np.inf).max(-1, keepdims=True)), 0.0)
  np.testing.assert_allclose(w, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
  assert np.all(np.asarray(w)[..., ~mask] == 0.0)


@pytest.mark.parametrize("S", [11, 3])
def test_cross_attention_is_a_fixed_encoder_memory(S):
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, S, H, D)), rand(2, (B, S, H, E))
  cot = rand(3, (B, T, H, E))
  (o_s, g_s), (o_a, g_a) = cross_sdnc_and_attention(q, k, v, cot)
  np.testing.assert_allclose(o_s, o_a, rtol=1e-5, atol=1e-6)
  for a, b in zip(g_s, g_a, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_bad_input_raises():
  x = np.zeros((1, 5, 2, 4), np.float32)
  with pytest.raises(ValueError, match="writes one slot per query"):
    sdnc_attention(x, np.zeros((1, 6, 2, 4), np.float32), np.zeros((1, 6, 2, 4), np.float32))
  with pytest.raises(ValueError, match="read heads"):
    sdnc_attention(x, np.zeros((1, 5, 3, 4), np.float32), np.zeros((1, 5, 3, 4), np.float32))
  with pytest.raises(ValueError, match="`q` must have rank 4"):
    sdnc_cross_attention(x[0], x, x)


# ---- hybrids: parallel form == literal memory scan (presence, erase, DNC link matrix) ----

HB = dict(B=2, T=9, H=3, D=5, E=4)


def _hybrid_inputs(seed=0):
  B, T, H, D, E = HB.values()
  return (rand(seed, (B, T, H, D)), rand(seed + 1, (B, T, H, D)), rand(seed + 2, (B, T, H, E)),
          {"write_gate": rand(seed + 3, (B, T, H)), "erase_gate": rand(seed + 4, (B, T, H)) + 1.0,
           "read_modes": rand(seed + 5, (B, T, H, 3))})


@pytest.mark.parametrize("ops", [(), ("write_gate",), ("erase_gate",), ("read_modes",),
                                 ("write_gate", "erase_gate", "read_modes")])
def test_hybrid_parallel_equals_memory_scan_values_and_gradients(ops):
  q, k, v, gates = _hybrid_inputs()
  kw = {name: gates[name] for name in ops}
  cot = rand(9, v.shape)
  (o_par, g_par), (o_mem, g_mem) = hybrid_parallel_and_memory(q, k, v, kw, cot)
  np.testing.assert_allclose(o_par, o_mem, rtol=1e-5, atol=1e-6)
  assert len(jax.tree.leaves(g_par)) == 3 + len(ops)
  for a, b in zip(jax.tree.leaves(g_par), jax.tree.leaves(g_mem), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_hybrid_with_everything_off_is_softmax_attention_exactly():
  # bitwise by construction: both trace the same float operations (scores, scale, masked
  # softmax, weighted sum) in the same order; only the boolean causal mask is built differently
  q, k, v, _ = _hybrid_inputs(1)
  np.testing.assert_array_equal(hybrid(q, k, v), attend(q, k, v))


def test_hybrid_at_neutral_gate_values_is_softmax_attention():
  q, k, v, gates = _hybrid_inputs(2)
  neutral = {"write_gate": np.full_like(gates["write_gate"], 1e4),
             "erase_gate": np.full_like(gates["erase_gate"], 1e4),
             "read_modes": np.broadcast_to(np.float32([-1e4, 1e4, -1e4]), gates["read_modes"].shape)}
  np.testing.assert_allclose(hybrid(q, k, v, **neutral), attend(q, k, v), rtol=1e-6, atol=1e-7)


def test_forward_mode_reads_the_successor_of_the_attended_slot():
  B, T, H, D, E = HB.values()
  # keys e_0 .. e_{D-1} then zeros, sharp: slot 2 (key 20 e_2) is the only slot a query 20 e_2 attends
  keys = np.broadcast_to((np.eye(T, D, dtype=np.float32) * 20.0)[None, :, None], (B, T, H, D))
  v = rand(3, (B, T, H, E))
  q = np.broadcast_to(keys[:, 2:3], keys.shape)  # every step attends slot 2 (once written)
  fwd = np.broadcast_to(np.float32([-1e4, -1e4, 1e4]), (B, T, H, 3))
  out = hybrid(q, keys, v, read_modes=fwd, scale=1.0)
  np.testing.assert_allclose(out[:, 4:], np.broadcast_to(v[:, 3:4], (B, T - 4, H, E)), atol=1e-4)
  back = np.broadcast_to(np.float32([1e4, -1e4, -1e4]), (B, T, H, 3))
  out = hybrid(q, keys, v, read_modes=back, scale=1.0)
  np.testing.assert_allclose(out[:, 4:], np.broadcast_to(v[:, 1:2], (B, T - 4, H, E)), atol=1e-4)


def test_erase_forgets_old_slots_and_write_gate_hides_slots():
  B, T, H, D, E = HB.values()
  q = np.zeros((B, T, H, D), np.float32)  # uniform content weights over written slots
  k = np.zeros((B, T, H, D), np.float32)
  v = np.broadcast_to(np.arange(T, dtype=np.float32)[None, :, None, None], (B, T, H, E))
  erase_all = np.full((B, T, H), -1e4, np.float32)  # f_t = 0: only the newest slot survives
  out = hybrid(q, k, v, erase_gate=erase_all)
  np.testing.assert_allclose(out, v, atol=1e-5)
  hide_odd = np.broadcast_to(np.where(np.arange(T) % 2 == 1, -1e4, 1e4).astype(np.float32)[None, :, None],
                             (B, T, H))
  out = hybrid(q, k, v, write_gate=hide_odd)
  even_means = np.array([np.mean(np.arange(0, t + 1, 2)) for t in range(T)], np.float32)  # 4: (0+2+4)/3
  np.testing.assert_allclose(out, np.broadcast_to(even_means[None, :, None, None], v.shape), atol=1e-5)


def test_hybrid_bad_gate_shapes_raise():
  q, k, v, gates = _hybrid_inputs()
  with pytest.raises(ValueError, match=r"`erase_gate` must have shape \[2, 9, 3\]"):
    sdnc_hybrid_attention(q, k, v, erase_gate=gates["erase_gate"][:, :5])
  with pytest.raises(ValueError, match=r"`read_modes` must have shape \[2, 9, 3, 3\]"):
    sdnc_hybrid_attention(q, k, v, read_modes=gates["read_modes"][..., :2])


def test_hybrid_erase_keeps_float32_accuracy_on_long_sequences_and_at_zero_retention():
  # retention f_t = σ(z_t) compounded over T = 4096 steps: the decay of slot s at step t is
  # a segment sum of log f, not the difference of two cumulative sums (2e-4 error before)
  T, D = 4096, 4
  r = np.random.default_rng(0)
  q, k, v = (r.normal(size=(1, T, 1, D)).astype(np.float32) for _ in range(3))
  z = r.normal(size=(1, T, 1)) + 2.0  # retention ≈ 0.88 on average
  out = np.asarray(hybrid(q, k, v, erase_gate=z.astype(np.float32)))[0, :, 0]
  # float64 reference: w_t[s] ∝ exp(q_t·k_s / √D + Σ_{s<τ≤t} log σ(z_τ))
  qn, kn, vn = (np.asarray(x, np.float64)[0, :, 0] for x in (q, k, v))
  logf = -np.logaddexp(0.0, -z[0, :, 0])
  c = np.cumsum(logf)  # exact enough in float64 for the reference
  logits = qn @ kn.T / np.sqrt(D) + (c[:, None] - c[None, :])
  logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  ref = (w / w.sum(-1, keepdims=True)) @ vn
  assert np.abs(out - ref).max() < 2e-5, np.abs(out - ref).max()
  # retention exactly 0 (σ(−200) underflows; log σ stays finite): each step reads its own slot,
  # in both forms, with finite gradients (cotangent 1: the gradient of the sum of the reads)
  q, k, v, _ = _hybrid_inputs(3)
  z0 = {"erase_gate": np.full(q.shape[:3], -200.0, np.float32)}
  (o_par, g_par), (o_mem, g_mem) = hybrid_parallel_and_memory(q, k, v, z0, np.ones_like(v))
  np.testing.assert_allclose(o_par, v, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(o_mem, v, rtol=1e-6, atol=1e-6)
  for g in jax.tree.leaves((g_par, g_mem)):
    assert np.isfinite(np.asarray(g)).all()


# ---- decoding: the memory is a KV cache, written from each row's own length ----

CB, CT, CS = 3, 4, 11
LENGTHS = np.array([0, 5, 9], np.int32)   # row 2 writes slots 9, 10, then past the end (dropped)


@jax.jit
def sdnc_from_memory(K, V, lengths, q, k, v, cot):
  """``sdnc_scan`` from a memory holding ``lengths`` slots per row: (memory, reads) and the (q, k, v, K, V)
  cotangents of ⟨reads, cot⟩, next to softmax_attention(q_offset=lengths) on the memory with the chunk
  written."""
  memory = {**kv_cache_init(CB, CS, H, D, E), "k": K, "v": V, "length": lengths}
  def ours(q, k, v, K, V):
    return sdnc_scan({**memory, "k": K, "v": V}, q, k, v)[1]
  def ref(q, k, v, K, V):
    rows, slots = np.arange(CB)[:, None], lengths[:, None] + np.arange(CT)[None, :]
    K2, V2 = K.at[rows, slots].set(k, mode="drop"), V.at[rows, slots].set(v, mode="drop")
    return softmax_attention(q, K2, V2, causal=True, q_offset=lengths)
  args = (q, k, v, K, V)
  return (sdnc_scan(memory, q, k, v), _vjp(ours, args, cot), _vjp(ref, args, cot))


def test_sdnc_scan_reads_from_each_rows_slots_values_and_gradients():
  q, k, v = rand(0, (CB, CT, H, D)), rand(1, (CB, CT, H, D)), rand(2, (CB, CT, H, E))
  K, V = rand(3, (CB, CS, H, D)), rand(4, (CB, CS, H, E))
  written = np.arange(CS)[None, :] < LENGTHS[:, None]
  K, V = np.where(written[..., None, None], K, 0.0), np.where(written[..., None, None], V, 0.0)
  (memory, reads), (o, g), (o_ref, g_ref) = sdnc_from_memory(K, V, LENGTHS, q, k, v, rand(5, (CB, CT, H, E)))
  # the memory after the chunk: each row's slots length .. length + T − 1 (those that fit), nothing wrapped
  K_all, V_all = np.array(K), np.array(V)
  for b in range(CB):
    for t in range(CT):
      if LENGTHS[b] + t < CS:
        K_all[b, LENGTHS[b] + t], V_all[b, LENGTHS[b] + t] = k[b, t], v[b, t]
  np.testing.assert_array_equal(memory["k"], K_all)
  np.testing.assert_array_equal(memory["v"], V_all)
  np.testing.assert_array_equal(memory["length"], LENGTHS + CT)
  want = numpy_attention(q, K_all, V_all, True, q_offset=LENGTHS)
  np.testing.assert_allclose(reads, want, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-6)
  for name, a, b in zip(("q", "k", "v", "K", "V"), g, g_ref, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")


# presences without decay and link reads; decay alone; everything (each subset costs a compile of a few seconds)
OPS = [("write_gate", "read_modes"), ("erase_gate",), ("write_gate", "erase_gate", "read_modes")]
SPLIT, MAX_LEN = 3, 13   # a prefix of 3 tokens, then the rest, in a memory longer than the sequence


@jax.jit
def hybrid_chunked_and_memory(q, k, v, gates, cot):
  """For each subset of operations: values and cotangents (q, k, v, gates) of ``sdnc_hybrid_scan`` over a
  prefix then the rest of the sequence, and of the parallel form on the whole (the memory scan costs more to
  compile; the two are equal, test_hybrid_parallel_equals_memory_scan_values_and_gradients)."""
  B = q.shape[0]
  def chunked(q, k, v, gates):
    memory = sdnc_hybrid_init(B, MAX_LEN, H, D, E, presence=bool({"write_gate", "erase_gate"} & set(gates)))
    cut = lambda x, sl: None if x is None else x[:, sl]
    memory, a = sdnc_hybrid_scan(memory, *(x[:, :SPLIT] for x in (q, k, v)),
                                 **{n: cut(x, slice(None, SPLIT)) for n, x in gates.items()})
    memory, b = sdnc_hybrid_scan(memory, *(x[:, SPLIT:] for x in (q, k, v)),
                                 **{n: cut(x, slice(SPLIT, None)) for n, x in gates.items()})
    return jax.numpy.concatenate([a, b], axis=1)
  out = {}
  for ops in OPS:
    kw = {n: gates[n] for n in ops}
    out[ops] = (_vjp(chunked, (q, k, v, kw), cot),
                _vjp(lambda q, k, v, kw: sdnc_hybrid_attention(q, k, v, **kw), (q, k, v, kw), cot))
  return out


def test_hybrid_scan_prefix_then_rest_equals_the_whole_sequence_values_and_gradients():
  q, k, v, gates = _hybrid_inputs(4)
  results = hybrid_chunked_and_memory(q, k, v, gates, rand(9, v.shape))
  for ops, ((o, g), (o_ref, g_ref)) in results.items():
    np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-6, err_msg=str(ops))
    assert len(jax.tree.leaves(g)) == 3 + len(ops)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=str(ops))


def test_hybrid_scan_without_presences_rejects_gates():
  q, k, v, gates = _hybrid_inputs()
  memory = sdnc_hybrid_init(q.shape[0], 12, q.shape[2], q.shape[3], v.shape[3], presence=False)
  with pytest.raises(ValueError, match="presence=True"):
    sdnc_hybrid_scan(memory, q, k, v, erase_gate=gates["erase_gate"])
  with pytest.raises(ValueError, match="cache lengths"):
    sdnc_scan({**memory, "v": memory["v"][:, :5]}, q, k, v)


# ---- packed sequences (segment_ids): a packed batch == each segment run alone ----

# two rows of T = 24 packed documents: row 0 is three segments (the second interrupted by padding, which it
# continues across) and trailing padding; row 1 starts with padding, then two segments
SEGMENTS = np.array([[1] * 4 + [2] * 7 + [0] * 2 + [2] * 3 + [3] * 6 + [0] * 2,
                     [0] * 3 + [4] * 10 + [1] * 11], np.int32)
PB, PT, PH = 2, 24, 2


# each segment alone: a row of its own, from position 0 (its tokens gathered, padding dropped), zeros after
# its end (the kernels are causal: nothing after a token changes its read or, with a zero cotangent there,
# any gradient); [N, T_max] token indices into the packed batch
ALONE = [(b, r) for b, ids in enumerate(SEGMENTS) for r in runs(ids)]
ALONE_T = max(len(r) for _, r in ALONE)
ALONE_ROW = np.array([[b] * ALONE_T for b, _ in ALONE])
ALONE_TOKEN = np.array([np.pad(r, (0, ALONE_T - len(r)), constant_values=r[0]) for _, r in ALONE])
ALONE_REAL = np.arange(ALONE_T)[None, :] < np.array([len(r) for _, r in ALONE])[:, None]
# the inverse: packed token (b, t) is token j of segment n (padding: n = 0, j = 0, output zeroed)
PACKED_N, PACKED_J = np.zeros(SEGMENTS.shape, int), np.zeros(SEGMENTS.shape, int)
for n, (b, r) in enumerate(ALONE):
  PACKED_N[b, r], PACKED_J[b, r] = n, np.arange(len(r))


def per_segment(fn, *xs):
  """``fn(*xs)`` of a packed batch ``[B, T, ...]`` from ``fn`` run on each segment alone, without
  ``segment_ids`` (as the rows of one batch ``[N, T_max, ...]``, zeros after a segment's end); padding
  outputs 0."""
  def gather(x):
    x = x[ALONE_ROW, ALONE_TOKEN]
    return jnp.where(ALONE_REAL.reshape(ALONE_REAL.shape + (1,) * (x.ndim - 2)), x, 0.0)
  o = fn(*(gather(x) for x in xs))[PACKED_N, PACKED_J]
  return jnp.where((SEGMENTS != 0).reshape(SEGMENTS.shape + (1,) * (o.ndim - 2)), o, 0.0)


def _packed_inputs(seed=0):
  q, k, v = rand(seed, (PB, PT, PH, D)), rand(seed + 1, (PB, PT, PH, D)), rand(seed + 2, (PB, PT, PH, E))
  gates = {"write_gate": rand(seed + 3, (PB, PT, PH)), "erase_gate": rand(seed + 4, (PB, PT, PH)) + 1.0,
           "read_modes": rand(seed + 5, (PB, PT, PH, 3))}
  return q, k, v, gates, rand(seed + 6, (PB, PT, PH, E))


def _assert_packed_equals_alone(packed, alone, what):
  (o, g), (o_ref, g_ref) = packed, alone
  np.testing.assert_allclose(o, o_ref, rtol=1e-5, atol=1e-6, err_msg=f"{what} values")
  assert not np.any(np.asarray(o)[SEGMENTS == 0]), f"{what}: padding reads 0"
  for name, a, b in zip(("q", "k", "v", "write_gate", "erase_gate", "read_modes"), jax.tree.leaves(g),
                        jax.tree.leaves(g_ref), strict=False):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"{what} d/d{name}")


@jax.jit
def sdnc_packed_and_alone(q, k, v, cot):
  """Values, read weights and (q, k, v)-cotangents on the packed batch; values and cotangents of each segment
  alone."""
  packed = lambda q, k, v: sdnc_attention(q, k, v, segment_ids=SEGMENTS, return_weights=True)
  o, pullback, weights = jax.vjp(packed, q, k, v, has_aux=True)
  return (o, pullback(cot)), _vjp(lambda *xs: per_segment(sdnc_attention, *xs), (q, k, v), cot), weights


def test_sdnc_packed_sequences_equal_each_segment_alone():
  q, k, v, _, cot = _packed_inputs()
  packed, alone, w = sdnc_packed_and_alone(q, k, v, cot)
  _assert_packed_equals_alone(packed, alone, "sdnc_attention")
  # read weights: only on the query's own segment's slots; padding rows all 0
  index = np.asarray(segment_index(SEGMENTS))
  same = (index[:, :, None] == index[:, None, :]) & (index >= 0)[:, :, None]
  assert np.all(np.asarray(w)[np.broadcast_to(~same[:, None], w.shape)] == 0.0)


@jax.jit
def hybrid_packed_and_alone(q, k, v, gates, cot):
  """Values and cotangents (q, k, v and every gate) of both hybrid forms on the packed batch, and of the
  parallel form run on each segment alone (the two forms agree without segments,
  test_hybrid_parallel_equals_memory_scan_values_and_gradients)."""
  def packed(fn):
    return _vjp(lambda q, k, v, g: fn(q, k, v, **g, segment_ids=SEGMENTS), (q, k, v, gates), cot)
  one = lambda q, k, v, w, e, m: sdnc_hybrid_attention(q, k, v, write_gate=w, erase_gate=e, read_modes=m)
  names = ("write_gate", "erase_gate", "read_modes")
  alone = _vjp(lambda q, k, v, g: per_segment(one, q, k, v, *(g[n] for n in names)), (q, k, v, gates), cot)
  return packed(sdnc_hybrid_attention), packed(sdnc_hybrid_memory), alone


def test_hybrid_packed_sequences_equal_each_segment_alone_both_forms():
  # every operation on: no key, link or erase product crosses a boundary, padding inside a segment is
  # skipped by the links and erases nothing
  q, k, v, gates, cot = _packed_inputs(1)
  parallel, memory, alone = hybrid_packed_and_alone(q, k, v, gates, cot)
  assert len(jax.tree.leaves(alone[1])) == 6
  _assert_packed_equals_alone(parallel, alone, "parallel")
  _assert_packed_equals_alone(memory, alone, "memory")


def test_bad_segment_ids_raise():
  q, k, v, gates, _ = _packed_inputs()
  for bad in (SEGMENTS.astype(np.float32), SEGMENTS[:, :-1]):
    with pytest.raises(ValueError, match="segment_ids"):
      sdnc_attention(q, k, v, segment_ids=bad)
    with pytest.raises(ValueError, match="segment_ids"):
      sdnc_hybrid_attention(q, k, v, **gates, segment_ids=bad)
    with pytest.raises(ValueError, match="segment_ids"):
      sdnc_hybrid_memory(q, k, v, segment_ids=bad)
