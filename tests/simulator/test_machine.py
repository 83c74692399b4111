"""The residual-stream machine: layers' reads/writes come from the weights, slots are written once,
position-wise maps see one position and only the slots they declare, padding is invisible."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.simulator.machine import AHATLayer, AttentionWeights, Layout, PositionwiseLayer, Program


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
  layers = [AHATLayer("max", 1, 1, 1, "argmax of a, mean of a"),
            PositionwiseLayer("sub", lambda v: {"y": v["a"] - v["m"]}, ("a", "m"), ("y",), "a - m")]
  return Program(L, layers, {"max": w})


def test_program_runs_and_describes_itself():
  L = small_layout()
  prog = max_program(L)
  a = np.array([[1.5], [-2.0], [4.0], [4.0]], np.float32)
  out = prog.run(prog.encode(4, {"a": a, "one": np.ones((4, 1))}))
  np.testing.assert_array_equal(prog.read(out, "m")[:, 0], [4.0] * 4)
  np.testing.assert_array_equal(prog.read(out, "y")[:, 0], a[:, 0] - 4.0)
  info = prog.infos[0]
  assert (info.kind, info.num_heads, info.reads, info.writes) == ("ahat", 1, ("a", "one"), ("m",))
  assert prog.num_heads == 1 and prog.num_params == 3 * 4 + 4 and prog.num_nonzero == 4
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
    Program(L, [PositionwiseLayer("bad", lambda v: {"a": v["one"]}, ("one",), ("a",), "")], {})
  with pytest.raises(ValueError, match="before any layer writes them"):
    Program(L, [PositionwiseLayer("early", lambda v: {"y": v["m"]}, ("m",), ("y",), "")], {})
  twice = [PositionwiseLayer(n, lambda v: {"m": v["a"]}, ("a",), ("m",), "") for n in ("p", "q")]
  with pytest.raises(ValueError, match="already input or written"):
    Program(L, twice, {})
  with pytest.raises(ValueError, match="does not fit"):
    AttentionWeights(L, 1, 1, 1).query(0, "a", np.eye(2))
  with pytest.raises(ValueError, match="defined twice"):
    L.add("a", 1, "again")


def test_positionwise_map_cannot_read_undeclared_slots():
  L = small_layout()
  sneaky = PositionwiseLayer("sneaky", lambda v: {"m": v["a"] + v["one"]}, ("a",), ("m",), "")
  prog = Program(L, [sneaky], {})
  with pytest.raises(KeyError, match="did not declare"):
    prog.run(jnp.zeros((2, L.width)))
