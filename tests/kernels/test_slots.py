"""Sparse slot memory (UniMatrix-SparsePointer) against a plain-Python float64 simulator.

Proven against the simulator: readouts (weights, context, pointer, slot ids) and final states on
random sequences that merge, fill, evict and skip, away from ties, for four configurations (top_k ==
n_slots, a single slot, ...); gradients against central differences of the simulator; causality (a
read sees only earlier writes). Hand-made sequences pin the merge mean, fill / evict order, ties,
the top-K read, the pointer, the zero gate and the cosine scale; the step API equals the scan;
jit and vmap; bad input raises. The tests share two shapes (STD for random and gradient checks,
HAND for hand-made sequences), and the gradient checks share one module-level jitted VJP.
"""

from __future__ import annotations

import collections
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels import slots
from jaxmem.kernels.slots import SlotState, pointer_logits, slot_memory

EPS, FLOOR = 1e-6, 1e-30


# --------------------------------------------------------------------------------------
# The reference: the spec in plain Python (lists of dicts, float64 numpy vectors).
# --------------------------------------------------------------------------------------


def ref_cos(a, b):
  return float(np.dot(a, b) / math.sqrt((np.dot(a, a) + EPS) * (np.dot(b, b) + EPS)))


class RefSlots:
  """One batch element's memory: a list of N entries, None or a dict of the slot fields.

  ``margins`` collects how far every discrete decision was from flipping (top-K boundary,
  merge threshold, best-vs-second merge target), so that a test can insist on a case far
  from ties."""

  def __init__(self, n_slots, d_key, d_value):
    self.slots = [None] * n_slots
    self.d_key, self.d_value = d_key, d_value
    self.margins = []
    self.events = collections.Counter()  # merge / fill / evict / skip

  def read(self, q, top_k, temperature):
    scored = [(ref_cos(q, s["key"]) / math.sqrt(len(q)) + math.log(max(s["strength"], FLOOR)), n)
              for n, s in enumerate(self.slots) if s is not None]
    scored.sort(key=lambda sn: (-sn[0], sn[1]))
    if len(scored) > top_k:
      self.margins.append(scored[top_k - 1][0] - scored[top_k][0])
    kept = scored[:top_k]
    w = [0.0] * len(self.slots)
    if kept:
      top = max(sc for sc, _ in kept)
      e = {n: math.exp(temperature * (sc - top)) for sc, n in kept}
      total = sum(e.values())
      for n, en in e.items():
        w[n] = en / total
    context = np.zeros(self.d_value)
    for n, s in enumerate(self.slots):
      if w[n]:
        context = context + w[n] * s["value"]
    return w, context

  def write(self, k, u, x, g, threshold, strength_update="gate"):
    written = None
    if g > 0:
      used = [n for n, s in enumerate(self.slots) if s is not None]
      if used:
        cosines = sorted(((ref_cos(k, self.slots[n]["key"]), n) for n in used), key=lambda cn: (-cn[0], cn[1]))
        best_cos, best = cosines[0]
        self.margins.append(abs(best_cos - threshold))
        if best_cos > threshold:
          if len(cosines) > 1 and cosines[1][0] > threshold:
            self.margins.append(best_cos - cosines[1][0])
          s = self.slots[best]
          st = s["strength"]
          s["key"] = (st * s["key"] + g * k) / (st + g)
          s["value"] = (st * s["value"] + g * u) / (st + g)
          s["strength"] = st + g if strength_update == "accumulate" else g
          s["id"], s["age"] = x, 0
          written = best
          self.events["merge"] += 1
      if written is None:
        empty = [n for n, s in enumerate(self.slots) if s is None]
        self.events["fill" if empty else "evict"] += 1
        if empty:
          written = empty[0]
        else:
          oldest_age = max(s["age"] for s in self.slots)
          written = min(n for n, s in enumerate(self.slots) if s["age"] == oldest_age)
        self.slots[written] = dict(key=np.array(k, float), value=np.array(u, float), id=int(x),
                                   strength=float(g), age=0)
    else:
      self.events["skip"] += 1
    for n, s in enumerate(self.slots):
      if s is not None and n != written:
        s["age"] += 1

  def ids(self):
    return [-1 if s is None else s["id"] for s in self.slots]

  def as_arrays(self):
    N = len(self.slots)
    get = lambda f, empty: [empty if s is None else s[f] for s in self.slots]
    return dict(keys=np.array(get("key", np.zeros(self.d_key))).reshape(N, self.d_key),
                values=np.array(get("value", np.zeros(self.d_value))).reshape(N, self.d_value),
                ids=np.array(self.ids()), strength=np.array(get("strength", 0.0)),
                age=np.array(get("age", 0)), used=np.array([s is not None for s in self.slots]))


