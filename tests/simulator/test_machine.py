"""The residual-stream machine: layers' reads/writes come from the weights, slots are written once, padding is
invisible, and only the four kinds of layer exist; the restricted position-wise kinds (linear, product, unary)
compute exactly what their data says."""

import dataclasses
from typing import Callable

import numpy as np
import pytest

from jaxmem.machine import (
  AHATLayer,
  AttentionWeights,
  Layout,
  LinearLayer,
  LinearWeights,
  ProductLayer,
  Program,
  UnaryLayer,
)


def small_layout():
  L = Layout()
  L.add("a", 1, "input value", is_input=True)
  L.add("one", 1, "constant 1", is_input=True)
  L.add("m", 1, "the max of a")
  L.add("y", 1, "a - max")
  return L


def max_program(L):
  w = AttentionWeights(L, num_heads=1, key_dim=1, value_dim=1)
  w.query(0, "one", [[1.0]])
  w.key(0, "a", [[1.0]])
  w.value(0, "a", [[1.0]])
  w.output(0, "m", [[1.0]])
  sub = LinearWeights(L)
  sub.add("y", "a", 1.0)
  sub.add("y", "m", -1.0)
  layers = [AHATLayer("max", 1, 1, 1, "argmax of a, mean of a"), LinearLayer("sub", "a - m")]
  return Program(L, layers, {"max": w, "sub": sub})


def test_program_runs_and_describes_itself():
  L = small_layout()
  prog = max_program(L)
  a = np.array([[1.5], [-2.0], [4.0], [4.0]], np.float32)
  out = prog.run(prog.encode(4, {"a": a, "one": np.ones((4, 1))}))
  np.testing.assert_array_equal(prog.read(out, "m")[:, 0], [4.0] * 4)
  np.testing.assert_array_equal(prog.read(out, "y")[:, 0], a[:, 0] - 4.0)
  info = prog.infos[0]
  assert (info.kind, info.num_heads, info.reads, info.writes) == ("ahat", 1, ("a", "one"), ("m",))
  assert prog.num_heads == 1 and prog.num_params == 3 * 4 + 4 + 2 and prog.num_nonzero == 4 + 2   # sub: 2 terms
  assert "| 1 | `max` | AHAT (fixed weights) | 1 |" in prog.describe()
  assert "| `a` | 0..0 | 1 | yes |" in L.table()


def test_padding_is_invisible():
  prog = max_program(small_layout())
  a = np.array([[1.0], [3.0], [9.0]], np.float32)  # the 9 is padding
  seq = prog.encode(3, {"a": a, "one": np.ones((3, 1))})
  out = prog.run(seq, mask=np.array([True, True, False]))
  np.testing.assert_array_equal(prog.read(out, "m")[:, 0], [3.0, 3.0, 0.0])


def test_program_rejects_bad_structure():
  L = small_layout()
  with pytest.raises(ValueError, match="already input or written"):
    Program(L, [UnaryLayer("bad", "relu", (("a", "one"),), "")], {})
  with pytest.raises(ValueError, match="before any layer writes them"):
    Program(L, [UnaryLayer("early", "relu", (("y", "m"),), "")], {})
  twice = [UnaryLayer(n, "relu", (("m", "a"),), "") for n in ("p", "q")]
  with pytest.raises(ValueError, match="already input or written"):
    Program(L, twice, {})
  Program(L, twice, {}, single_assignment=False)   # a compiled RASP model adds to a slot twice
  with pytest.raises(ValueError, match="before any layer writes them"):
    Program(L, [UnaryLayer("early", "relu", (("y", "m"),), "")], {}, single_assignment=False)
  with pytest.raises(ValueError, match="does not fit"):
    AttentionWeights(L, 1, 1, 1).query(0, "a", np.eye(2))
  with pytest.raises(ValueError, match="defined twice"):
    L.add("a", 1, "again")


