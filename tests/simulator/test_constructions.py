"""The paper's exact building blocks (transpose, matmul, softmax, ReLU, MaxMin, det3, inv3) as AHAT
programs, against jnp on odd shapes.

Each shape is a separate program (and XLA compilation), so each construction runs on a few
canonical awkward shapes: a wide matrix (3×5), a tall one (5×2), a single row (1×6, shared with
the vector form), a single entry (1×1, transpose), a square one (transpose, the ties); for the
product the generic chain 3×5·5×2, a dot product (1×4·4×1) and an outer product (2×1·1×6).

Every program is also held to U's structure check (``tests/simulator/structure.py``: AHAT and the
restricted position-wise kinds only, every sum an AHAT aggregation); building a program compiles
nothing, so that check covers more shapes (1×1 everywhere) than the value tests.

Tolerances, from float32 (u ≈ 6e-8): an entry of a product, softmax or 3×3 inverse here is at most ~10
roundings (a product per term, a mean over ≤ 5 terms times its count, exp, a reciprocal), each relative to a
sum of |terms| of the order of the random N(0, 1) entries; rtol 1e-5 leaves a factor > 10 over that for
cancellation (atol scaled by the largest output catches entries near 0), and the reference rounds as much.
Copies (transpose, MaxMin's selections, ReLU) are compared bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.simulator import constructions as C
from tests.simulator.structure import assert_attention_does_the_work

SHAPES = [(3, 5), (5, 2), (1, 1)]
ROW_SHAPES = [(3, 5), (5, 2), (1, 6)]   # row-wise programs; (1, 6) is also the vector tests' program
_softmax = jax.jit(lambda a: jax.nn.softmax(a, axis=-1))   # the reference: one compilation per shape


def rand(shape, seed=0, scale=1.0):
  return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def kinds(prog):
  return [(i.kind, i.num_heads) for i in prog.infos]


def test_every_construction_is_attention_and_restricted_layers_only():
  programs = {"transpose": [C.transpose_program(r, c) for r, c in ((1, 1), (3, 5), (5, 2), (3, 3))],
              "matmul": [C.matmul_program(*s) for s in ((1, 1, 1), (3, 5, 2), (1, 4, 1), (2, 1, 6))],
              "maxmin": [C.maxmin_program(r, c) for r, c in ((1, 1), (3, 5), (5, 2), (1, 6))],
              "softmax": [C.softmax_program(r, c) for r, c in ((1, 1), (3, 5), (5, 2), (1, 6))],
              "relu": [C.relu_program(n) for n in (1, 15)], "det_inv3": [C.det_inv3_program()]}
  heads = {"transpose": 1, "matmul": 3, "maxmin": 4, "softmax": 3, "relu": 0, "det_inv3": 6}
  for name, progs in programs.items():
    for prog in progs:
      assert_attention_does_the_work(prog)
      assert prog.num_heads == heads[name], name   # independent of the shape
      assert {i.kind for i in prog.infos} <= {"ahat", "linear", "product", "unary"}, name


@pytest.mark.parametrize("shape", SHAPES + [(3, 3)])
@pytest.mark.slow
def test_transpose(shape):
  A = rand(shape)
  np.testing.assert_array_equal(C.transpose(A), A.T)  # a copy: bit-exact
  assert kinds(C.transpose_program(*shape)) == [("ahat", 1)]


@pytest.mark.parametrize("r,m,c", [(3, 5, 2), (1, 4, 1), (2, 1, 6)])
@pytest.mark.slow
def test_matmul(r, m, c):
  A, B = rand((r, m), 1), rand((m, c), 2)
  ref = jnp.matmul(A, B, precision="highest")
  np.testing.assert_allclose(C.matmul(A, B), ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
  assert kinds(C.matmul_program(r, m, c)) == [("ahat", 2), ("product", 0), ("ahat", 1)]


def test_matmul_integers_exact():
  A = np.arange(-6, 9, dtype=np.float32).reshape(3, 5)
  B = np.arange(10, dtype=np.float32).reshape(5, 2) - 4
  np.testing.assert_array_equal(C.matmul(A, B), A @ B)


@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("scale", [1.0, 100.0])
@pytest.mark.slow
def test_softmax(shape, scale):
  A = rand(shape, 3, scale)
  ref = _softmax(A)
  got = C.softmax(A)
  assert np.all(np.isfinite(np.asarray(got)))
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
  assert kinds(C.softmax_program(*shape)) == [("ahat", 1), ("unary", 0), ("linear", 0), ("product", 0),
                                              ("ahat", 1), ("linear", 0), ("unary", 0), ("ahat", 1),
                                              ("unary", 0), ("product", 0)]


def test_softmax_vector():
  a = rand(6, 4)   # the (1, 6) program
  np.testing.assert_allclose(C.softmax(a), _softmax(a), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_maxmin(shape):
  A = rand(shape, 5)
  mx, mn = C.maxmin(A)
  np.testing.assert_array_equal(mx, A.max(axis=1))
  np.testing.assert_array_equal(mn, A.min(axis=1))
  assert kinds(C.maxmin_program(*shape)) == [("ahat", 2), ("unary", 0), ("linear", 0), ("product", 0),
                                             ("ahat", 2)]


def test_maxmin_ties_and_rows_at_the_global_extremes():
  # row 1 is all the global min, row 2's max equals the global min of another row, row 3 is all the global
  # max: the keys outside a row are a bound strictly below (above) every entry, and a row's tied extremes
  # average back to themselves
  A = np.array([[3, -2, 3, 0], [-5, -5, -5, -5], [-5, -7, -9, -5], [9, 9, 9, 9]], np.float32)
  mx, mn = C.maxmin(A)
  np.testing.assert_array_equal(mx, [3, -5, -5, 9])
  np.testing.assert_array_equal(mn, [-2, -5, -9, 9])
  v_max, v_min = C.maxmin(np.array([0.5, -1.5, 2.25, 0.0, 2.0, -1.25], np.float32))  # the (1, 6) program
  assert float(v_max) == 2.25 and float(v_min) == -1.5


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
def test_relu(shape):
  A = rand(shape, 6)
  np.testing.assert_array_equal(C.relu(A), np.maximum(A, 0))
  assert kinds(C.relu_program(A.size)) == [("unary", 0)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_det3_inv3(seed):
  A = rand((3, 3), 10 + seed)
  np.testing.assert_allclose(C.det3(A), jnp.linalg.det(A), rtol=1e-5)
  ref = jnp.linalg.inv(A)
  np.testing.assert_allclose(C.inv3(A), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
  assert kinds(C.det_inv3_program()) == [("ahat", 4), ("product", 0), ("linear", 0), ("product", 0),
                                         ("ahat", 2), ("unary", 0), ("product", 0)]


def test_det3_inv3_integer_matrix():
  A = np.array([[2, 3, 1], [1, 2, 1], [1, 1, 1]], np.float32)  # det 1: integer inverse
  assert float(C.det3(A)) == 1.0
  np.testing.assert_allclose(C.inv3(A), np.linalg.inv(A.astype(np.float64)), atol=1e-6)
  assert float(C.det3(np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], np.float32))) == 0.0


def test_bad_inputs():
  with pytest.raises(ValueError, match="`A` must have rank 2"):
    C.transpose(np.zeros(3))
  with pytest.raises(ValueError, match="chain"):
    C.matmul(np.zeros((2, 3)), np.zeros((4, 2)))
  with pytest.raises(ValueError, match="`B` must have rank 2"):
    C.matmul(np.zeros((2, 3)), np.zeros(3))
  with pytest.raises(ValueError, match="3x3"):
    C.det3(np.zeros((4, 4)))
  with pytest.raises(ValueError, match="3x3"):
    C.inv3(np.zeros((3, 2)))
  with pytest.raises(ValueError, match="`A` holds non-finite"):
    C.softmax(np.array([[1.0, np.nan]]))
  with pytest.raises(ValueError, match="`A` holds non-finite"):
    C.maxmin(np.array([1.0, np.inf]))
  with pytest.raises(ValueError, match="`A` must not be empty"):
    C.relu(np.zeros((2, 0)))