def ref_slot_memory(q, k, v, x, gate, *, n_slots, top_k=4, threshold=0.85, temperature=8.0,
                    vocab_size=None, strength_update="gate"):
  """float64 readout of the whole batch: dict of arrays, plus the memories."""
  B, T, _ = q.shape
  mems = [RefSlots(n_slots, k.shape[2], v.shape[2]) for _ in range(B)]
  out = dict(weights=np.zeros((B, T, n_slots)), context=np.zeros((B, T, v.shape[2])),
             ids=np.zeros((B, T, n_slots), int))
  if vocab_size:
    out["pointer"] = np.zeros((B, T, vocab_size))
  for b, mem in enumerate(mems):
    for t in range(T):
      w, c = mem.read(q[b, t], top_k, temperature)
      out["weights"][b, t], out["context"][b, t], out["ids"][b, t] = w, c, mem.ids()
      if vocab_size:
        for n, slot_id in enumerate(mem.ids()):
          if slot_id >= 0:
            out["pointer"][b, t, slot_id] += w[n]
      mem.write(k[b, t], v[b, t], int(x[b, t]), float(gate[b, t]), threshold, strength_update)
  return out, mems


def random_case(seed, B, T, D, V, vocab):
  """Keys and queries near a few orthogonal prototypes (so merges happen), some fresh
  random keys, gates mixing 0, 1 and fractions; float64 numpy."""
  rng = np.random.default_rng(seed)
  n_proto = min(D, 4)
  proto = np.linalg.qr(rng.normal(size=(D, D)))[0][:n_proto] * rng.uniform(0.5, 2.0, (n_proto, 1))

  def near_prototypes(noise):
    idx = rng.integers(0, n_proto + 1, (B, T))
    fresh = rng.normal(size=(B, T, D))
    base = np.where((idx < n_proto)[..., None], proto[np.minimum(idx, n_proto - 1)], fresh)
    return base + noise * rng.normal(size=(B, T, D))

  k, q = near_prototypes(0.05), near_prototypes(0.3)
  v = rng.normal(size=(B, T, V))
  x = rng.integers(0, vocab, (B, T))
  gate = np.where(rng.random((B, T)) < 0.2, 0.0, np.where(rng.random((B, T)) < 0.5, 1.0,
                                                          rng.uniform(0.2, 1.0, (B, T))))
  return q, k, v, x, gate


def f32(*xs):
  return [np.asarray(x, np.float32) for x in xs]


# Compilation dominates this file's runtime, so the tests share two configurations (one
# compiled program each, plus one VJP): STD for random and gradient checks, HAND for the
# hand-made sequences.
STD = dict(B=2, T=12, N=3, D=4, V=3, top_k=2, vocab=5)
HAND = dict(T=5, N=3, D=6, V=2, top_k=2, vocab=5)


def std_memory(q, k, v, x, gate, **kw):
  return slot_memory(q, k, v, jnp.asarray(x, jnp.int32), n_slots=STD["N"], top_k=STD["top_k"],
                     write_gate_BT=jnp.asarray(gate, jnp.float32), vocab_size=STD["vocab"], **kw)


def std_case(seed):
  return random_case(seed, STD["B"], STD["T"], STD["D"], STD["V"], STD["vocab"])


@functools.partial(jax.jit, static_argnames="strength_update")
def std_vjp(q, k, v, x, gate, cot, strength_update="gate"):
  """STD's (context, pointer, final keys, final strength) and the cotangents of ⟨cot, them⟩ w.r.t.
  (queries, keys, values, gate)."""
  def f(q, k, v, gate):
    out, fin = std_memory(q, k, v, x, gate, return_state=True, strength_update=strength_update)
    return out.context, out.pointer, fin.keys, fin.strength
  outs, pullback = jax.vjp(f, q, k, v, gate)
  return outs, pullback(cot)


def std_cotangent(context=None, pointer=None, keys=None, strength=None):
  """A cotangent for :func:`std_vjp`, zero where not given."""
  B, T, N = STD["B"], STD["T"], STD["N"]
  shapes = ((B, T, STD["V"]), (B, T, STD["vocab"]), (B, N, STD["D"]), (B, N))
  return tuple(np.zeros(s, np.float32) if c is None else np.asarray(c, np.float32)
               for c, s in zip((context, pointer, keys, strength), shapes, strict=True))