def test_program_admits_only_the_four_kinds():
  """A free-form map of a position (what the constructions used before they were held to U's accounting) can
  compute anything of that position, sums included: the machine has no such layer and refuses one."""

  @dataclasses.dataclass(frozen=True)
  class FreeMap:
    name: str
    fn: Callable
    reads: tuple
    writes: tuple

  L = small_layout()
  with pytest.raises(TypeError, match="not a layer"):
    Program(L, [FreeMap("sneaky", lambda v: {"m": v["a"] + v["one"]}, ("a", "one"), ("m",))], {})


def test_restricted_positionwise_layers():
  L = Layout()
  L.add("u", 3, "input vector", is_input=True)
  L.add("c", 1, "input scalar", is_input=True)
  L.add("lin", 3, "2·u − c")
  L.add("prod", 3, "lin · u")
  L.add("scaled", 3, "c · u (a size-1 operand is broadcast)")
  L.add("e", 3, "exp(prod)")
  L.add("r", 3, "1 / e")
  L.add("y", 3, "relu(lin)")
  lw = LinearWeights(L)
  lw.add("lin", "u", 2.0)
  lw.add("lin", "c", -1.0)
  layers = [LinearLayer("affine", "2·u − c"),
            ProductLayer("mul", (("prod", "lin", "u"), ("scaled", "c", "u")), "lin·u, c·u"),
            UnaryLayer("exp", "exp", (("e", "prod"),), "exp"),
            UnaryLayer("inv", "reciprocal", (("r", "e"),), "1/e"),
            UnaryLayer("relu", "relu", (("y", "lin"),), "relu")]
  prog = Program(L, layers, {"affine": lw})
  u = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -3.0]], np.float32)
  c = np.array([[1.0], [-2.0]], np.float32)
  out = prog.run(prog.encode(2, {"u": u, "c": c}))
  lin = 2 * u - c
  np.testing.assert_array_equal(prog.read(out, "lin"), lin)
  np.testing.assert_array_equal(prog.read(out, "prod"), lin * u)
  np.testing.assert_array_equal(prog.read(out, "scaled"), c * u)
  np.testing.assert_allclose(prog.read(out, "e"), np.exp(lin * u), rtol=1e-6)
  np.testing.assert_allclose(prog.read(out, "r"), np.exp(-lin * u), rtol=1e-6)
  np.testing.assert_array_equal(prog.read(out, "y"), np.maximum(lin, 0))
  kinds = [(i.kind, i.op, i.reads, i.writes) for i in prog.infos]
  assert kinds == [("linear", "", ("u", "c"), ("lin",)), ("product", "", ("lin", "u", "c"), ("prod", "scaled")),
                   ("unary", "exp", ("prod",), ("e",)), ("unary", "reciprocal", ("e",), ("r",)),
                   ("unary", "relu", ("lin",), ("y",))]
  np.testing.assert_array_equal(prog.wiring["mul"]["b"], L["u"].start + np.array([0, 1, 2, 0, 1, 2]))
  np.testing.assert_array_equal(prog.wiring["mul"]["a"],
                                np.r_[L["lin"].start + np.arange(3), [L["c"].start] * 3])
  assert prog.num_params == prog.num_nonzero == 6   # the terms stored: 2·I (u) and a row of −1 (c)
  assert "| 3 | `exp` | exp |" in prog.describe() and "linear (fixed matrix)" in prog.describe()


