"""The exact building blocks of the simulator paper as hand-built AHAT programs.

Dutta, Chakrabarty, Ansari & Das, "On the Existence of Universal Simulators of Attention"
(arXiv:2506.18739 v2), §4: transpose (Lemma 3), softmax (Lemma 4), matrix product (Lemma 5),
ReLU, MaxMin and the 3×3 determinant and inverse, each as a short stack of layers. Every
function here builds a :class:`~jaxmem.simulator.machine.Program` from the *shape* of its
input only (cached; ``*_program`` exposes it), lays the matrix out as a sequence — one entry
per position, with one-hot row/column *tags* as the positional encoding (a fixed function of
the position index, like RASP's ``indices``) — and runs it: AHAT layers are calls to
:func:`jaxmem.kernels.ahat.ahat_attention` with fixed ``W_Q, W_K, W_V, W_O``; position-wise
layers are named maps of one position's residual. These are jaxmem's own constructions
written from the paper's statements (not its proofs verbatim); each docstring lists its layers.

All selections are exact: every AHAT score is an integer (tag matches) or, in MaxMin, a data
value compared with itself, so the argmax set is exactly the intended set. Copying one
selected value is exact in float32; means over a row (softmax's sum, the determinant's
expansion) and the position-wise arithmetic round as float32 does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.simulator.machine import AHATLayer, AttentionWeights, Layout, PositionwiseLayer, Program
from jaxmem.simulator.reference import check_matrix

__all__ = [
    "det3", "det_inv3_program", "inv3", "matmul", "matmul_program", "maxmin", "maxmin_program", "relu",
    "relu_program", "softmax", "softmax_program", "transpose", "transpose_program",
]


def _onehot(idx: np.ndarray, n: int) -> np.ndarray:
  return np.eye(n, dtype=np.float32)[np.asarray(idx)]


def _grid_tags(r: int, c: int) -> tuple[np.ndarray, np.ndarray]:
  """Row and column one-hots of positions p = i·c + j of a row-major ``r × c`` matrix."""
  p = np.arange(r * c)
  return _onehot(p // c, r), _onehot(p % c, c)


# -- transpose (Lemma 3) ----------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def transpose_program(r: int, c: int) -> Program:
  """Lemma 3 for ``A [r, c]``: ONE AHAT layer with ONE head, no position-wise layer.

  Position ``p`` holds ``A[i, j]`` with ``(i, j) = divmod(p, c)`` (tags ``row``, ``col``) and
  outputs cell ``(a, b) = divmod(p, r)`` of ``Aᵀ [c, r]`` (tags ``out_row``, ``out_col``). The
  head's query is ``[out_col, out_row]``, its key ``[row, col]``: the bilinear score
  ``[b = i] + [a = j]`` is 2 at the single key ``(i, j) = (b, a)`` and at most 1 elsewhere,
  so query ``(a, b)`` copies ``A[b, a]`` (for a square matrix: query ``(i, j)`` selects key
  ``(j, i)``)."""
  L = Layout()
  L.add("a", 1, "A[i, j] at position p = i·c + j", is_input=True)
  L.add("row", r, "one-hot i = p // c", is_input=True)
  L.add("col", c, "one-hot j = p % c", is_input=True)
  L.add("out_row", c, "one-hot a = p // r (the cell (a, b) of Aᵀ this position outputs)", is_input=True)
  L.add("out_col", r, "one-hot b = p % r", is_input=True)
  L.add("t", 1, "Aᵀ[a, b] = A[b, a]")
  w = AttentionWeights(L, num_heads=1, key_dim=r + c, value_dim=1)
  w.query(0, "out_col", np.eye(r), key_start=0)
  w.query(0, "out_row", np.eye(c), key_start=r)
  w.key(0, "row", np.eye(r), key_start=0)
  w.key(0, "col", np.eye(c), key_start=r)
  w.value(0, "a", [[1.0]])
  w.output(0, "t", [[1.0]])
  layer = AHATLayer("transpose", 1, r + c, 1, "query (a, b) selects key (b, a) by the score [b=i] + [a=j] "
                    "on one-hot tags and copies its entry")
  return Program(L, [layer], {"transpose": w})


def transpose(A) -> jax.Array:
  """``Aᵀ`` by Lemma 3 (:func:`transpose_program`): one AHAT head over the flattened entries."""
  r, c = check_matrix("A", A)
  prog = transpose_program(r, c)
  row, col = _grid_tags(r, c)
  out_row, out_col = _grid_tags(c, r)
  seq = prog.encode(r * c, {"a": jnp.reshape(jnp.asarray(A, jnp.float32), (r * c, 1)), "row": row,
                            "col": col, "out_row": out_row, "out_col": out_col})
  return prog.read(prog.run(seq), "t").reshape(c, r)


# -- matrix product (Lemma 5) -----------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def matmul_program(r: int, m: int, c: int) -> Program:
  """Lemma 5 for ``A [r, m] @ B [m, c]``: one AHAT layer with ``2m`` heads, then one
  position-wise map.

  The sequence holds A's entries (``r·m`` positions, tags ``a_row``, ``a_col``), then B's
  (``m·c``, tags ``b_row``, ``b_col``), then the ``r·c`` output cells (``is_out``, tags
  ``o_row``, ``o_col``). Head ``k < m`` (query ``[o_row, is_out]``, key ``[a_row, a_col_k]``)
  scores ``[i = i'] + [k' = k]``: 2 only at ``A[i, k]``, so output cell ``(i, j)`` gathers row
  ``i`` of A one entry per head; head ``m + k`` (query ``[o_col, is_out]``, key
  ``[b_col, b_row_k]``) gathers column ``j`` of B. The map ``dot`` then forms
  ``C[i, j] = Σ_k A[i, k] B[k, j]``. Heads: ``2m`` of width 1 (the paper's bound is
  ``O(r·c)``; gathering by the inner index instead makes the count independent of ``r·c``).
  Positions other than the output cells compute unused values."""
  L = Layout()
  L.add("val", 1, "the entry A[i, k] or B[k, j] (zero at the output cells)", is_input=True)
  L.add("is_out", 1, "1 at the output cells", is_input=True)
  L.add("a_row", r, "one-hot i at A's entry (i, k)", is_input=True)
  L.add("a_col", m, "one-hot k at A's entry (i, k)", is_input=True)
  L.add("b_row", m, "one-hot k at B's entry (k, j)", is_input=True)
  L.add("b_col", c, "one-hot j at B's entry (k, j)", is_input=True)
  L.add("o_row", r, "one-hot i at output cell (i, j)", is_input=True)
  L.add("o_col", c, "one-hot j at output cell (i, j)", is_input=True)
  L.add("ga", m, "row i of A gathered at output cell (i, j)")
  L.add("gb", m, "column j of B gathered at output cell (i, j)")
  L.add("c", 1, "C[i, j] = Σ_k A[i, k] B[k, j]")
  dk = max(r, c) + 1
  w = AttentionWeights(L, num_heads=2 * m, key_dim=dk, value_dim=1)
  for k in range(m):
    w.query(k, "o_row", np.eye(r))
    w.query(k, "is_out", [[1.0]], key_start=dk - 1)
    w.key(k, "a_row", np.eye(r))
    w.key(k, "a_col", [[1.0]], key_start=dk - 1, slot_start=k)
    w.value(k, "val", [[1.0]])
    w.output(k, "ga", [[1.0]], slot_start=k)
    h = m + k
    w.query(h, "o_col", np.eye(c))
    w.query(h, "is_out", [[1.0]], key_start=dk - 1)
    w.key(h, "b_col", np.eye(c))
    w.key(h, "b_row", [[1.0]], key_start=dk - 1, slot_start=k)
    w.value(h, "val", [[1.0]])
    w.output(h, "gb", [[1.0]], slot_start=k)
  gather = AHATLayer("gather_row_col", 2 * m, dk, 1,
                     "head k copies A[i, k], head m+k copies B[k, j] to output cell (i, j)")
  dot = PositionwiseLayer("dot", lambda v: {"c": jnp.sum(v["ga"] * v["gb"])}, ("ga", "gb"), ("c",),
                          "C[i, j] = Σ_k ga_k · gb_k")
  return Program(L, [gather, dot], {"gather_row_col": w})


def matmul(A, B) -> jax.Array:
  """``A @ B`` by Lemma 5 (:func:`matmul_program`): ``2m`` AHAT heads and one position-wise dot."""
  r, m = check_matrix("A", A)
  m2, c = check_matrix("B", B)
  if m != m2:
    raise ValueError(f"`A` and `B` must chain: A is {(r, m)}, B is {(m2, c)}.")
  prog = matmul_program(r, m, c)
  P = r * m + m * c + r * c
  z = lambda n, k: np.zeros((n, k), np.float32)
  ar, ac = _grid_tags(r, m)
  br, bc = _grid_tags(m, c)
  orow, ocol = _grid_tags(r, c)
  val = jnp.concatenate([jnp.reshape(jnp.asarray(A, jnp.float32), (r * m, 1)),
                         jnp.reshape(jnp.asarray(B, jnp.float32), (m * c, 1)), jnp.zeros((r * c, 1))], 0)
  inputs = {
      "val": val,
      "is_out": np.concatenate([z(r * m + m * c, 1), np.ones((r * c, 1), np.float32)]),
      "a_row": np.concatenate([ar, z(m * c + r * c, r)]),
      "a_col": np.concatenate([ac, z(m * c + r * c, m)]),
      "b_row": np.concatenate([z(r * m, m), br, z(r * c, m)]),
      "b_col": np.concatenate([z(r * m, c), bc, z(r * c, c)]),
      "o_row": np.concatenate([z(r * m + m * c, r), orow]),
      "o_col": np.concatenate([z(r * m + m * c, c), ocol]),
  }
  out = prog.run(prog.encode(P, inputs))
  return prog.read(out[r * m + m * c:], "c").reshape(r, c)


# -- MaxMin and softmax (Lemma 4) -------------------------------------------------------------


def _row_extrema_slots(L: Layout, r: int, kinds: tuple[str, ...]) -> None:
  for kind in kinds:
    other = "min" if kind == "max" else "max"
    L.add(f"g{other}", 1, f"the global {other} of A (AHAT argmax of {'-' if other == 'min' else ''}a)")
    L.add(f"z{kind}", r, f"per row i': a if the position is in row i', else the global {other}")
    L.add(f"r{kind}_all", r, f"the {kind} of every row i', at every position")
    L.add(f"r{kind}", 1, f"the {kind} of this position's row")


def _row_extrema_layers(L: Layout, r: int, kinds: tuple[str, ...]):
  """MaxMin by AHAT, in one sequence (layers 1-4 below), exact for every real input.

  1. AHAT, one head per kind: constant query, key ``±a``: the argmax set is the entries
     equal to the global max (min), its mean is that max (min) — the paper's MaxMin.
  2. position-wise: ``zmax_i' = a`` in row ``i'``, else the global min (``zmin``: global max).
  3. AHAT, ``r`` heads per kind: head ``i'`` keys and values ``zmax_i'``; every key outside
     row ``i'`` is ``<=`` every key in it, and every key in the argmax set equals the max, so
     the mean of the selected values is row ``i'``'s max exactly (ties included).
  4. position-wise: pick this position's own row, ``Σ_i' row_i' · rmax_all_i'``."""
  sign = {"max": 1.0, "min": -1.0}
  other = {"max": "min", "min": "max"}
  w1 = AttentionWeights(L, num_heads=len(kinds), key_dim=1, value_dim=1)
  for h, kind in enumerate(kinds):
    o = other[kind]
    w1.query(h, "one", [[1.0]])
    w1.key(h, "a", [[sign[o]]])
    w1.value(h, "a", [[1.0]])
    w1.output(h, f"g{o}", [[1.0]])
  l1 = AHATLayer("global_extrema", len(kinds), 1, 1, "the global " + " / ".join(other[k] for k in kinds) +
                 " of A: constant query, key ±a (argmax set = the extreme entries)")

  def row_keys(v):
    out = {}
    for kind in kinds:
      row = v["row"]
      out[f"z{kind}"] = row * v["a"] + (1.0 - row) * v[f"g{other[kind]}"]
    return out

  l2 = PositionwiseLayer("row_keys", row_keys, ("a", "row") + tuple(f"g{other[k]}" for k in kinds),
                         tuple(f"z{k}" for k in kinds),
                         "z_i' = a in row i', else the global opposite extreme")
  w3 = AttentionWeights(L, num_heads=len(kinds) * r, key_dim=1, value_dim=1)
  for n, kind in enumerate(kinds):
    for i in range(r):
      h = n * r + i
      w3.query(h, "one", [[1.0]])
      w3.key(h, f"z{kind}", [[sign[kind]]], slot_start=i)
      w3.value(h, f"z{kind}", [[1.0]], slot_start=i)
      w3.output(h, f"r{kind}_all", [[1.0]], slot_start=i)
  l3 = AHATLayer("row_extrema", len(kinds) * r, 1, 1,
                 "head i' selects the argmax of ±z_i' and averages z_i' (= row i''s max / min)")

  def own_row(v):
    return {f"r{k}": jnp.sum(v["row"] * v[f"r{k}_all"]) for k in kinds}

  l4 = PositionwiseLayer("own_row", own_row, ("row",) + tuple(f"r{k}_all" for k in kinds),
                         tuple(f"r{k}" for k in kinds), "this position's row's extreme: Σ_i' row_i' r_all_i'")
  return [l1, l2, l3, l4], {"global_extrema": w1, "row_extrema": w3}


def _row_layout(r: int, c: int) -> Layout:
  L = Layout()
  L.add("a", 1, "A[i, j] at position p = i·c + j", is_input=True)
  L.add("one", 1, "1 at every position (constant query)", is_input=True)
  L.add("row", r, "one-hot i = p // c", is_input=True)
  L.add("col", c, "one-hot j = p % c", is_input=True)
  return L


def _row_inputs(A, r: int, c: int) -> dict:
  row, col = _grid_tags(r, c)
  return {"a": jnp.reshape(jnp.asarray(A, jnp.float32), (r * c, 1)), "one": np.ones((r * c, 1), np.float32),
          "row": row, "col": col}


@functools.lru_cache(maxsize=64)
def maxmin_program(r: int, c: int) -> Program:
  """MaxMin for ``A [r, c]``, row-wise: AHAT (2 heads) → position-wise → AHAT (``2r`` heads)
  → position-wise (see the steps below). Position ``(i, j)`` ends with ``rmax = max_j A[i, j]``
  and ``rmin = min_j A[i, j]``; the layers are described in ``_row_extrema_layers``:

  1. AHAT, 2 heads: constant query, key ``±a``: the argmax set is the entries equal to the
     global max (min), its mean is that max (min) — the paper's MaxMin.
  2. position-wise: ``zmax_i' = a`` in row ``i'``, else the global min (``zmin``: else the
     global max).
  3. AHAT, ``2r`` heads: head ``i'`` keys and values ``±zmax_i'`` (``zmin_i'``); exact for
     every real input, ties included.
  4. position-wise: ``rmax = Σ_i' row_i' · rmax_all_i'`` (and ``rmin``)."""
  L = _row_layout(r, c)
  _row_extrema_slots(L, r, ("max", "min"))
  layers, weights = _row_extrema_layers(L, r, ("max", "min"))
  return Program(L, layers, weights)


def maxmin(A) -> tuple[jax.Array, jax.Array]:
  """Row-wise ``(max, min)`` of ``A [r, c]`` (each ``[r]``) by AHAT (:func:`maxmin_program`);
  a vector ``A [c]`` is one row and gives two scalars."""
  vector = np.ndim(A) == 1
  if vector:
    check_matrix("A", A, rank=1)
    A = jnp.reshape(jnp.asarray(A), (1, -1))
  r, c = check_matrix("A", A)
  prog = maxmin_program(r, c)
  out = prog.run(prog.encode(r * c, _row_inputs(A, r, c)))
  mx = prog.read(out, "rmax").reshape(r, c)[:, 0]
  mn = prog.read(out, "rmin").reshape(r, c)[:, 0]
  return (mx[0], mn[0]) if vector else (mx, mn)


@functools.lru_cache(maxsize=64)
def softmax_program(r: int, c: int) -> Program:
  """Lemma 4, row-wise softmax of ``A [r, c]``: the row max by MaxMin (AHAT 1 head,
  position-wise, AHAT ``r`` heads, position-wise), then

  * ``exp`` — position-wise: ``e = exp(a − rowmax)`` (the elementwise exponential; the shift
    by the row max changes nothing mathematically and keeps large entries finite);
  * ``row_sum`` — AHAT, 1 head: query and key the one-hot ``row`` (score ``[same row]``), so
    the head averages ``e`` over the row; ``W_O = c`` turns the mean into the row sum;
  * ``divide`` — position-wise: ``softmax = e / rowsum``."""
  L = _row_layout(r, c)
  _row_extrema_slots(L, r, ("max",))
  L.add("e", 1, "exp(a - rowmax)")
  L.add("rsum", 1, "Σ_j e over this position's row")
  L.add("y", 1, "softmax(A)[i, j]")
  layers, weights = _row_extrema_layers(L, r, ("max",))
  w = AttentionWeights(L, num_heads=1, key_dim=r, value_dim=1)
  w.query(0, "row", np.eye(r))
  w.key(0, "row", np.eye(r))
  w.value(0, "e", [[1.0]])
  w.output(0, "rsum", [[float(c)]])
  weights["row_sum"] = w
  layers += [
      PositionwiseLayer("exp", lambda v: {"e": jnp.exp(v["a"] - v["rmax"])}, ("a", "rmax"), ("e",),
                        "e = exp(a − rowmax)"),
      AHATLayer("row_sum", 1, r, 1, "selects this position's row (score [same row]), mean of e, × c by W_O"),
      PositionwiseLayer("divide", lambda v: {"y": v["e"] / v["rsum"]}, ("e", "rsum"), ("y",), "y = e / rowsum"),
  ]
  return Program(L, layers, weights)


def softmax(A) -> jax.Array:
  """Row-wise softmax of ``A [r, c]`` (or of a vector) by Lemma 4 (:func:`softmax_program`)."""
  vector = np.ndim(A) == 1
  if vector:
    check_matrix("A", A, rank=1)
    A = jnp.reshape(jnp.asarray(A), (1, -1))
  r, c = check_matrix("A", A)
  prog = softmax_program(r, c)
  y = prog.read(prog.run(prog.encode(r * c, _row_inputs(A, r, c))), "y").reshape(r, c)
  return y[0] if vector else y


# -- ReLU --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def relu_program(size: int) -> Program:
  """ReLU on ``size`` entries: no attention, one position-wise map ``y = max(a, 0)`` (ReLU is
  elementwise: the RASP numerical ``map``)."""
  L = Layout()
  L.add("a", 1, "one entry per position", is_input=True)
  L.add("y", 1, "max(a, 0)")
  layer = PositionwiseLayer("relu", lambda v: {"y": jnp.maximum(v["a"], 0.0)}, ("a",), ("y",), "y = max(a, 0)")
  return Program(L, [layer], {})


def relu(A) -> jax.Array:
  """``max(A, 0)`` entrywise, for any shape, through :func:`relu_program`."""
  shape = tuple(np.shape(A))
  if any(d == 0 for d in shape):
    raise ValueError(f"`A` must not be empty, got shape {shape}.")
  check_matrix("A", A, rank=len(shape))
  n = int(np.prod(shape))
  prog = relu_program(n)
  out = prog.run(prog.encode(n, {"a": jnp.reshape(jnp.asarray(A, jnp.float32), (n, 1))}))
  return prog.read(out, "y").reshape(shape)


# -- 3x3 determinant and inverse --------------------------------------------------------------

_MINOR_SHIFTS = ((1, 1), (2, 2), (1, 2), (2, 1))


@functools.lru_cache(maxsize=1)
def det_inv3_program() -> Program:
  """3×3 determinant and inverse by cofactors: AHAT (4 heads) → position-wise → AHAT (2 heads)
  → position-wise, on the 9 entries with tags ``row``, ``col``.

  1. ``minor_gather`` — AHAT, 4 heads: head ``(dr, dc)`` ∈ {(1,1), (2,2), (1,2), (2,1)} has the
     key ``[row, col]`` and the query ``[row shifted by dr, col shifted by dc]`` (cyclic
     permutations of the one-hots), score 2 only at ``((i+dr) % 3, (j+dc) % 3)``: entry
     ``(i, j)`` gathers the four entries of its minor.
  2. ``cofactor`` — position-wise: ``C_ij = a_{i+1,j+1} a_{i+2,j+2} − a_{i+1,j+2} a_{i+2,j+1}``
     (indices mod 3: the cyclic form already carries the sign ``(−1)^{i+j}``), and ``a_ij C_ij``.
  3. ``expand_transpose`` — AHAT, 2 heads: head 0 (constant query, key ``row_0``) averages
     ``a_0j C_0j`` over row 0, ``W_O = 3`` makes it ``det A`` (Laplace expansion); head 1 is
     Lemma 3's transpose (query ``(i, j)`` selects key ``(j, i)``), copying ``C_ji``: the
     adjugate.
  4. ``divide`` — position-wise: ``A⁻¹_ij = adj_ij / det A`` (inf/NaN when ``det A = 0``, as
     for :func:`jnp.linalg.inv`)."""
  L = Layout()
  L.add("a", 1, "A[i, j] at position p = 3i + j", is_input=True)
  L.add("one", 1, "1 at every position (constant query)", is_input=True)
  L.add("row", 3, "one-hot i", is_input=True)
  L.add("col", 3, "one-hot j", is_input=True)
  L.add("minor", 4, "a_{i+1,j+1}, a_{i+2,j+2}, a_{i+1,j+2}, a_{i+2,j+1} (indices mod 3)")
  L.add("cof", 1, "the cofactor C_ij")
  L.add("term", 1, "a_ij C_ij")
  L.add("det", 1, "det A (at every position)")
  L.add("adj", 1, "adj(A)_ij = C_ji")
  L.add("inv", 1, "A^{-1}_ij")
  shift = lambda d: np.eye(3, dtype=np.float32)[(np.arange(3) + d) % 3]  # row i -> one-hot (i + d) % 3
  w1 = AttentionWeights(L, num_heads=4, key_dim=6, value_dim=1)
  for h, (dr, dc) in enumerate(_MINOR_SHIFTS):
    w1.query(h, "row", shift(dr), key_start=0)
    w1.query(h, "col", shift(dc), key_start=3)
    w1.key(h, "row", np.eye(3), key_start=0)
    w1.key(h, "col", np.eye(3), key_start=3)
    w1.value(h, "a", [[1.0]])
    w1.output(h, "minor", [[1.0]], slot_start=h)

  def cofactor(v):
    g = v["minor"]
    cof = g[0] * g[1] - g[2] * g[3]
    return {"cof": cof, "term": v["a"][0] * cof}

  w3 = AttentionWeights(L, num_heads=2, key_dim=6, value_dim=1)
  w3.query(0, "one", [[1.0]])
  w3.key(0, "row", [[1.0]], slot_start=0)          # score 1 on row 0, 0 elsewhere
  w3.value(0, "term", [[1.0]])
  w3.output(0, "det", [[3.0]])                     # mean of the three terms × 3
  w3.query(1, "row", np.eye(3), key_start=3)       # query (i, j) -> key (j, i)  (Lemma 3)
  w3.query(1, "col", np.eye(3), key_start=0)
  w3.key(1, "row", np.eye(3), key_start=0)
  w3.key(1, "col", np.eye(3), key_start=3)
  w3.value(1, "cof", [[1.0]])
  w3.output(1, "adj", [[1.0]])
  layers = [
      AHATLayer("minor_gather", 4, 6, 1, "entry (i, j) copies the four entries of its minor"),
      PositionwiseLayer("cofactor", cofactor, ("a", "minor"), ("cof", "term"),
                        "C_ij = a_{i+1,j+1}a_{i+2,j+2} − a_{i+1,j+2}a_{i+2,j+1}; a_ij C_ij"),
      AHATLayer("expand_transpose", 2, 6, 1, "head 0: det = 3 · mean over row 0 of a_0j C_0j; "
                "head 1: adj_ij = C_ji (transpose)"),
      PositionwiseLayer("divide", lambda v: {"inv": v["adj"] / v["det"]}, ("adj", "det"), ("inv",),
                        "A^{-1}_ij = adj_ij / det"),
  ]
  return Program(L, layers, {"minor_gather": w1, "expand_transpose": w3})


def _run_det_inv3(A):
  shape = check_matrix("A", A)
  if shape != (3, 3):
    raise ValueError(f"`A` must be 3x3, got shape {shape}.")
  prog = det_inv3_program()
  row, col = _grid_tags(3, 3)
  seq = prog.encode(9, {"a": jnp.reshape(jnp.asarray(A, jnp.float32), (9, 1)),
                        "one": np.ones((9, 1), np.float32), "row": row, "col": col})
  return prog, prog.run(seq)


def det3(A) -> jax.Array:
  """``det A`` for ``A [3, 3]`` by cofactors through AHAT (:func:`det_inv3_program`)."""
  prog, out = _run_det_inv3(A)
  return prog.read(out, "det")[0, 0]


def inv3(A) -> jax.Array:
  """``A⁻¹`` for ``A [3, 3]``: adjugate (cofactors, transposed by Lemma 3) over the determinant."""
  prog, out = _run_det_inv3(A)
  return prog.read(out, "inv").reshape(3, 3)