# --------------------------------------------------------------------------------------
# Random sequences vs the simulator.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed,B,T,N,D,V,top_k,vocab,strength_update", [
    (0, *STD.values(), "gate"),                # strength = the last write's gate (the default)
    (0, 3, 17, 3, 3, 5, 3, 4, "accumulate"),   # top_k == n_slots, odd D; strength s + g
    (0, 2, 9, 1, 2, 1, 1, 3, "gate"),          # a single slot
    (0, 1, 31, 7, 8, 2, 4, 11, "accumulate"),
    (0, 3, 17, 3, 3, 5, 3, 4, "gate"),
])
def test_slot_memory_matches_python_simulator(seed, B, T, N, D, V, top_k, vocab, strength_update):
  q, k, v, x, gate = random_case(seed, B, T, D, V, vocab)
  ref, mems = ref_slot_memory(q, k, v, x, gate, n_slots=N, top_k=top_k, vocab_size=vocab,
                              strength_update=strength_update)
  assert min(m for mem in mems for m in mem.margins) > 1e-4, "pick a seed away from ties"
  events = sum((mem.events for mem in mems), collections.Counter())
  assert all(events[e] > 0 for e in ("merge", "fill", "evict", "skip")), events
  out, final = slot_memory(*f32(q, k, v), np.asarray(x, np.int32), n_slots=N, top_k=top_k,
                           write_gate_BT=np.asarray(gate, np.float32), vocab_size=vocab,
                           return_state=True, strength_update=strength_update)
  np.testing.assert_array_equal(out.ids, ref["ids"])
  np.testing.assert_allclose(out.weights, ref["weights"], atol=2e-5)
  np.testing.assert_allclose(out.context, ref["context"], atol=5e-5)
  np.testing.assert_allclose(out.pointer, ref["pointer"], atol=2e-5)
  for b, mem in enumerate(mems):
    want = mem.as_arrays()
    for field in ("ids", "age", "used"):
      np.testing.assert_array_equal(np.asarray(getattr(final, field))[b], want[field], err_msg=field)
    for field in ("keys", "values", "strength"):
      np.testing.assert_allclose(np.asarray(getattr(final, field))[b], want[field], atol=2e-5, err_msg=field)


@pytest.mark.parametrize("strength_update", ["accumulate", "gate"])
def test_gradients_match_finite_differences_of_the_simulator(strength_update):
  B, N, V, vocab, K = STD["B"], STD["N"], STD["V"], STD["vocab"], STD["top_k"]
  q, k, v, x, gate = std_case(2)
  rng = np.random.default_rng(8)
  cot = dict(context=rng.normal(size=(B, STD["T"], V)), pointer=rng.normal(size=(B, STD["T"], vocab)),
             keys=rng.normal(size=(B, N, STD["D"])), strength=rng.normal(size=(B, N)))

  def ref_loss(q, k, v, gate):
    out, mems = ref_slot_memory(q, k, v, x, gate, n_slots=N, top_k=K, vocab_size=vocab,
                                strength_update=strength_update)
    fin = [m.as_arrays() for m in mems]
    return (np.sum(cot["context"] * out["context"]) + np.sum(cot["pointer"] * out["pointer"])
            + sum(np.sum(cot["keys"][b] * f["keys"]) + np.sum(cot["strength"][b] * f["strength"])
                  for b, f in enumerate(fin))), mems

  _, mems = ref_loss(q, k, v, gate)
  assert min(m for mem in mems for m in mem.margins) > 1e-3

  # the cotangents of ⟨cot, outputs⟩: the gradient of the simulator's loss above
  args = (q, k, v, gate)
  _, grads = std_vjp(*f32(q, k, v), x, np.asarray(gate, np.float32), std_cotangent(**cot),
                     strength_update=strength_update)
  h = 1e-6
  for i, name in enumerate(("queries", "keys", "values", "gate")):
    assert np.all(np.isfinite(grads[i]))
    for trial in range(2):
      d = np.random.default_rng(100 * i + trial).normal(size=args[i].shape)
      if name == "gate":
        d = np.where(gate > 0, d, 0.0)  # a zero gate stays zero (no write)
      plus = [a + h * d if j == i else a for j, a in enumerate(args)]
      minus = [a - h * d if j == i else a for j, a in enumerate(args)]
      fd = (ref_loss(*plus)[0] - ref_loss(*minus)[0]) / (2 * h)
      got = float(np.sum(np.asarray(grads[i], np.float64) * d))
      assert abs(fd) > 1e-2, name
      np.testing.assert_allclose(got, fd, rtol=2e-3, atol=2e-4, err_msg=name)


def test_read_sees_only_earlier_writes():
  q, k, v, x, gate = std_case(5)
  q, k, v, gate = f32(q, k, v, gate)
  cot = np.random.default_rng(0).normal(size=(STD["B"], STD["V"]))
  for t in (0, 6):
    context_cot = np.zeros((STD["B"], STD["T"], STD["V"]))
    context_cot[:, t] = cot  # the gradient of ⟨cot, context[:, t]⟩
    _, grads = std_vjp(q, k, v, x, gate, std_cotangent(context=context_cot))
    gq, gk, gv, gg = (np.asarray(g) for g in grads)
    assert not any(np.any(a[:, s:]) for a, s in ((gq, t + 1), (gk, t), (gv, t), (gg, t)))
    assert t == 0 or all(np.any(a[:, :t]) for a in (gk, gv, gg)) and np.any(gq[:, t])


# --------------------------------------------------------------------------------------
# Hand-made sequences (one batch element, the HAND configuration).
# --------------------------------------------------------------------------------------


def pad(rows, width):
  return np.array([list(r) + [0.0] * (width - len(r)) for r in rows], np.float32)


