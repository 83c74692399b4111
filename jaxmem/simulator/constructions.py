"""The exact building blocks of the simulator paper as hand-built AHAT programs.

Dutta, Chakrabarty, Ansari & Das, "On the Existence of Universal Simulators of Attention"
(arXiv:2506.18739 v2), §4: transpose (Lemma 3), softmax (Lemma 4), matrix product (Lemma 5),
ReLU, MaxMin and the 3×3 determinant and inverse, each as a short stack of layers. Every
function here builds a :class:`~jaxmem.machine.Program` from the *shape* of its
input only (cached; ``*_program`` exposes it), lays the matrix out as a sequence — one entry
per position, with one-hot row/column *tags* as the positional encoding (a fixed function of
the position index, like RASP's ``indices``) — and runs it. These are jaxmem's own
constructions written from the paper's statements (not its proofs verbatim); each docstring
lists its layers.

They are held to the universal simulator's accounting: every layer is one of the restricted
kinds of :mod:`~jaxmem.machine` — AHAT with fixed ``W_Q, W_K, W_V, W_O`` (a call
to :func:`jaxmem.kernels.ahat.ahat_attention`, ``tol = 0``), ``LinearLayer`` (a fixed matrix,
at most two terms per output coordinate), ``ProductLayer`` (``a·b`` of two coordinates),
``UnaryLayer`` (``exp``, ``reciprocal``, ``relu`` of one coordinate). Every sum over entries
(a row's softmax normaliser, a matrix product's inner index, the determinant's expansion) is
an AHAT head that selects the positions holding the terms by their tags and averages them,
``W_O`` multiplying the mean by the (fixed) count, as in :mod:`~jaxmem.simulator.universal`;
every maximum is an AHAT argmax of a data key. ``tests/simulator/structure.py`` checks this
on every program.

All selections are exact: every AHAT score is an integer (tag matches) or, in MaxMin, a data
value (or a bound strictly below every data value), so the argmax set is exactly the intended
set. Copying one selected value is exact in float32; the sums (a mean times its count) and the
position-wise arithmetic round as float32 does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

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


def _linear(L: Layout, name: str, terms, computes: str) -> tuple[LinearLayer, LinearWeights]:
  """A :class:`LinearLayer` ``out += coeff · src`` for each ``(out, src, coeff)``."""
  w = LinearWeights(L)
  for out, src, coeff in terms:
    w.add(out, src, coeff)
  return LinearLayer(name, computes), w


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
  """Lemma 5 for ``A [r, m] @ B [m, c]``: AHAT (2 heads) → product → AHAT (1 head).

  The sequence holds A's entries (``r·m`` positions, tags ``a_row``, ``a_col``), then B's
  (``m·c``, tags ``b_row``, ``b_col``), then one *product cell* per ``(i, j, k)`` (``r·c·m``
  positions in row-major order, tags ``p_row = i``, ``p_col = j``, ``p_k = k``):

  1. ``gather`` — AHAT, 2 heads: head 0 (query ``[p_row, p_k]``, key ``[a_row, a_col]``) scores
     2 only at ``A[i, k]``, head 1 (query ``[p_k, p_col]``, key ``[b_row, b_col]``) only at
     ``B[k, j]``: cell ``(i, j, k)`` copies both;
  2. ``products`` — product: ``A[i, k]·B[k, j]``;
  3. ``sum_over_k`` — AHAT, 1 head: query and key ``[p_row, p_col]`` score 2 at the ``m``
     cells ``(i, j, ·)``; the head averages their products and ``W_O = m`` turns the mean into
     ``C[i, j] = Σ_k A[i, k] B[k, j]``, at every cell ``(i, j, ·)`` (read at ``k = 0``).

  Three heads for every shape (the paper's bound is ``O(r·c)``); what grows is the sequence,
  ``r·m + m·c + r·c·m`` positions. The entries' positions compute unused (finite) values."""
  L = Layout()
  L.add("val", 1, "the entry A[i, k] or B[k, j] (zero at the product cells)", is_input=True)
  L.add("a_row", r, "one-hot i at A's entry (i, k)", is_input=True)
  L.add("a_col", m, "one-hot k at A's entry (i, k)", is_input=True)
  L.add("b_row", m, "one-hot k at B's entry (k, j)", is_input=True)
  L.add("b_col", c, "one-hot j at B's entry (k, j)", is_input=True)
  L.add("p_row", r, "one-hot i at product cell (i, j, k)", is_input=True)
  L.add("p_col", c, "one-hot j at product cell (i, j, k)", is_input=True)
  L.add("p_k", m, "one-hot k at product cell (i, j, k)", is_input=True)
  L.add("ga", 1, "A[i, k] gathered at product cell (i, j, k)")
  L.add("gb", 1, "B[k, j] gathered at product cell (i, j, k)")
  L.add("prod", 1, "A[i, k]·B[k, j] at product cell (i, j, k)")
  L.add("c", 1, "C[i, j] = Σ_k A[i, k] B[k, j] at the product cells (i, j, ·)")
  dk = max(r, c) + m
  w1 = AttentionWeights(L, num_heads=2, key_dim=dk, value_dim=1)
  w1.query(0, "p_row", np.eye(r), key_start=0)
  w1.query(0, "p_k", np.eye(m), key_start=r)
  w1.key(0, "a_row", np.eye(r), key_start=0)
  w1.key(0, "a_col", np.eye(m), key_start=r)
  w1.value(0, "val", [[1.0]])
  w1.output(0, "ga", [[1.0]])
  w1.query(1, "p_k", np.eye(m), key_start=0)
  w1.query(1, "p_col", np.eye(c), key_start=m)
  w1.key(1, "b_row", np.eye(m), key_start=0)
  w1.key(1, "b_col", np.eye(c), key_start=m)
  w1.value(1, "val", [[1.0]])
  w1.output(1, "gb", [[1.0]])
  w3 = AttentionWeights(L, num_heads=1, key_dim=r + c, value_dim=1)
  w3.query(0, "p_row", np.eye(r), key_start=0)
  w3.query(0, "p_col", np.eye(c), key_start=r)
  w3.key(0, "p_row", np.eye(r), key_start=0)
  w3.key(0, "p_col", np.eye(c), key_start=r)
  w3.value(0, "prod", [[1.0]])
  w3.output(0, "c", [[float(m)]])
  layers = [
      AHATLayer("gather", 2, dk, 1, "head 0 copies A[i, k], head 1 copies B[k, j] to product cell (i, j, k)"),
      ProductLayer("products", (("prod", "ga", "gb"),), "A[i, k]·B[k, j]"),
      AHATLayer("sum_over_k", 1, r + c, 1, "cell (i, j, ·) averages the products of the m cells (i, j, ·); "
                "W_O = m: C[i, j]"),
  ]
  return Program(L, layers, {"gather": w1, "sum_over_k": w3})


def matmul(A, B) -> jax.Array:
  """``A @ B`` by Lemma 5 (:func:`matmul_program`): a product cell per ``(i, j, k)``, 3 AHAT heads."""
  r, m = check_matrix("A", A)
  m2, c = check_matrix("B", B)
  if m != m2:
    raise ValueError(f"`A` and `B` must chain: A is {(r, m)}, B is {(m2, c)}.")
  prog = matmul_program(r, m, c)
  n_in, n_cells = r * m + m * c, r * c * m
  z = lambda n, k: np.zeros((n, k), np.float32)
  ar, ac = _grid_tags(r, m)
  br, bc = _grid_tags(m, c)
  cell = np.arange(n_cells)   # (i, j, k) row-major
  val = jnp.concatenate([jnp.reshape(jnp.asarray(A, jnp.float32), (r * m, 1)),
                         jnp.reshape(jnp.asarray(B, jnp.float32), (m * c, 1)), jnp.zeros((n_cells, 1))], 0)
  inputs = {
      "val": val,
      "a_row": np.concatenate([ar, z(m * c + n_cells, r)]),
      "a_col": np.concatenate([ac, z(m * c + n_cells, m)]),
      "b_row": np.concatenate([z(r * m, m), br, z(n_cells, m)]),
      "b_col": np.concatenate([z(r * m, c), bc, z(n_cells, c)]),
      "p_row": np.concatenate([z(n_in, r), _onehot(cell // (c * m), r)]),
      "p_col": np.concatenate([z(n_in, c), _onehot(cell // m % c, c)]),
      "p_k": np.concatenate([z(n_in, m), _onehot(cell % m, m)]),
  }
  out = prog.run(prog.encode(n_in + n_cells, inputs))
  return prog.read(out[n_in:], "c").reshape(r, c, m)[:, :, 0]


# -- MaxMin and softmax (Lemma 4) -------------------------------------------------------------

_BOUND = {"max": "low", "min": "high"}   # the key outside a row: below (above) every entry


def _row_extrema_slots(L: Layout, r: int, kinds: tuple[str, ...]) -> None:
  docs = {"max": [("neg_gmin", "−(the global min of A): AHAT argmax of −a, W_O = −1"),
                  ("relu_neg_gmin", "relu(−gmin) = −min(gmin, 0)"),
                  ("low", "2·min(gmin, 0) − 1 < every entry")],
          "min": [("gmax", "the global max of A: AHAT argmax of a"),
                  ("relu_gmax", "relu(gmax) = max(gmax, 0)"),
                  ("high", "2·max(gmax, 0) + 1 > every entry")]}
  for kind in kinds:
    for name, doc in docs[kind]:
      L.add(name, 1, doc)
  L.add("nonrow", r, "1 − row: 1 in the coordinates of the other rows")
  L.add("key_in", r, "row · a: a in this position's row's coordinate, 0 in the others")
  for kind in kinds:
    b = _BOUND[kind]
    L.add(f"key_{b}", r, f"nonrow · {b}: `{b}` in the other rows' coordinates")
  for kind in kinds:
    L.add(f"r{kind}", 1, f"the {kind} of this position's row")


def _row_extrema_layers(L: Layout, r: int, kinds: tuple[str, ...]):
  """Row-wise max (min) by AHAT: layers 1-5 of :func:`maxmin_program` (exact selections for
  every input whose entries are below ``1e38`` in magnitude; ties as described there)."""
  layers, weights = [], {}
  w1 = AttentionWeights(L, num_heads=len(kinds), key_dim=1, value_dim=1)
  for h, kind in enumerate(kinds):
    w1.query(h, "one", [[1.0]])
    w1.value(h, "a", [[1.0]])
    if kind == "max":   # needs the global min: key −a, written negated
      w1.key(h, "a", [[-1.0]])
      w1.output(h, "neg_gmin", [[-1.0]])
    else:
      w1.key(h, "a", [[1.0]])
      w1.output(h, "gmax", [[1.0]])
  what = {"max": "−a: the global min, written negated (W_O = −1)", "min": "a: the global max"}
  layers.append(AHATLayer("global_extrema", len(kinds), 1, 1, "constant query; the argmax set of the key "
                          + "; of ".join(what[k] for k in kinds) + " — the mean of the extreme entries"))
  weights["global_extrema"] = w1
  terms = {"max": ("relu_neg_gmin", "neg_gmin"), "min": ("relu_gmax", "gmax")}
  layers.append(UnaryLayer("bound_relu", "relu", tuple(terms[k] for k in kinds),
                           ", ".join(f"relu({terms[k][1]})" for k in kinds)))
  lin_terms = [("nonrow", "one", 1.0), ("nonrow", "row", -1.0)]
  if "max" in kinds:
    lin_terms += [("low", "relu_neg_gmin", -2.0), ("low", "one", -1.0)]
  if "min" in kinds:
    lin_terms += [("high", "relu_gmax", 2.0), ("high", "one", 1.0)]
  layer, weights["bounds"] = _linear(L, "bounds", lin_terms, "nonrow = 1 − row; " + "; ".join(
      {"max": "low = −2·relu(−gmin) − 1", "min": "high = 2·relu(gmax) + 1"}[k] for k in kinds))
  layers.append(layer)
  layers.append(ProductLayer("row_keys", (("key_in", "row", "a"),) + tuple(
      (f"key_{_BOUND[k]}", "nonrow", _BOUND[k]) for k in kinds),
      "per row i': a in its own row's coordinate, the bound in the others"))
  sign = {"max": 1.0, "min": -1.0}
  w5 = AttentionWeights(L, num_heads=len(kinds), key_dim=r, value_dim=1)
  for h, kind in enumerate(kinds):
    w5.query(h, "row", np.eye(r))
    w5.key(h, "key_in", sign[kind] * np.eye(r))
    w5.key(h, f"key_{_BOUND[kind]}", sign[kind] * np.eye(r))
    w5.value(h, "a", [[1.0]])
    w5.output(h, f"r{kind}", [[1.0]])
  layers.append(AHATLayer("row_extrema", len(kinds), r, 1, "query row i, key ±(key_in + key_bound): ±a in "
                          "row i, ±bound elsewhere; the argmax set is row i's extreme entries, their mean "
                          "its " + " / ".join(kinds)))
  weights["row_extrema"] = w5
  return layers, weights


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
  """MaxMin for ``A [r, c]``, row-wise: AHAT (2 heads) → unary relu → linear → product →
  AHAT (2 heads). Position ``(i, j)`` ends with ``rmax = max_j A[i, j]`` and
  ``rmin = min_j A[i, j]``:

  1. ``global_extrema`` — AHAT, 2 heads: constant query, key ``−a`` (``a``): the argmax set is
     the entries equal to the global min (max), its mean is that min (max) — the paper's
     MaxMin; the min is written negated (``W_O = −1``);
  2. ``bound_relu`` — unary relu: ``relu(−gmin)``, ``relu(gmax)``;
  3. ``bounds`` — linear: ``low = −2·relu(−gmin) − 1`` (``= 2·gmin − 1`` if ``gmin < 0``, else
     ``−1``: strictly below every entry, after rounding too), ``high = 2·relu(gmax) + 1``
     (above every entry), ``nonrow = 1 − row``;
  4. ``row_keys`` — product: ``key_in = row · a``, ``key_low = nonrow · low``,
     ``key_high = nonrow · high`` (``r`` coordinates each, one per row ``i'``);
  5. ``row_extrema`` — AHAT, 2 heads, query the one-hot ``row``: the max head's key is
     ``key_in + key_low``, so query row ``i`` scores ``a`` at the entries of row ``i`` and
     ``low`` at every other; its argmax set is exactly the entries equal to row ``i``'s max,
     and their mean (value ``a``) is that max. The min head keys ``−(key_in + key_high)``.

  Exact for every input whose entries are below ``1e38`` in magnitude (``2·|gmin| + 1`` must
  be finite) when a row's extreme is attained once, or by values whose ``k``-fold float32
  sum divided by ``k`` rounds back to them (``k`` a power of two, small integers); ``k`` equal
  non-integer copies can come back one ulp off. Four heads for every shape."""
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
  """Lemma 4, row-wise softmax of ``A [r, c]``: the row max by MaxMin (layers 1-5 of
  :func:`maxmin_program` for the max only: AHAT 1 head, unary relu, linear, product, AHAT
  1 head), then

  6. ``shift`` — linear: ``z = a − rowmax`` (the shift changes nothing mathematically and
     keeps large entries finite);
  7. ``exp`` — unary: ``e = exp(z)`` (Lemma 4's elementwise exponential);
  8. ``row_sum`` — AHAT, 1 head: query and key the one-hot ``row`` (score ``[same row]``), so
     the head averages ``e`` over the row; ``W_O = c`` turns the mean into the row sum;
  9. ``reciprocal`` — unary: ``1 / rowsum`` (``rowsum ≥ 1``: the max entry contributes 1);
  10. ``normalise`` — product: ``softmax = e · (1 / rowsum)``.

  Three heads for every shape."""
  L = _row_layout(r, c)
  _row_extrema_slots(L, r, ("max",))
  L.add("z", 1, "a − rowmax")
  L.add("e", 1, "exp(a − rowmax)")
  L.add("rsum", 1, "Σ_j e over this position's row")
  L.add("rinv", 1, "1 / rsum")
  L.add("y", 1, "softmax(A)[i, j]")
  layers, weights = _row_extrema_layers(L, r, ("max",))
  shift, weights["shift"] = _linear(L, "shift", [("z", "a", 1.0), ("z", "rmax", -1.0)], "z = a − rowmax")
  w = AttentionWeights(L, num_heads=1, key_dim=r, value_dim=1)
  w.query(0, "row", np.eye(r))
  w.key(0, "row", np.eye(r))
  w.value(0, "e", [[1.0]])
  w.output(0, "rsum", [[float(c)]])
  weights["row_sum"] = w
  layers += [
      shift,
      UnaryLayer("exp", "exp", (("e", "z"),), "e = exp(a − rowmax)"),
      AHATLayer("row_sum", 1, r, 1, "selects this position's row (score [same row]), mean of e, × c by W_O"),
      UnaryLayer("reciprocal", "reciprocal", (("rinv", "rsum"),), "1 / rowsum"),
      ProductLayer("normalise", (("y", "e", "rinv"),), "y = e · (1 / rowsum)"),
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
  """ReLU on ``size`` entries: no attention, one unary layer ``y = relu(a)`` (ReLU is
  elementwise: the RASP numerical ``map``)."""
  L = Layout()
  L.add("a", 1, "one entry per position", is_input=True)
  L.add("y", 1, "max(a, 0)")
  return Program(L, [UnaryLayer("relu", "relu", (("y", "a"),), "y = max(a, 0)")], {})


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
  """3×3 determinant and inverse by cofactors: AHAT (4 heads) → product → linear → product →
  AHAT (2 heads) → unary reciprocal → product, on the 9 entries with tags ``row``, ``col``.

  1. ``minor_gather`` — AHAT, 4 heads: head ``(dr, dc)`` ∈ {(1,1), (2,2), (1,2), (2,1)} has the
     key ``[row, col]`` and the query ``[row shifted by dr, col shifted by dc]`` (cyclic
     permutations of the one-hots), score 2 only at ``((i+dr) % 3, (j+dc) % 3)``: entry
     ``(i, j)`` copies the four entries ``m11, m22, m12, m21`` of its minor;
  2. ``minor_products`` — product: ``m11·m22`` and ``m12·m21``;
  3. ``cofactor`` — linear: ``C_ij = m11·m22 − m12·m21`` (indices mod 3: the cyclic form
     already carries the sign ``(−1)^{i+j}``);
  4. ``expansion_terms`` — product: ``a_ij C_ij``;
  5. ``expand_transpose`` — AHAT, 2 heads: head 0 (constant query, key ``row_0``) averages
     ``a_0j C_0j`` over row 0, ``W_O = 3`` makes it ``det A`` (Laplace expansion); head 1 is
     Lemma 3's transpose (query ``(i, j)`` selects key ``(j, i)``), copying ``C_ji``: the
     adjugate;
  6. ``reciprocal`` — unary: ``1 / det A`` (inf when ``det A = 0``);
  7. ``divide`` — product: ``A⁻¹_ij = adj_ij · (1 / det A)`` (inf/NaN when ``det A = 0``, as
     for :func:`jnp.linalg.inv`)."""
  L = Layout()
  L.add("a", 1, "A[i, j] at position p = 3i + j", is_input=True)
  L.add("one", 1, "1 at every position (constant query)", is_input=True)
  L.add("row", 3, "one-hot i", is_input=True)
  L.add("col", 3, "one-hot j", is_input=True)
  minor = tuple(f"m{dr}{dc}" for dr, dc in _MINOR_SHIFTS)
  for name, (dr, dc) in zip(minor, _MINOR_SHIFTS, strict=True):
    L.add(name, 1, f"a_{{i+{dr},j+{dc}}} (indices mod 3)")
  L.add("p_plus", 1, "m11·m22")
  L.add("p_minus", 1, "m12·m21")
  L.add("cof", 1, "the cofactor C_ij")
  L.add("term", 1, "a_ij C_ij")
  L.add("det", 1, "det A (at every position)")
  L.add("adj", 1, "adj(A)_ij = C_ji")
  L.add("rdet", 1, "1 / det A")
  L.add("inv", 1, "A^{-1}_ij")
  shift = lambda d: np.eye(3, dtype=np.float32)[(np.arange(3) + d) % 3]  # row i -> one-hot (i + d) % 3
  w1 = AttentionWeights(L, num_heads=4, key_dim=6, value_dim=1)
  for h, (dr, dc) in enumerate(_MINOR_SHIFTS):
    w1.query(h, "row", shift(dr), key_start=0)
    w1.query(h, "col", shift(dc), key_start=3)
    w1.key(h, "row", np.eye(3), key_start=0)
    w1.key(h, "col", np.eye(3), key_start=3)
    w1.value(h, "a", [[1.0]])
    w1.output(h, minor[h], [[1.0]])
  cofactor, w_cof = _linear(L, "cofactor", [("cof", "p_plus", 1.0), ("cof", "p_minus", -1.0)],
                            "C_ij = m11·m22 − m12·m21")
  w5 = AttentionWeights(L, num_heads=2, key_dim=6, value_dim=1)
  w5.query(0, "one", [[1.0]])
  w5.key(0, "row", [[1.0]], slot_start=0)          # score 1 on row 0, 0 elsewhere
  w5.value(0, "term", [[1.0]])
  w5.output(0, "det", [[3.0]])                     # mean of the three terms × 3
  w5.query(1, "row", np.eye(3), key_start=3)       # query (i, j) -> key (j, i)  (Lemma 3)
  w5.query(1, "col", np.eye(3), key_start=0)
  w5.key(1, "row", np.eye(3), key_start=0)
  w5.key(1, "col", np.eye(3), key_start=3)
  w5.value(1, "cof", [[1.0]])
  w5.output(1, "adj", [[1.0]])
  layers = [
      AHATLayer("minor_gather", 4, 6, 1, "entry (i, j) copies the four entries of its minor"),
      ProductLayer("minor_products", (("p_plus", "m11", "m22"), ("p_minus", "m12", "m21")), "m11·m22, m12·m21"),
      cofactor,
      ProductLayer("expansion_terms", (("term", "a", "cof"),), "a_ij C_ij"),
      AHATLayer("expand_transpose", 2, 6, 1, "head 0: det = 3 · mean over row 0 of a_0j C_0j; "
                "head 1: adj_ij = C_ji (transpose)"),
      UnaryLayer("reciprocal", "reciprocal", (("rdet", "det"),), "1 / det"),
      ProductLayer("divide", (("inv", "adj", "rdet"),), "A^{-1}_ij = adj_ij · (1 / det)"),
  ]
  return Program(L, layers, {"minor_gather": w1, "cofactor": w_cof, "expand_transpose": w5})


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
  """``A⁻¹`` for ``A [3, 3]``: adjugate (cofactors, transposed by Lemma 3) times the reciprocal
  of the determinant."""
  prog, out = _run_det_inv3(A)
  return prog.read(out, "inv").reshape(3, 3)