def test_restricted_layers_reject_bad_wiring():
  L = Layout()
  L.add("u", 3, "input", is_input=True)
  L.add("v", 2, "input", is_input=True)
  L.add("w", 3, "output")
  with pytest.raises(ValueError, match="does not fit"):
    Program(L, [ProductLayer("p", (("w", "u", "v"),), "")], {})
  with pytest.raises(ValueError, match="does not fit"):
    LinearWeights(L).add("w", "v")
  with pytest.raises(ValueError, match="must name 3 slots"):
    Program(L, [ProductLayer("p", (("w", "u"),), "")], {})
  with pytest.raises(ValueError, match="writes a coordinate twice"):
    Program(L, [UnaryLayer("p", "exp", (("w", "u"), ("w", "u")), "")], {})
  with pytest.raises(ValueError, match="already input or written"):
    Program(L, [UnaryLayer("p", "relu", (("v", "v"),), "")], {})
  with pytest.raises(ValueError, match="`weights` has no entry for layer 'lin'"):
    Program(L, [LinearLayer("lin", "")], {})
  with pytest.raises(ValueError, match="must be LinearWeights"):
    Program(L, [LinearLayer("lin", "")], {"lin": AttentionWeights(L, 1, 1, 1)})
  with pytest.raises(ValueError, match="`op` must be one of"):
    UnaryLayer("p", "tanh", (("w", "u"),), "")


def test_linear_terms_and_blocks_are_the_matrix_they_store():
  """A linear layer stores slot-to-slot terms (coordinate entries) and dense blocks (rows gathered from
  anywhere, contiguous columns); it computes x + x M for M their sum, and stores only their entries."""
  L = Layout()
  L.add("one", 1, "1", is_input=True)
  L.add("u", 3, "input", is_input=True)
  L.add("h", 4, "a hidden layer")
  L.add("v", 3, "out")
  lw = LinearWeights(L)
  lw.add("v", "u", 0.5)
  lw.add("v", "one", -1.0)
  lw.add_entries([1], [L["v"].start], [2.0])   # adds to an entry `add` made: summed
  rng = np.random.default_rng(0)
  b0 = rng.standard_normal((4, 4)).astype(np.float32)
  b1 = rng.standard_normal((2, 3)).astype(np.float32)
  lw.add_block(np.r_[L.slice("u"), 0], L["h"].start, b0)   # gathered rows: u and one
  lw.add_block(np.r_[1, 3], L["v"].start, b1)              # overlaps the terms
  M = np.zeros((L.width, L.width), np.float32)
  M[L.slice("u"), L.slice("v")] += 0.5 * np.eye(3, dtype=np.float32)
  M[0, L.slice("v")] -= 1.0
  M[1, L["v"].start] += 2.0
  M[np.ix_(np.r_[L.slice("u"), 0], np.r_[L.slice("h")])] += b0
  M[np.ix_([1, 3], np.r_[L.slice("v")])] += b1
  prog = Program(L, [LinearLayer("lin", "terms and blocks")], {"lin": lw})
  x = np.concatenate([np.ones((5, 1)), rng.standard_normal((5, 3))], 1)
  out = np.asarray(prog.run(prog.encode(5, {"one": x[:, :1], "u": x[:, 1:]})))
  xs = np.concatenate([x, np.zeros((5, 7))], 1)
  np.testing.assert_allclose(out, xs + xs @ M.astype(np.float64), rtol=1e-6, atol=1e-6)
  rows, cols, vals = prog.linear_entries("lin")
  dense = np.zeros_like(M)
  dense[rows, cols] = vals
  np.testing.assert_allclose(dense, M, rtol=1e-6)
  assert prog.num_params == 3 + 3 + b0.size + b1.size   # v ← u and v ← one (the 2.0 joined one of them)
  assert prog.infos[0].reads == ("one", "u") and prog.infos[0].writes == ("h", "v")
  with pytest.raises(ValueError, match="`matrix` must have shape"):
    lw.add_block([0, 1], 0, np.ones((3, 1)))
  with pytest.raises(ValueError, match="`rows` must be distinct"):
    lw.add_block([1, 1], 0, np.ones((2, 1)))
  with pytest.raises(ValueError, match="lie outside the residual"):
    lw.add_block([1], L.width - 1, np.ones((1, 2)))
  with pytest.raises(ValueError, match="`name` must name a linear layer"):
    prog.linear_entries("relu")
  with pytest.raises(ValueError, match="must have one length"):
    lw.add_entries([0, 1], [2], [1.0, 1.0])
  with pytest.raises(ValueError, match="outside the residual"):
    lw.add_entries([L.width], [0], [1.0])