def run(keys, *, values=None, ids=None, gate=None, queries=None, initial_state=None, cos_scale=None,
        strength_update="gate"):
  """slot_memory on one sequence of HAND's shape given as lists; (readout, final state)."""
  T, D, V = HAND["T"], HAND["D"], HAND["V"]
  k = pad(keys, D)[None]
  q = pad(queries, D)[None] if queries is not None else k
  v = pad(values, V)[None] if values is not None else np.ones((1, T, V), np.float32)
  x = np.array([ids if ids is not None else list(range(T))], np.int32)
  g = np.ones((1, T), np.float32) if gate is None else np.asarray([gate])
  assert k.shape == (1, T, D) and q.shape == k.shape and v.shape == (1, T, V)
  return slot_memory(q, k, v, x, n_slots=HAND["N"], top_k=HAND["top_k"], write_gate_BT=g,
                     vocab_size=HAND["vocab"], initial_state=initial_state, return_state=True,
                     cos_scale=cos_scale, strength_update=strength_update)


def hand_state(keys, *, ages, strength=(1.0, 1.0, 1.0)):
  """A full HAND memory with the given keys, ages and strengths (ids 0, 1, 2)."""
  N = HAND["N"]
  return SlotState(keys=pad(keys, HAND["D"])[None], values=np.zeros((1, N, HAND["V"]), np.float32),
                   ids=np.arange(N, dtype=np.int32)[None], strength=np.asarray([strength], np.float32),
                   age=np.asarray([ages], np.int32), used=np.ones((1, N), bool))


EYE = np.eye(HAND["D"]).tolist()


def test_repeated_key_merges_as_a_strength_weighted_mean():
  keys = [[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [1.0, -0.1], [0.0, 0.0, 1.0]]
  values = [[1.0, 0.0], [0.0, 1.0], [5.0, 5.0], [0.0, 0.0], [9.0, 9.0]]
  # accumulate: strengths 1 -> 2 -> 2.5; (1·[1,0] + 1·[1,.1]) / 2 = [1, .05], then
  # (2·[1,.05] + .5·[1,-.1]) / 2.5 = [1, .02]; values [.5,.5] then 2·[.5,.5] / 2.5 = [.4,.4].
  # gate (the default): strengths 1 -> 1 -> .5; the same first merge, then
  # (1·[1,.05] + .5·[1,-.1]) / 1.5 = [1, 0]; values [.5,.5] then [.5,.5] / 1.5 = [1/3, 1/3].
  for strength_update, strength, key, value in (("accumulate", 2.5, 0.02, 0.4), ("gate", 0.5, 0.0, 1 / 3)):
    _, st = run(keys, values=values, ids=[3, 1, 2, 4, 0], gate=[1.0, 1.0, 1.0, 0.5, 0.0],
                strength_update=strength_update)
    np.testing.assert_array_equal(st.used[0], [True, True, False])
    np.testing.assert_allclose(st.strength[0], [strength, 1.0, 0.0])
    np.testing.assert_allclose(st.keys[0, 0], [1.0, key, 0, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(st.values[0, 0], [value, value], atol=1e-6)
    np.testing.assert_array_equal(st.ids[0], [4, 2, -1])  # the latest id wins
    np.testing.assert_array_equal(st.age[0], [1, 2, 0])


def test_merge_ids_decide_merges_instead_of_the_cosine():
  """With merge ids a write merges into the used slot last written with the same id, whatever the keys'
  cosine: equal keys with ids 2, 1 keep two slots, orthogonal keys with id 2 merge (a gate-weighted mean of
  e0 and e1), and a later id 3 fills; without merge ids the equal keys merge. Evicting a slot replaces its
  id."""
  D, e = HAND["D"], EYE
  keys, values = [e[0], e[0], e[1], e[1], e[2]], [[1.0, 0.0], [0.0, 1.0], [3.0, 3.0], [5.0, 5.0], [7.0, 7.0]]
  T = HAND["T"]
  pad_v = pad(values, HAND["V"])[None]
  k = pad(keys, D)[None]
  x = np.zeros((1, T), np.int32)
  _, st = slot_memory(k, k, pad_v, x, n_slots=HAND["N"], top_k=HAND["top_k"], return_state=True,
                      merge_ids_BT=np.array([[2, 1, 2, 3, 4]], np.int32))
  # t0 id 2 -> slot 0; t1 id 1 -> slot 1 (cos 1, not merged); t2 id 2 merges into slot 0; t3 id 3 -> slot 2;
  # t4 id 4: memory full, evicts the oldest (slot 1, last written at t1)
  np.testing.assert_array_equal(st.key_ids[0], [2, 4, 3])
  np.testing.assert_allclose(st.keys[0, 0, :2], [0.5, 0.5], atol=1e-6)
  np.testing.assert_allclose(st.values[0, 0], [2.0, 1.5], atol=1e-6)
  np.testing.assert_allclose(st.keys[0, 1, :3], e[2][:3])
  _, st = slot_memory(k, k, pad_v, x, n_slots=HAND["N"], top_k=HAND["top_k"], return_state=True)
  np.testing.assert_array_equal(st.used[0], [True, True, True])   # cosine: e0 twice merges, e1 twice merges
  np.testing.assert_allclose(st.values[0, 0], [0.5, 0.5], atol=1e-6)
  np.testing.assert_array_equal(st.key_ids[0], [-1, -1, -1])     # untouched without merge ids
  for bad, match in ((np.ones((1, T), np.float32), "integer"), (np.full((1, T), -1, np.int32), "non-negative"),
                     (np.ones((1, T + 1), np.int32), r"shape \[B, T\]")):
    with pytest.raises(ValueError, match="merge_ids_BT"):
      slot_memory(k, k, pad_v, x, n_slots=HAND["N"], top_k=HAND["top_k"], merge_ids_BT=bad)
    with pytest.raises(ValueError, match=match):
      slot_memory(k, k, pad_v, x, n_slots=HAND["N"], top_k=HAND["top_k"], merge_ids_BT=bad)


def test_fill_then_evict_the_oldest():
  out, st = run(EYE[:5])
  # tokens 0, 1, 2 fill slots 0, 1, 2; token 3 evicts slot 0 (oldest), token 4 slot 1
  np.testing.assert_array_equal(st.ids[0], [3, 4, 2])
  np.testing.assert_array_equal(st.age[0], [1, 0, 2])
  np.testing.assert_array_equal(out.ids[0, 3], [0, 1, 2])  # the read at t=3 precedes its write
  np.testing.assert_array_equal(out.ids[0, :2], [[-1, -1, -1], [0, -1, -1]])
  # a merge refreshes a slot's age, so the next eviction takes another one
  _, st = run([EYE[0], EYE[1], EYE[2], EYE[0], EYE[3]])
  np.testing.assert_array_equal(st.ids[0], [3, 4, 2])  # token 3 merged into slot 0, 4 evicted slot 1


def test_eviction_tie_takes_the_lowest_index():
  state = hand_state(EYE[:3], ages=[3, 5, 5])
  _, st = run([[1.0, 1.0, 1.0]] * 5, ids=[4] * 5, gate=[1.0, 0, 0, 0, 0], initial_state=state)
  np.testing.assert_array_equal(st.ids[0], [0, 4, 2])
  np.testing.assert_array_equal(st.age[0], [8, 4, 10])


def test_read_keeps_the_top_k_used_slots():
  qv = np.array([1.0, 0.5, -1.0, 0.0, 0.0, 0.0])
  queries = [EYE[0], EYE[0], EYE[0], qv.tolist(), EYE[0]]
  out, _ = run(EYE[:3] + [EYE[0], EYE[0]], queries=queries)
  np.testing.assert_array_equal(out.weights[0, 0], [0, 0, 0])  # empty
  np.testing.assert_allclose(out.weights[0, 1], [1, 0, 0])  # fewer used slots than top_k
  cos = qv[:3] / math.sqrt(qv @ qv + EPS) / math.sqrt(1 + EPS)
  score = cos / math.sqrt(HAND["D"])  # log(strength 1) = 0
  e = np.exp(8 * (score[:2] - score[:2].max()))
  np.testing.assert_allclose(out.weights[0, 3], np.r_[e / e.sum(), 0.0], rtol=1e-5, atol=1e-7)
  # equal scores: the lower indices are kept
  same = hand_state([EYE[0]] * 3, ages=[0, 1, 2])
  out, _ = run([EYE[5]] * 5, queries=[EYE[0]] * 5, initial_state=same)
  np.testing.assert_allclose(out.weights[0, 0], [0.5, 0.5, 0.0], atol=1e-6)
  # log(strength) enters the score: orthogonal query, strengths (1, e, 1) keep slots 1 and 0
  strong = hand_state(EYE[:3], ages=[0, 1, 2], strength=(1.0, math.e, 1.0))
  out, _ = run([EYE[5]] * 5, queries=[EYE[4]] * 5, initial_state=strong)
  w1 = 1 / (1 + math.exp(-8.0))
  np.testing.assert_allclose(out.weights[0, 0], [1 - w1, w1, 0.0], rtol=1e-5)


pointer = jax.jit(pointer_logits, static_argnums=2)


def test_pointer_puts_the_weights_on_the_slot_ids():
  w = np.float32([[0.5, 0.2, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0]])
  ids = np.int32([[2, 5, 2, -1], [0, 1, 2, -1]])
  np.testing.assert_allclose(pointer(w, ids, 6),
                             [[0, 0, 0.8, 0, 0, 0.2], [0, 0, 0, 0, 0, 0]], atol=1e-7)
  # through slot_memory: slots 0 and 2 are read, both hold id 4, and their weights add up
  out, _ = run(EYE[:3] + [EYE[3]] * 2, ids=[4, 1, 4, 0, 0], queries=[EYE[0]] * 3 + [[1.0, 0.0, 1.0]] * 2)
  np.testing.assert_allclose(out.weights[0, 3], [0.5, 0.0, 0.5], atol=1e-6)
  np.testing.assert_allclose(out.pointer[0, 3], [0, 0, 0, 0, 1.0], atol=1e-6)
  np.testing.assert_allclose(out.pointer[0, 1], [0, 0, 0, 0, 1.0], atol=1e-6)  # one slot, id 4
  np.testing.assert_array_equal(out.pointer[0, 0], np.zeros(5))


def test_zero_write_gate_writes_nothing_but_ages():
  gate = [1.0, 0.0, 1.0, 0.0, 0.0]
  _, st = run(EYE[:5], gate=gate)
  np.testing.assert_array_equal(st.used[0], [True, True, False])
  np.testing.assert_array_equal(st.ids[0], [0, 2, -1])
  np.testing.assert_array_equal(st.age[0], [4, 2, 0])
  _, st_bool = run(EYE[:5], gate=[g > 0 for g in gate])
  for a, b in zip(st, st_bool, strict=True):
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------
# Empty memory, the step API, jit and vmap.
# --------------------------------------------------------------------------------------


@jax.jit
def read_grad(state, q):
  return jax.grad(lambda q: jnp.sum(slots.read(state, q, top_k=STD["top_k"])[0]))(q)


def test_empty_memory_reads_zero_with_finite_gradients():
  B, N, D, V, T = STD["B"], STD["N"], STD["D"], STD["V"], STD["T"]
  state = slots.init(B, N, D, V)
  context, w = slots.read(state, np.ones((B, D), np.float32), top_k=STD["top_k"])
  assert not np.any(context) and not np.any(w)
  g = read_grad(state, np.ones((B, D), np.float32))
  assert np.all(np.isfinite(g))
  # a whole sequence of zero vectors, starting from the empty read: the value and the gradient of
  # sum(context) + sum(pointer)
  z, zv, x = np.zeros((B, T, D), np.float32), np.zeros((B, T, V), np.float32), np.zeros((B, T), np.int32)
  cot = std_cotangent(context=np.ones((B, T, V)), pointer=np.ones((B, T, STD["vocab"])))
  (context, pointer_BTZ, _, _), grads = std_vjp(z, z, zv, x, np.full((B, T), 0.5, np.float32), cot)
  assert np.isfinite(np.sum(context) + np.sum(pointer_BTZ))
  for g in grads:
    assert np.all(np.isfinite(g))


def test_step_api_equals_the_scan():
  q, k, v, x, gate = std_case(9)
  q, k, v, g = f32(q, k, v, gate)
  x = np.asarray(x, np.int32)
  out, final = jax.tree.map(np.asarray, std_memory(q, k, v, x, g, return_state=True))
  state = slots.init(STD["B"], STD["N"], STD["D"], STD["V"])
  for t in range(STD["T"]):
    state, (context, w) = slots.step(state, q[:, t], k[:, t], v[:, t], x[:, t], gate_B=g[:, t],
                                     top_k=STD["top_k"])
    np.testing.assert_allclose(context, out.context[:, t], atol=1e-6)
    np.testing.assert_allclose(w, out.weights[:, t], atol=1e-6)
    np.testing.assert_allclose(pointer(w, out.ids[:, t], STD["vocab"]), out.pointer[:, t], atol=1e-6)
  for a, b in zip(state, final, strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_a_sequence_in_two_pieces_from_the_returned_state_equals_one_run():
  """What decoding relies on (UniMatrixLM.scan): the state after a piece, merge ids included, resumes it."""
  q, k, v, x, gate = std_case(4)
  q, k, v, g = f32(q, k, v, gate)
  x = np.asarray(x, np.int32)
  m = (x + 1) % 3                      # merge ids that repeat, so that merges by id happen across the cut
  whole, final = jax.tree.map(np.asarray, std_memory(q, k, v, x, g, return_state=True, merge_ids_BT=m))
  cut = 5
  first, state = std_memory(q[:, :cut], k[:, :cut], v[:, :cut], x[:, :cut], g[:, :cut], return_state=True,
                            merge_ids_BT=m[:, :cut])
  rest, state = std_memory(q[:, cut:], k[:, cut:], v[:, cut:], x[:, cut:], g[:, cut:], return_state=True,
                           merge_ids_BT=m[:, cut:], initial_state=state)
  for field in ("context", "weights", "ids", "pointer"):
    joined = np.concatenate([np.asarray(getattr(first, field)), np.asarray(getattr(rest, field))], axis=1)
    np.testing.assert_allclose(joined, getattr(whole, field), atol=1e-6, err_msg=field)
  for a, b in zip(state, final, strict=True):
    np.testing.assert_allclose(np.asarray(a), b, atol=1e-6)
  assert (np.asarray(state.key_ids) >= 0).any()


def test_packed_rows_equal_each_segment_alone():
  # slot_memory(..., segment_ids): the memory empties at each segment, a padding token neither reads nor
  # writes nor ages the slots; context and pointer, values and gradients (queries, keys, values, write
  # gate), equal each document run alone (tests/kernels/packed.py; merges, fills and evictions with 2 slots)
  from tests.kernels.packed import check_packed_equals_alone
  rng = np.random.default_rng(3)
  q, k, v = (rng.normal(size=(2, 9, 4)).astype(np.float32) for _ in range(3))
  k[:, 1::2] = k[:, ::2][:, :4] + 0.01  # near-repeats: merges
  gate = rng.uniform(0.3, 1.0, (2, 9)).astype(np.float32)

  def fn(q, k, v, gate, segment_ids=None):
    ids = jnp.argmax(v, axis=-1).astype(jnp.int32)
    out = slot_memory(q, k, v, ids, n_slots=2, top_k=2, write_gate_BT=gate, vocab_size=4, threshold=0.9,
                      segment_ids=segment_ids, merge_ids_BT=None)
    return jnp.concatenate([out.context, out.pointer], axis=-1)

  check_packed_equals_alone(fn, (q, k, v, gate), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"`segment_ids` must have shape \[B, T\] = \(2, 9\)"):
    fn(q, k, v, gate, segment_ids=np.ones((2, 8), np.int32))


vmapped_std_memory = jax.jit(jax.vmap(std_memory))


def test_jit_and_vmap():
  cases = [f32(q, k, v) + [np.asarray(x, np.int32), np.asarray(g, np.float32)]
           for q, k, v, x, g in (std_case(11), std_case(12))]
  stacked = [np.stack(parts) for parts in zip(*cases, strict=True)]  # a leading "heads" axis
  f = vmapped_std_memory
  mapped = f(*stacked)
  for h, case in enumerate(cases):
    eager = std_memory(*case)
    for a, b in zip(mapped, eager, strict=True):
      np.testing.assert_allclose(np.asarray(a)[h], b, atol=1e-6)
  with chex_traces(f):
    f(*stacked)


class chex_traces:
  """Fails if calling a jitted function again retraces it (a cache miss would be a bug)."""

  def __init__(self, f):
    self.f = f

  def __enter__(self):
    self.before = self.f._cache_size()

  def __exit__(self, *exc):
    assert self.f._cache_size() == self.before


def test_bad_input_raises():
  f32z = lambda *shape: np.zeros(shape, np.float32)  # numpy inputs: the checks run before any JAX program
  i32z = lambda *shape: np.zeros(shape, np.int32)
  q, x = f32z(2, 5, 3), i32z(2, 5)
  v = f32z(2, 5, 4)
  with_id = lambda value, **kw: dict(ids_BT=np.where(np.arange(5) == 1, value, x).astype(np.int32), **kw)
  ok = dict(n_slots=4)
  cases = [
      (dict(queries_BTD=q[0]), "`queries_BTD` must have rank 3"),
      (dict(keys_BTD=f32z(2, 5, 2)), "mismatched key widths"),
      (dict(values_BTV=f32z(3, 5, 4)), "mismatched batch sizes"),
      (dict(ids_BT=i32z(2, 6)), "mismatched sequence lengths"),
      (dict(ids_BT=x.astype(np.float32)), "`ids_BT` must hold integer"),
      (with_id(-2), "`ids_BT` must be non-negative"),
      (with_id(7, vocab_size=7), r"`ids_BT` must lie in \[0, vocab_size=7\)"),
      (dict(queries_BTD=q.astype(np.int32)), "`queries_BTD` must be floating"),
      (dict(n_slots=0), "`n_slots` must be a positive integer"),
      (dict(write_gate_BT=np.full((2, 5), 5.0, np.float32)), r"`write_gate_BT` must lie in \[0, 1\]"),
      (dict(top_k=0), "`top_k` must be a positive integer"),
      (dict(top_k=5), "`top_k` must be at most `n_slots`"),
      (dict(threshold=1.5), r"`threshold` must lie in \[-1, 1\]"),
      (dict(threshold=float("nan")), "`threshold` must be a finite number"),
      (dict(temperature=0.0), "`temperature` must be a finite positive"),
      (dict(temperature=float("inf")), "`temperature` must be a finite positive"),
      (dict(vocab_size=0), "`vocab_size` must be a positive integer"),
      (dict(write_gate_BT=np.ones((2, 4), np.float32)), "`write_gate_BT` must have shape"),
      (dict(write_gate_BT=np.ones((2, 5), np.int32)), "`write_gate_BT` must be boolean or floating"),
      (dict(initial_state=slots.init(2, 3, 3, 4)), "mismatched n_slots"),
      (dict(initial_state=slots.init(2, 4, 3, 5)), "mismatched d_value"),
  ]
  for override, match in cases:
    kw = dict(queries_BTD=q, keys_BTD=q, values_BTV=v, ids_BT=x, **ok)
    kw.update(override)
    with pytest.raises(ValueError, match=match):
      slot_memory(**kw)
  state = slots.init(2, 4, 3, 4)
  with pytest.raises(ValueError, match="mismatched key widths"):
    slots.read(state, f32z(2, 2))
  with pytest.raises(ValueError, match="`query_BD` must have rank 2"):
    slots.read(state, f32z(3))
  with pytest.raises(ValueError, match="`top_k` must be at most"):
    slots.read(state, f32z(2, 3), top_k=5)
  with pytest.raises(ValueError, match="mismatched value widths"):
    slots.write(state, f32z(2, 3), f32z(2, 2), i32z(2))
  with pytest.raises(ValueError, match="`id_B` must be non-negative"):
    slots.write(state, f32z(2, 3), f32z(2, 4), np.full((2,), -1, np.int32))
  with pytest.raises(ValueError, match="`gate_B` must have shape"):
    slots.write(state, f32z(2, 3), f32z(2, 4), i32z(2), gate_B=np.ones(3, np.float32))
  with pytest.raises(ValueError, match="`state.age` must have shape"):
    slots.read(state._replace(age=i32z(2, 3)), f32z(2, 3))
  with pytest.raises(ValueError, match="`state` must be a SlotState"):
    slots.read(tuple(state), f32z(2, 3))
  with pytest.raises(ValueError, match="`ids_BN` must have the shape"):
    pointer_logits(f32z(2, 4), i32z(2, 3), 5)
  with pytest.raises(ValueError, match="`vocab_size` must be a positive integer"):
    pointer_logits(f32z(2, 4), i32z(2, 4), 0)
  with pytest.raises(ValueError, match="`n_slots` must be a positive integer"):
    slots.init(2, 0, 3, 4)


def test_cos_scale_weights_the_cosine_against_log_strength():
  """score = s · cos + log(strength): checked by hand on two used slots (one merged twice)."""
  D, e = HAND["D"], EYE
  # writes: key e0 (id 3) three times (merged, strengths accumulated: 3), key e1 (id 4) once; then read
  # with query e1
  keys = [e[0], e[0], e[0], e[1], e[1]]
  values = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)
  for scale in (None, 0.5, 8.0):
    r, _ = run(keys, values=values, ids=[3, 3, 3, 4, 0], queries=[e[1]] * 5, cos_scale=scale,
               strength_update="accumulate")
    s = 1 / np.sqrt(D) if scale is None else scale
    score = np.array([s * 0.0 + np.log(3.0), s * 1.0 + np.log(1.0)])   # cos(e1, e0) = 0, cos(e1, e1) = 1
    w = np.exp(8 * (score - score.max()))  # HAND's temperature: the default 8
    w /= w.sum()
    np.testing.assert_allclose(np.asarray(r.pointer)[0, 4, [3, 4]], w, rtol=1e-4)
  with pytest.raises(ValueError, match="cos_scale"):
    run(keys, cos_scale=0.0)


def test_a_slot_written_once_is_out_of_reach_when_strengths_accumulate_and_first_with_gate():
  """The paper's score cos/√D + log(strength), D = 6, K = 2 of 3 slots. Writes: the answer key a
  once, then fillers f0 and f1 twice each (merged). With accumulated strengths (2 for the fillers)
  no query can keep the answer slot: against an orthogonal filler a query gains at most
  (cos(q, a) − cos(q, f)) / √D ≤ √2/√6 = 0.58 < log 2 = 0.69. Checked with q = a and with the best
  query against f0, (a − f0)/√2. With strength = the last gate (1 each) q = a reads the answer
  slot first: weight e^{8/√6} / (e^{8/√6} + 1) = 0.963 over the kept pair."""
  D, e = HAND["D"], np.eye(HAND["D"], dtype=np.float32)
  a, f0, f1 = e[0], e[1], e[2]
  keys = np.stack([a, f0, f0, f1, f1, a])[None]
  gate = np.array([[1, 1, 1, 1, 1, 0]], np.float32)      # the last token only reads
  ids = np.array([[1, 2, 2, 3, 3, 0]], np.int32)
  best_vs_f0 = (a - f0) / np.sqrt(2.0)
  for strength_update, want in (("accumulate", [1.0, 2.0, 2.0]), ("gate", [1.0, 1.0, 1.0])):
    for q_last in (a, best_vs_f0):
      q = keys.copy()
      q[0, -1] = q_last
      r, final = slot_memory(q, keys, np.ones((1, 6, 2), np.float32), ids, n_slots=3, top_k=2,
                             write_gate_BT=gate, vocab_size=4, return_state=True,
                             strength_update=strength_update)
      answer_weight = float(np.asarray(r.pointer)[0, -1, 1])
      np.testing.assert_allclose(np.asarray(final.strength)[0], want)
      if strength_update == "accumulate":
        assert answer_weight == 0.0, (strength_update, q_last, answer_weight)
      elif q_last is a:
        np.testing.assert_allclose(answer_weight, 1 / (1 + np.exp(-8 / np.sqrt(D))), rtol=1e-5)
  one = slots.init(1, 2, D, 2)
  one = slots.write(one, e[:1], np.ones((1, 2), np.float32), np.array([1]), strength_update="gate")
  one = slots.write(one, e[:1], np.ones((1, 2), np.float32), np.array([1]), gate_B=np.array([0.5]),
                    strength_update="gate")
  np.testing.assert_allclose(np.asarray(one.strength)[0], [0.5, 0.0])   # merged: the last gate
  with pytest.raises(ValueError, match="strength_update"):
    slot_memory(keys, keys, np.ones((1, 6, 2), np.float32), ids, n_slots=3, top_k=2, strength_update="sum")