def test_an_attention_span_stores_only_its_coordinates():
  """An AHAT layer over a span of the residual computes what the same weights over the whole residual do."""
  L = small_layout()
  L.add("pad", 5, "a slot the layer does not touch")
  full = AttentionWeights(L, num_heads=1, key_dim=1, value_dim=1)
  part = AttentionWeights(L, num_heads=1, key_dim=1, value_dim=1, span=(0, 3))
  for w in (full, part):
    w.query(0, "one", [[1.0]])
    w.key(0, "a", [[1.0]])
    w.value(0, "a", [[1.0]])
    w.output(0, "m", [[1.0]])
  a = np.array([[1.5], [-2.0], [4.0]], np.float32)
  runs = []
  for w in (full, part):
    prog = Program(L, [AHATLayer("max", 1, 1, 1, "max of a")], {"max": w})
    runs.append(np.asarray(prog.run(prog.encode(3, {"a": a, "one": np.ones((3, 1))}))))
    assert prog.infos[0].reads == ("a", "one") and prog.infos[0].writes == ("m",)
  np.testing.assert_array_equal(runs[0], runs[1])
  assert part.wq.shape == (3, 1) and part.wo.shape == (1, 3) and full.wq.shape == (L.width, 1)
  with pytest.raises(ValueError, match="outside the layer's span"):
    part.value(0, "y", [[1.0]])
  with pytest.raises(ValueError, match="`span` must satisfy"):
    AttentionWeights(L, 1, 1, 1, span=(2, 2))


def test_a_blocks_bias_is_added_after_its_product_as_a_dense_layer_adds_it():
  """``add_block(..., bias, one)`` is ``M[one, cols] += bias`` computed as ``x[rows] @ m + x[one]·bias``,
  the float32 result of a dense layer's ``h @ W + b`` (a compiled RASP model's clean steps rest on that
  order). With ``h = (2²⁴, 1)``, ``W = (1, 1)ᵀ`` and ``b = −2²⁴``, ``h @ W`` rounds to 2²⁴ whatever the
  order of its two terms, so ``h @ W + b`` is exactly 0; the bias summed inside the product as a row of
  ``one`` gives 0 or 1 depending on the order of the three terms."""
  L = Layout()
  L.add("one", 1, "1", is_input=True)
  L.add("u", 2, "input", is_input=True)
  L.add("v", 1, "out")
  big = np.float32(2.0 ** 24)
  lw = LinearWeights(L)
  lw.add_block("u", L["v"].start, np.ones((2, 1), np.float32), bias=[-big], one="one")
  prog = Program(L, [LinearLayer("lin", "u1 + u2 - 2**24")], {"lin": lw})
  out = np.asarray(prog.run(prog.encode(1, {"one": np.ones((1, 1)), "u": np.asarray([[big, 1.0]])})))
  assert out[0, L["v"].start] == 0.0
  lw = LinearWeights(L)
  lw.add_block("u", L["v"].start, np.ones((2, 1), np.float32), bias=[3.0], one="one")
  prog = Program(L, [LinearLayer("lin", "u1 + u2 + 3")], {"lin": lw})
  rows, cols, vals = prog.linear_entries("lin")   # the bias is M's row `one`
  assert (rows.tolist(), cols.tolist(), vals.tolist()) == ([0, 1, 2], [3, 3, 3], [3.0, 1.0, 1.0])
  assert prog.num_params == 3 and prog.infos[0].reads == ("one", "u")
  with pytest.raises(ValueError, match="`bias` and `one` go together"):
    lw.add_block("u", L["v"].start, np.ones((2, 1)), bias=[1.0])
  with pytest.raises(ValueError, match="`bias` must have shape \\[1\\]"):
    lw.add_block("u", L["v"].start, np.ones((2, 1)), bias=[1.0, 2.0], one="one")
