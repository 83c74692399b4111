"""The universal simulator U: fixed AHAT weights, ``T``'s parameters as data, output ``T(X)``.

Theorem 6 / Corollary 6.1 of Dutta, Chakrabarty, Ansari & Das, "On the Existence of
Universal Simulators of Attention" (arXiv:2506.18739 v2): one transformer ``U`` built from
average-hard-attention encoder layers, whose weights depend only on the sizes
``(N, D, H, D_h[, F])``, reads the parameters of *any* single-layer ``H``-head attention
(or encoder) layer ``T`` together with an input ``X [n, D]``, ``n <= N``, from its input
sequence and outputs ``T(X)``. This module's own design, written from the paper's statements
(the full layer table, the accounting and the sizes are in ``jaxmem/simulator/README.md``).

**Attention does the work.** Every sum in ``T(X)`` — over ``D`` in ``x·W``, over ``D_h`` in
``q·k``, over the keys ``j`` in the softmax and the weighted sum of values, over heads and
``D_h`` in the output projection, over ``D`` and ``F`` in the FFN — is an AHAT *aggregation*:
each scalar product sits at its own position, and one head averages the products selected by
one-hot tags, the fixed ``W_O`` multiplying the mean by the (fixed) count. The row maxima of
the softmax are AHAT argmaxes of a data key (as ``constructions.maxmin``). The position-wise
layers are only the restricted kinds of :mod:`~jaxmem.machine`: ``ProductLayer``
(``a·b`` of two coordinates), ``UnaryLayer`` (``exp``, ``reciprocal``, ``relu`` of one
coordinate) and ``LinearLayer`` (a fixed matrix, here never more than two terms per output).

Input sequence: one position per entry of each matrix (a *cell*), the cell's indices as
one-hot *tags* (a fixed function of the position, like RASP's ``indices``; each cell type has
its own tag slots, zero elsewhere); T's and X's numbers each appear once:

* ``BOS`` — one position, the default key (``is_bos = 1``);
* ``W`` cells ``(h, d, e)``: ``T.wq, T.wk, T.wv = w*[h, d, e]``, ``T.wo = wo[h, e, d]``;
* ``X`` cells ``(i, d)``, ``i < n``: ``x = X[i, d]`` (and, at the end, ``T(X)[i, d]``);
* ``A`` cells ``(i, d, h, e)``: the projection products ``X[i, d]·w[h, d, e]`` and the output
  products ``o[h, i, e]·wo[h, e, d]``;
* ``S`` cells ``(h, i, j, e)``: the score products ``q[h, i, e]·k[h, j, e]`` and the weighted
  values ``exp(s_hij − max_j' s_hij')·v[h, j, e]``;
* encoder: ``V`` cells ``(d, f)`` (``T.w1 = w1[d, f]``, ``T.w2 = w2[f, d]``), ``B1`` cells
  ``(f)``, ``B2`` cells ``(d)``, ``Hd`` cells ``(i, f)`` (the hidden units) and ``F`` cells
  ``(i, d, f)`` (the FFN products).

Every tag selection scores the number of matching tags (an integer ``K`` at the intended keys,
at most ``K − 1`` elsewhere) and the ``BOS`` key scores ``K − ½``: a query whose selection is
empty — every position of another cell type — reads the ``BOS`` instead of averaging the whole
sequence (the paper's trap). ``BOS``'s computed slots hold neutral values (``exp`` 1, products
0), so every slot stays finite at every position.

:meth:`Simulator.run_sequence` pads the sequence to the length at ``n = N`` with a key mask,
so that one compiled program serves every ``n`` (``pad=False`` runs it unpadded; tested equal).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.checks import check_positive_int, is_concrete
from jaxmem.machine import (
  AHATLayer,
  AttentionWeights,
  LayerInfo,
  Layout,
  LinearLayer,
  LinearWeights,
  ProductLayer,
  Program,
  UnaryLayer,
)
from jaxmem.simulator.reference import (
  AttentionParams,
  EncoderParams,
  attention_layer,
  attention_layer_numpy,
  check_attention_params,
  check_encoder_params,
  check_finite_array,
  check_matrix,
  encoder_layer,
  encoder_layer_numpy,
)

__all__ = ["ErrorRow", "Simulator", "SimulatorLayout", "build_simulator", "error_table", "random_params"]

_ATT_FIELDS = ("wq", "wk", "wv", "wo")
_FFN_FIELDS = ("w1", "b1", "w2", "b2")


class SimulatorLayout(NamedTuple):
  """How ``T`` and ``X`` sit in U's input sequence.

  ``positions``: one ``(cell type, count, what its positions hold)`` per cell type, in sequence
  order; ``slots``: the residual stream's slots (:class:`jaxmem.machine.SlotInfo`:
  name, start, size, is_input, meaning); ``params``: for each of T's matrices, ``(slot, cell
  type, axes)``: the entry ``T.f[axes]`` of the cell with those indices (``wo`` and ``w2`` are
  read transposed: ``("T.wo", "W", "h e d")`` puts ``wo[h, e, d]`` at cell ``(h, d, e)``);
  ``width``: residual width; ``input_width``: width of the input slots (the rest start 0);
  ``output_slot``: the slot holding ``T(X)[i, d]`` at ``X`` cell ``(i, d)``."""
  positions: tuple[tuple[str, str, str], ...]
  slots: tuple
  params: dict
  width: int
  input_width: int
  output_slot: str

  def table(self) -> str:
    lines = ["| cells | positions | hold |", "|---|---|---|"] + [f"| {c} | {p} | {h} |"
                                                               for c, p, h in self.positions]
    lines += ["", "| slot | coordinates | size | input | meaning |", "|---|---|---|---|---|"]
    for s in self.slots:
      lines.append(f"| `{s.name}` | {s.start}..{s.start + s.size - 1} | {s.size} | "
                   f"{'yes' if s.is_input else ''} | {s.doc} |")
    return "\n".join(lines)


# -- cells ----------------------------------------------------------------------------------------


def _cell_axes(N: int, D: int, H: int, Dh: int, F: Optional[int]) -> dict[str, tuple[tuple[str, int], ...]]:
  """Cell types in sequence order, each with its index axes ``(name, size)``; ``"i"`` and ``"j"``
  (rows of X) have size ``N`` here and ``n`` in a sequence."""
  cells = {"BOS": (), "W": (("h", H), ("d", D), ("e", Dh))}
  if F is not None:
    cells.update({"V": (("d", D), ("f", F)), "B1": (("f", F),), "B2": (("d", D),)})
  cells.update({"X": (("i", N), ("d", D)), "A": (("i", N), ("d", D), ("h", H), ("e", Dh)),
                "S": (("h", H), ("i", N), ("j", N), ("e", Dh))})
  if F is not None:
    cells.update({"Hd": (("i", N), ("f", F)), "F": (("i", N), ("d", D), ("f", F))})
  return cells


def _cell_indices(axes, n: int) -> np.ndarray:
  """``[count, len(axes)]`` row-major indices of a cell type's positions at input length ``n``."""
  sizes = [n if a in ("i", "j") else s for a, s in axes]
  if not sizes:
    return np.zeros((1, 0), int)
  return np.stack(np.unravel_index(np.arange(math.prod(sizes)), sizes), 1)


def _sequence_length(cells, n: int) -> int:
  return sum(len(_cell_indices(axes, n)) for axes in cells.values())


# -- the program ----------------------------------------------------------------------------------


class _Builder:
  """Slots and layers of U, addressed by name; ``head`` / ``attention`` build AHAT layers whose
  heads select by tags (with the ``BOS`` default) and route values with one fixed scale."""

  def __init__(self, L: Layout):
    self.L, self.layers, self.weights = L, [], {}

  def attention(self, name: str, heads: Sequence[dict], computes: str) -> None:
    """``heads``: dicts with ``query`` (query-side ``[(slot, coeff)]`` per key column block),
    ``key`` (key-side, the same blocks) and ``routes`` ``[(value slot, output slot, scale[, value
    scale])]``: ``W_V`` multiplies the value by ``value scale`` (default 1) and ``W_O`` the mean by
    ``scale``."""
    key_dim = max(sum(self.L[q[0][0]].size for q in h["query"]) for h in heads)
    value_dim = max(sum(self.L[r[0]].size for r in h["routes"]) for h in heads)
    w = AttentionWeights(self.L, len(heads), key_dim, value_dim)
    for n, h in enumerate(heads):
      col = 0
      for qs, ks in zip(h["query"], h["key"], strict=True):
        size = self.L[qs[0][0]].size
        for slot, coeff in qs:
          w.query(n, slot, _block(coeff, self.L[slot].size, size), key_start=col)
        for slot, coeff in ks:
          w.key(n, slot, _block(coeff, self.L[slot].size, size), key_start=col)
        col += size
      col = 0
      for src, dst, scale, *value_scale in h["routes"]:
        size = self.L[src].size
        w.value(n, src, np.float32(value_scale[0] if value_scale else 1.0) * np.eye(size), value_start=col)
        w.output(n, dst, np.float32(scale) * np.eye(size), value_start=col)
        col += size
    self.layers.append(AHATLayer(name, len(heads), key_dim, value_dim, computes))
    self.weights[name] = w

  def linear(self, name: str, terms: Sequence[tuple[str, str, float]], computes: str) -> None:
    w = LinearWeights(self.L)
    for out, src, coeff in terms:
      w.add(out, src, coeff)
    self.layers.append(LinearLayer(name, computes))
    self.weights[name] = w

  def product(self, name: str, terms, computes: str) -> None:
    self.layers.append(ProductLayer(name, tuple(terms), computes))

  def unary(self, name: str, op: str, terms, computes: str) -> None:
    self.layers.append(UnaryLayer(name, op, tuple(terms), computes))


def _pow2_at_least(n: int) -> int:
  return 1 << max(int(n) - 1, 0).bit_length()


def _block(coeff, rows: int, cols: int) -> np.ndarray:
  """``coeff`` times the identity (``rows == cols``) or times a row of ones (a size-1 slot feeding
  every column of the block)."""
  if rows == cols:
    return np.float32(coeff) * np.eye(rows, dtype=np.float32)
  if rows == 1:
    return np.full((1, cols), coeff, np.float32)
  raise ValueError(f"a {rows}-coordinate slot cannot feed a {cols}-column block")


def _select(pairs: Sequence[tuple[str, str]]) -> dict:
  """Query/key blocks of a tag selection: query tag ``q`` against key tag ``k`` for each pair (one-hots
  of one size), score = number of matching pairs (``K`` at the selected keys), and a last column
  ``(K − ½)·one`` against ``is_bos``: the default key."""
  K = len(pairs)
  return {"query": [[(q, 1.0)] for q, _ in pairs] + [[("one", K - 0.5)]],
          "key": [[(k, 1.0)] for _, k in pairs] + [[("is_bos", 1.0)]]}


@functools.lru_cache(maxsize=16)
def _build_program(N: int, D: int, H: int, Dh: int, F: Optional[int]) -> tuple[Program, dict]:
  """U's program for the sizes (cached: it is a pure function of them, and sharing it shares
  the compiled forward pass)."""
  cells = _cell_axes(N, D, H, Dh, F)
  G = H * N
  L = Layout()
  # -- input slots: flags, tags (a fixed function of the position), T and X --------------------
  L.add("one", 1, "1 at every position", is_input=True)
  L.add("is_bos", 1, "1 at the BOS position (the default key of every tag selection)", is_input=True)
  L.add("is_S", 1, "1 at the S cells", is_input=True)
  for cell, axes in cells.items():
    for a, size in axes:
      L.add(f"{cell}.{a}", size, f"one-hot of {a} at the {cell} cells, zero elsewhere", is_input=True)
  L.add("S.hi", G, "one-hot of (h, i) at the S cells (their softmax row)", is_input=True)
  L.add("S.hi0", G, "one-hot of (h, i) at the S cells with e = 0 (the keys of the row max)", is_input=True)
  L.add("T.wq", 1, "wq[h, d, e] at W cell (h, d, e)", is_input=True)
  L.add("T.wk", 1, "wk[h, d, e] at W cell (h, d, e)", is_input=True)
  L.add("T.wv", 1, "wv[h, d, e] at W cell (h, d, e)", is_input=True)
  L.add("T.wo", 1, "wo[h, e, d] at W cell (h, d, e)", is_input=True)
  if F is not None:
    L.add("T.w1", 1, "w1[d, f] at V cell (d, f)", is_input=True)
    L.add("T.w2", 1, "w2[f, d] at V cell (d, f)", is_input=True)
    L.add("T.b1", 1, "b1[f] at B1 cell (f)", is_input=True)
    L.add("T.b2", 1, "b2[d] at B2 cell (d)", is_input=True)
  L.add("x", 1, "X[i, d] at X cell (i, d)", is_input=True)
  # -- computed slots (each written by one layer; "at C" = its meaning at the C cells) ----------
  computed = [
      ("a_x", "X[i, d] at A (i, d, h, e)"), ("a_wq", "wq[h, d, e] at A"), ("a_wk", "wk[h, d, e] at A"),
      ("a_wv", "wv[h, d, e] at A"), ("a_wo", "wo[h, e, d] at A"),
  ]
  if F is not None:
    computed += [("f_w1", "w1[d, f] at F (i, d, f)"), ("f_w2", "w2[f, d] at F"),
                 ("hd_b1", "b1[f] at Hd (i, f)"), ("x_b2", "b2[d] at X (i, d)")]
  computed += [
      ("a_q", "X[i, d]·wq[h, d, e] at A"), ("a_k", "X[i, d]·wk[h, d, e] at A"),
      ("a_v", "X[i, d]·wv[h, d, e] at A"),
      ("s_q", "q[h, i, e] = Σ_d X[i, d] wq[h, d, e] at S (h, i, j, e)"), ("s_k", "k[h, j, e] at S"),
      ("s_v", "v[h, j, e] at S"), ("s_qk", "q[h, i, e]·k[h, j, e] at S"),
      ("score", "s_hij = Σ_e q[h, i, e] k[h, j, e] / √D_h at S"),
      ("gmin", "the minimum of `score` over all positions (≤ every s_hij; at every position)"),
      ("low", "2·gmin − 1 < every s_hij (at every position)"),
  ]
  for name, doc in computed:
    L.add(name, 1, doc)
  L.add("nonrow", G, "1 − S.hi0 (at every position)")
  L.add("mk_in", G, "S.hi0 · score: s_hij in the coordinate of its row (h, i), at the S cells with e = 0")
  L.add("mk_out", G, "nonrow · low: `low` in every other coordinate")
  computed = [
      ("rowmax", "max_j s_hij at S (h, i, j, e); 0 elsewhere"), ("z", "score − rowmax"),
      ("ez", "exp(s_hij − max_j' s_hij') at S; 1 elsewhere"), ("s_ev", "ez·v[h, j, e] at S"),
      ("a_num", "mean_j ez_hij v[h, j, e] at A (i, d, h, e)"), ("a_den", "mean_j ez_hij at A; 1 elsewhere"),
      ("a_rden", "1 / a_den"), ("a_o", "o[h, i, e] = Σ_j softmax_j(s_hi·) v[h, j, e] at A"),
      ("a_att", "o[h, i, e]·wo[h, e, d] at A"),
      ("att", "attention_layer(T, X)[i, d] = Σ_h,e o[h, i, e] wo[h, e, d] at X (i, d)"),
  ]
  if F is not None:
    computed += [
        ("y", "Y[i, d] = X[i, d] + att at X"), ("f_y", "Y[i, d] at F (i, d, f)"),
        ("f_yw", "Y[i, d]·w1[d, f] at F"),
        ("hd_pre", "Σ_d Y[i, d] w1[d, f] at Hd (i, f)"), ("hd_in", "hd_pre + b1[f] at Hd"),
        ("yb", "Y[i, d] + b2[d] at X"), ("hd_act", "relu(hd_in) at Hd"), ("f_h", "hidden[i, f] at F"),
        ("f_hw", "hidden[i, f]·w2[f, d] at F"), ("ffn", "Σ_f hidden[i, f] w2[f, d] at X"),
        ("out", "encoder_layer(T, X)[i, d] = Y + b2 + ffn at X"),
    ]
  for name, doc in computed:
    L.add(name, 1, doc)

  b = _Builder(L)
  # 1. copy T's entries to the cells that multiply with them
  heads = [
      _select([("A.i", "X.i"), ("A.d", "X.d")]) | {"routes": [("x", "a_x", 1.0)]},
      _select([("A.h", "W.h"), ("A.d", "W.d"), ("A.e", "W.e")]) | {
          "routes": [(f"T.{f}", f"a_{f}", 1.0) for f in _ATT_FIELDS]},
  ]
  if F is not None:
    heads += [
        _select([("F.d", "V.d"), ("F.f", "V.f")]) | {"routes": [("T.w1", "f_w1", 1.0), ("T.w2", "f_w2", 1.0)]},
        _select([("Hd.f", "B1.f")]) | {"routes": [("T.b1", "hd_b1", 1.0)]},
        _select([("X.d", "B2.d")]) | {"routes": [("T.b2", "x_b2", 1.0)]},
    ]
  b.attention("gather_operands", heads, "A (i, d, h, e) copies X[i, d] from X (i, d) and wq, wk, wv[h, d, e], "
              "wo[h, e, d] from W (h, d, e)" + ("; F (i, d, f) copies w1[d, f], w2[f, d] from V (d, f); "
                                                 "Hd (i, f) copies b1[f]; X (i, d) copies b2[d]" if F else ""))
  # 2-3. q, k, v: products at A, sums over d by aggregation at S
  b.product("project_products", [("a_q", "a_x", "a_wq"), ("a_k", "a_x", "a_wk"), ("a_v", "a_x", "a_wv")],
            "X[i, d]·wq[h, d, e], X[i, d]·wk[h, d, e], X[i, d]·wv[h, d, e]")
  b.attention("sum_over_d", [
      _select([("S.i", "A.i"), ("S.h", "A.h"), ("S.e", "A.e")]) | {"routes": [("a_q", "s_q", D)]},
      _select([("S.j", "A.i"), ("S.h", "A.h"), ("S.e", "A.e")]) | {
          "routes": [("a_k", "s_k", D), ("a_v", "s_v", D)]},
  ], "S (h, i, j, e): head 0 averages a_q over the D cells A (i, ·, h, e), head 1 a_k, a_v over "
     "A (j, ·, h, e); W_O = D: q[h, i, e], k[h, j, e], v[h, j, e]")
  # 4-5. scores: products at S, sums over e by aggregation at S
  b.product("score_products", [("s_qk", "s_q", "s_k")], "q[h, i, e]·k[h, j, e]")
  b.attention("sum_over_e", [
      _select([("S.h", "S.h"), ("S.i", "S.i"), ("S.j", "S.j")]) | {
          "routes": [("s_qk", "score", math.sqrt(Dh))]},
  ], "S (h, i, j, e) averages s_qk over the D_h cells S (h, i, j, ·); W_O = D_h/√D_h: s_hij")
  # 6-9. the row max (Lemma 4's shift), by the argmax of a data key, exact for every score above −2**126.
  # Both heads average tied values, and the kernel sums them before dividing by their count: the values
  # enter scaled by 1/c (a power of two ≥ the most ties, so the sum of c values of float32 magnitude
  # cannot overflow) and W_O multiplies the mean by c, exactly.
  c_min = _pow2_at_least(H * N * N * Dh)   # keys of value gmin ≠ 0: S cells (h, i, j, e)
  c_row = _pow2_at_least(N)                # keys of row (h, i): its e = 0 cells (h, i, ·, 0)
  b.attention("global_min", [{"query": [[("one", 1.0)]], "key": [[("score", -1.0)]],
                              "routes": [("score", "gmin", c_min, 1.0 / c_min)]}],
              "constant query, key −score: the mean of the minimal `score` values (0 off the S cells); "
              f"W_V = 1/{c_min}, W_O = {c_min}")
  b.linear("lower_bound", [("low", "gmin", 2.0), ("low", "one", -1.0), ("nonrow", "one", 1.0),
                           ("nonrow", "S.hi0", -1.0)],
           "low = 2·gmin − 1 (< every score: gmin ≤ 0), nonrow = 1 − S.hi0")
  b.product("row_keys", [("mk_in", "S.hi0", "score"), ("mk_out", "nonrow", "low")],
            "per row (h', i'): score in its own row's coordinate, `low` in the others")
  b.attention("row_max", [{"query": [[("S.hi", 1.0)], [("one", 1.0), ("is_S", -1.0)]],
                           "key": [[("mk_in", 1.0), ("mk_out", 1.0)], [("is_bos", 1.0)]],
                           "routes": [("score", "rowmax", c_row, 1.0 / c_row)]}],
              "query S.hi (row (h, i)), key mk_in + mk_out: keys of row (h, i) score s_hij, all others `low`; "
              f"the argmax set is the row's maxima, their mean max_j s_hij (W_V = 1/{c_row}, W_O = {c_row}). "
              "Other queries: BOS (1 − is_S)")
  # 10-12. Lemma 4: shift, exp, weighted values
  b.linear("shift", [("z", "score", 1.0), ("z", "rowmax", -1.0)], "z = score − rowmax")
  b.unary("exp", "exp", [("ez", "z")], "ez = exp(z) (Lemma 4's elementwise exponential)")
  b.product("value_products", [("s_ev", "ez", "s_v")], "ez_hij·v[h, j, e]")
  # 13-16. Lemma 4's sum and division, Lemma 5's weighted sum of values
  b.attention("sum_over_j", [
      _select([("A.i", "S.i"), ("A.h", "S.h"), ("A.e", "S.e")]) | {
          "routes": [("s_ev", "a_num", 1.0), ("ez", "a_den", 1.0)]},
  ], "A (i, d, h, e) averages s_ev and ez over the n cells S (h, i, ·, e): means, whose ratio is the "
     "softmax-weighted sum (the count n cancels)")
  b.unary("reciprocal", "reciprocal", [("a_rden", "a_den")], "1 / a_den")
  b.product("normalise", [("a_o", "a_num", "a_rden")], "o[h, i, e] = a_num / a_den")
  b.product("output_products", [("a_att", "a_o", "a_wo")], "o[h, i, e]·wo[h, e, d]")
  # 17. the output projection: sum over heads and e by aggregation
  b.attention("sum_over_heads", [
      _select([("X.i", "A.i"), ("X.d", "A.d")]) | {"routes": [("a_att", "att", H * Dh)]},
  ], "X (i, d) averages a_att over the H·D_h cells A (i, d, ·, ·); W_O = H·D_h: attention_layer(T, X)[i, d]")
  out_slot = "att"
  if F is not None:
    b.linear("residual", [("y", "x", 1.0), ("y", "att", 1.0)], "Y = X + att")
    b.attention("gather_ffn_in", [_select([("F.i", "X.i"), ("F.d", "X.d")]) | {"routes": [("y", "f_y", 1.0)]}],
                "F (i, d, f) copies Y[i, d] from X (i, d)")
    b.product("ffn_in_products", [("f_yw", "f_y", "f_w1")], "Y[i, d]·w1[d, f]")
    b.attention("sum_ffn_in", [_select([("Hd.i", "F.i"), ("Hd.f", "F.f")]) | {
        "routes": [("f_yw", "hd_pre", D)]}],
                "Hd (i, f) averages f_yw over the D cells F (i, ·, f); W_O = D")
    b.linear("ffn_bias", [("hd_in", "hd_pre", 1.0), ("hd_in", "hd_b1", 1.0), ("yb", "y", 1.0),
                          ("yb", "x_b2", 1.0)],
             "hd_in = hd_pre + b1[f]; yb = Y + b2[d]")
    b.unary("relu", "relu", [("hd_act", "hd_in")], "hidden = relu(hd_in)")
    b.attention("gather_hidden", [_select([("F.i", "Hd.i"), ("F.f", "Hd.f")]) | {
        "routes": [("hd_act", "f_h", 1.0)]}], "F (i, d, f) copies hidden[i, f] from Hd (i, f)")
    b.product("ffn_out_products", [("f_hw", "f_h", "f_w2")], "hidden[i, f]·w2[f, d]")
    b.attention("sum_ffn_out", [_select([("X.i", "F.i"), ("X.d", "F.d")]) | {"routes": [("f_hw", "ffn", F)]}],
                "X (i, d) averages f_hw over the F cells F (i, d, ·); W_O = F")
    b.linear("ffn_residual", [("out", "yb", 1.0), ("out", "ffn", 1.0)],
             "out = Y + b2 + ffn = encoder_layer(T, X)")
    out_slot = "out"
  program = Program(L, b.layers, b.weights)
  return program, {"cells": cells, "out_slot": out_slot}


def _param_shapes(D, H, Dh, F):
  shapes = {"wq": (H, D, Dh), "wk": (H, D, Dh), "wv": (H, D, Dh), "wo": (H, Dh, D)}
  if F is not None:
    shapes.update({"w1": (D, F), "b1": (F,), "w2": (F, D), "b2": (D,)})
  return shapes


# (slot, cell type, axes of T's matrix in the cell's index order)
_PARAM_CELLS = {"wq": ("T.wq", "W", "h d e"), "wk": ("T.wk", "W", "h d e"), "wv": ("T.wv", "W", "h d e"),
                "wo": ("T.wo", "W", "h e d"), "w1": ("T.w1", "V", "d f"), "w2": ("T.w2", "V", "f d"),
                "b1": ("T.b1", "B1", "f"), "b2": ("T.b2", "B2", "d")}
_CELL_DOCS = {
    "BOS": "the default key: is_bos = 1",
    "W": "T.wq, T.wk, T.wv = wq, wk, wv[h, d, e]; T.wo = wo[h, e, d]",
    "V": "T.w1 = w1[d, f]; T.w2 = w2[f, d]", "B1": "T.b1 = b1[f]", "B2": "T.b2 = b2[d]",
    "X": "x = X[i, d]; at the end T(X)[i, d]",
    "A": "products X[i, d]·w[h, d, e] and o[h, i, e]·wo[h, e, d]",
    "S": "products q[h, i, e]·k[h, j, e] and exp(s_hij − max_j' s_hij')·v[h, j, e]",
    "Hd": "the hidden unit (i, f)", "F": "products Y[i, d]·w1[d, f] and hidden[i, f]·w2[f, d]",
}


class Simulator:
  """U for inputs of length ``n <= max_len``: ``Simulator(params, X)`` = ``T(X)``.

  Built by :func:`build_simulator` from sizes only. ``weights`` (the fixed matrices:
  ``{layer: {"wq", "wk", "wv", "wo"}}`` for AHAT layers, ``{layer: {"entries"}}`` for linear ones:
  the values of their terms), ``wiring`` (the coordinates each product / unary layer reads and
  writes, and each linear term's ``rows, cols``), ``layers`` (one
  :class:`~jaxmem.machine.LayerInfo` per layer), ``num_heads`` (AHAT heads of U in
  all), ``heads_per_layer``, ``num_params`` (entries of the fixed matrices), ``num_nonzero``,
  ``width`` (residual width), ``sequence_length(n)`` (positions for ``X [n, D]``),
  ``layout`` (:class:`SimulatorLayout`), ``encode(params, X)`` → U's input sequence
  ``[sequence_length(n), width]``, ``run_sequence(seq)`` → the output sequence,
  ``decode(seq)`` → ``[n, D]``. ``sizes`` holds ``max_len, d_model, num_heads`` (of T),
  ``head_dim``, ``ffn_dim``."""

  def __init__(self, max_len: int, d_model: int, num_heads: int, head_dim: int, ffn_dim: Optional[int]):
    self.max_len, self.d_model, self.target_heads, self.head_dim, self.ffn_dim = (
        max_len, d_model, num_heads, head_dim, ffn_dim)
    self._program, meta = _build_program(max_len, d_model, num_heads, head_dim, ffn_dim)
    self._cells, self._out_slot = meta["cells"], meta["out_slot"]
    self._shapes = _param_shapes(d_model, num_heads, head_dim, ffn_dim)
    self._lengths = {_sequence_length(self._cells, n): n for n in range(1, max_len + 1)}
    self._base: dict[int, np.ndarray] = {}

  # -- description ----------------------------------------------------------------------------
  @property
  def sizes(self) -> dict:
    return {"max_len": self.max_len, "d_model": self.d_model, "num_heads": self.target_heads,
            "head_dim": self.head_dim, "ffn_dim": self.ffn_dim}

  @property
  def program(self) -> Program:
    return self._program

  @property
  def weights(self) -> dict:
    """``{layer: {name: array}}``: the fixed weights of U's AHAT (``wq, wk, wv, wo``) and
    linear (``entries``: the values of ``M``'s terms) layers (a fresh dict of the same immutable
    arrays)."""
    return {name: dict(w) for name, w in self._program.weights.items()}

  @property
  def wiring(self) -> dict:
    """``{layer: {"out", "a"[, "b"]}}``: the residual coordinates of each product / unary layer
    (``out_k = a_k · b_k`` or ``op(a_k)``), and ``{layer: {"rows", "cols"}}`` of each linear layer's
    terms (``M[rows[k], cols[k]] = entries[k]``); numpy copies."""
    return {name: {k: v.copy() for k, v in w.items()} for name, w in self._program.wiring.items()}

  @property
  def layers(self) -> list[LayerInfo]:
    return list(self._program.infos)

  @property
  def layer_counts(self) -> dict[str, int]:
    """Layers of each kind: ``{"ahat", "linear", "product", "unary"}`` → count."""
    kinds = [i.kind for i in self._program.infos]
    return {k: kinds.count(k) for k in ("ahat", "linear", "product", "unary")}

  @property
  def num_heads(self) -> int:
    return self._program.num_heads

  @property
  def heads_per_layer(self) -> tuple[int, ...]:
    return tuple(i.num_heads for i in self._program.infos)

  @property
  def num_params(self) -> int:
    return self._program.num_params

  @property
  def num_nonzero(self) -> int:
    return self._program.num_nonzero

  @property
  def width(self) -> int:
    return self._program.layout.width

  def _check_n(self, n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= self.max_len:
      raise ValueError(f"`n` must be an integer in 1..max_len={self.max_len}, got {n!r}.")
    return int(n)

  def sequence_length(self, n: Optional[int] = None) -> int:
    """Positions of U's input sequence for ``X [n, D]`` (``n = max_len`` by default: the padded
    length every run uses)."""
    return _sequence_length(self._cells, self.max_len if n is None else self._check_n(n))

  def cell_positions(self, n: int) -> dict[str, slice]:
    """``{cell type: slice of positions}`` of the sequence for ``X [n, D]``, in sequence order."""
    n = self._check_n(n)
    out, start = {}, 0
    for cell, axes in self._cells.items():
      count = len(_cell_indices(axes, n))
      out[cell] = slice(start, start + count)
      start += count
    return out

  @property
  def layout(self) -> SimulatorLayout:
    L = self._program.layout
    counts = {"BOS": "1", "W": "H·D·D_h", "V": "D·F", "B1": "F", "B2": "D", "X": "n·D", "A": "n·D·H·D_h",
              "S": "H·n²·D_h", "Hd": "n·F", "F": "n·D·F"}
    positions = tuple((f"{c} ({' '.join(a for a, _ in axes)})" if axes else c, counts[c], _CELL_DOCS[c])
                      for c, axes in self._cells.items())
    return SimulatorLayout(positions=positions, slots=L.slots,
                           params={f: _PARAM_CELLS[f] for f in self._shapes}, width=L.width,
                           input_width=L.input_width, output_slot=self._out_slot)

  def describe(self) -> str:
    return self._program.describe()

  def __repr__(self) -> str:
    kind = "encoder" if self.ffn_dim is not None else "attention"
    return (f"Simulator({kind}, max_len={self.max_len}, d_model={self.d_model}, num_heads={self.target_heads}, "
            f"head_dim={self.head_dim}, ffn_dim={self.ffn_dim}; U: {len(self.layers)} layers, "
            f"{self.num_heads} AHAT heads, width {self.width}, {self.sequence_length()} positions at n = "
            f"{self.max_len}, {self.num_params} fixed weights)")

  # -- data in and out ------------------------------------------------------------------------
  def _check(self, params, X) -> int:
    kw = dict(d_model=self.d_model, num_heads=self.target_heads, head_dim=self.head_dim)
    if self.ffn_dim is None:
      if isinstance(params, EncoderParams):
        raise ValueError("`params` is an EncoderParams but this simulator was built without ffn_dim "
                         "(it simulates attention layers: pass an AttentionParams).")
      check_attention_params(params, **kw)
    else:
      if isinstance(params, AttentionParams):
        raise ValueError(f"`params` is an AttentionParams but this simulator was built with ffn_dim="
                         f"{self.ffn_dim} (it simulates encoder layers: pass an EncoderParams).")
      check_encoder_params(params, ffn_dim=self.ffn_dim, **kw)
    n, D = check_matrix("X", X)
    if D > self.d_model:
      raise ValueError(f"`X` is wider than d_model: shape {(n, D)}, d_model={self.d_model}.")
    if D != self.d_model:
      raise ValueError(f"`X` must have d_model={self.d_model} columns, got shape {(n, D)}.")
    if n > self.max_len:
      raise ValueError(f"`X` is longer than max_len: {n} rows > max_len={self.max_len}.")
    _check_scores(params if self.ffn_dim is None else params.att, X)
    return n

  def _tags(self, n: int) -> np.ndarray:
    """The input sequence for length ``n`` with every flag and tag set and T, X zero (cached)."""
    if n not in self._base:
      L = self._program.layout
      seq = np.zeros((self.sequence_length(n), L.width), np.float32)
      seq[:, L["one"].start] = 1.0
      pos = self.cell_positions(n)
      seq[pos["BOS"], L["is_bos"].start] = 1.0
      for cell, axes in self._cells.items():
        idx = _cell_indices(axes, n)
        rows = np.arange(pos[cell].start, pos[cell].stop)
        for k, (a, _) in enumerate(axes):
          seq[rows, L[f"{cell}.{a}"].start + idx[:, k]] = 1.0
      S = _cell_indices(self._cells["S"], n)   # columns h, i, j, e
      rows = np.arange(pos["S"].start, pos["S"].stop)
      seq[rows, L["is_S"].start] = 1.0
      row_of = S[:, 0] * self.max_len + S[:, 1]
      seq[rows, L["S.hi"].start + row_of] = 1.0
      first = S[:, 3] == 0
      seq[rows[first], L["S.hi0"].start + row_of[first]] = 1.0
      seq.flags.writeable = False
      self._base[n] = seq
    return self._base[n]

  def encode(self, params, X) -> jax.Array:
    """U's input sequence ``[sequence_length(n), width]``: flags and tags, T's entries at the
    ``W`` (``V``, ``B1``, ``B2``) cells and X's at the ``X`` cells, every other slot zero."""
    n = self._check(params, X)
    fields = dict(zip(_ATT_FIELDS, params if self.ffn_dim is None else params.att, strict=True))
    if self.ffn_dim is not None:
      fields.update(zip(_FFN_FIELDS, params[1:], strict=True))
    base, L, pos = self._tags(n), self._program.layout, self.cell_positions(n)
    traced = any(isinstance(a, jax.core.Tracer) for a in (X, *fields.values()))
    xp = jnp if traced else np  # host-side numpy unless called under a jax transformation
    columns = [("x", pos["X"], xp.asarray(X, xp.float32))]
    for f, val in fields.items():
      slot, cell, axes = _PARAM_CELLS[f]
      val = xp.asarray(val, xp.float32)
      if axes in ("h e d", "f d"):   # read transposed: the cell's index order is (h, d, e) / (d, f)
        val = xp.swapaxes(val, -1, -2)
      columns.append((slot, pos[cell], val))
    if xp is np:
      seq = base.copy()
      for slot, rows, val in columns:
        seq[rows, L[slot].start] = val.reshape(-1)
      return jnp.asarray(seq)
    seq = jnp.asarray(base)
    for slot, rows, val in columns:
      seq = seq.at[rows, L[slot].start].set(val.reshape(-1))
    return seq

  def run_sequence(self, seq, *, pad: bool = True) -> jax.Array:
    """Runs U's layers on an input sequence ``[P, width]`` with ``P = sequence_length(n)`` for
    some ``n <= max_len``, and returns the output sequence ``[P, width]`` (the final residual).

    ``pad=True`` (default) runs it padded to ``sequence_length(max_len)`` positions with a key
    mask, so one compiled program serves every length: padded positions are invisible to every
    AHAT head and reset to zero after each layer, and position-wise layers never mix positions,
    so the real positions compute what the unpadded sequence computes (tested). ``pad=False``
    runs the ``P`` positions as they are (one compilation per length)."""
    shape = tuple(np.shape(seq))
    if len(shape) != 2 or shape[1] != self.width or shape[0] not in self._lengths:
      raise ValueError(f"`seq` must have shape [P, {self.width}] with P = sequence_length(n) for some "
                       f"n in 1..{self.max_len} ({sorted(self._lengths)}), got {shape}.")
    check_finite_array("seq", seq)
    if not pad:
      return self._program.run(seq)
    P, full = shape[0], self.sequence_length()
    xp = jnp if isinstance(seq, jax.core.Tracer) else np
    padded = xp.concatenate([xp.asarray(seq, xp.float32), xp.zeros((full - P, self.width), xp.float32)], 0)
    out = self._program.run(padded, mask=np.arange(full) < P)
    return out[:P] if xp is jnp else jnp.asarray(np.asarray(out)[:P])

  def decode(self, out_seq) -> jax.Array:
    """``T(X)`` ``[n, D]`` from U's output sequence: the output slot at the ``X`` cells."""
    P = int(np.shape(out_seq)[0])
    if P not in self._lengths:
      raise ValueError(f"`out_seq` must have P = sequence_length(n) positions for some n in 1..{self.max_len}, "
                       f"got {P}.")
    n = self._lengths[P]
    rows, col = self.cell_positions(n)["X"], self._program.layout[self._out_slot].start
    if isinstance(out_seq, jax.core.Tracer):
      return out_seq[rows, col].reshape(n, self.d_model)
    return jnp.asarray(np.asarray(out_seq)[rows, col].reshape(n, self.d_model))

  def __call__(self, params, X) -> jax.Array:
    return self.decode(self.run_sequence(self.encode(params, X)))


#: U's row max needs ``low = 2·min(score) − 1`` to be a finite float32: every score must lie above this.
MIN_SCORE = -(2.0 ** 126)


def _check_scores(att, X) -> None:
  """ValueError if a score ``q·k / √D_h`` of ``T`` on ``X`` (computed in float64) is at or below
  :data:`MIN_SCORE`, where U's row max is undefined (skipped under tracing, like the finiteness checks)."""
  if not all(is_concrete(a) for a in (X, att.wq, att.wk)):
    return
  X64 = np.asarray(X, np.float64)
  q = np.einsum("nd,hde->hne", X64, np.asarray(att.wq, np.float64))
  k = np.einsum("nd,hde->hne", X64, np.asarray(att.wk, np.float64))
  low = float(np.min(np.einsum("hne,hme->hnm", q, k))) / math.sqrt(q.shape[2])
  if low <= MIN_SCORE:
    raise ValueError(f"`params` and `X` give an attention score of {low:.3g}, at or below −2**126 "
                     f"({MIN_SCORE:.3g}): U's row max needs 2·min(score) − 1 to be a finite float32 (its "
                     "`low` bound); scale `params.wq`, `params.wk` or `X` down.")


def build_simulator(max_len: int, d_model: int, num_heads: int, head_dim: int, *,
                    ffn_dim: Optional[int] = None) -> Simulator:
  """U for every ``T`` with ``H = num_heads`` heads of width ``head_dim`` on ``d_model``-wide
  rows, and every input length ``n <= max_len`` (an encoder layer when ``ffn_dim`` is given).

  Its weights depend only on these sizes; T enters only through U's input sequence."""
  for name, v in (("max_len", max_len), ("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim)):
    check_positive_int(name, v)
  if ffn_dim is not None:
    check_positive_int("ffn_dim", ffn_dim)
  return Simulator(max_len, d_model, num_heads, head_dim, ffn_dim)


def random_params(rng: np.random.Generator, d_model: int, num_heads: int, head_dim: int,
                  ffn_dim: Optional[int] = None, scale: float = 1.0):
  """Random float32 ``AttentionParams`` (or ``EncoderParams``): entries N(0, 1)/√D, times ``scale``
  for ``wq`` and ``wk``."""
  D, H, Dh = d_model, num_heads, head_dim
  g = lambda *s: (rng.standard_normal(s) / math.sqrt(s[-2] if len(s) > 1 else D)).astype(np.float32)
  att = AttentionParams(g(H, D, Dh) * np.float32(scale), g(H, D, Dh) * np.float32(scale), g(H, D, Dh),
                        g(H, Dh, D))
  if ffn_dim is None:
    return att
  return EncoderParams(att, g(D, ffn_dim), g(ffn_dim), g(ffn_dim, D), g(D))


class ErrorRow(NamedTuple):
  heads: int
  n: int
  max_abs_err: float
  max_abs_out: float
  rel_err: float
  ref_rel_err: float = float("nan")   # with reference="float64": float32 T(X)'s own error, the same way


def error_table(max_len: int, d_model: int, heads_list: Sequence[int], head_dim: int,
                n_values: Sequence[int], trials: int, seed: int, *, reference: str = "attention_layer",
                ffn_dim: Optional[int] = None, scale: float = 1.0) -> list[ErrorRow]:
  """U's error against the direct computation: one row per ``(heads, n)``.

  For each ``H`` in ``heads_list`` one simulator is built and serves ``trials`` random ``T``
  (``random_params``: N(0, 1)/√D entries, ``wq, wk`` times ``scale``) with random ``X [n, D]``
  (N(0, 1)) for each ``n`` in ``n_values``. ``max_abs_err`` and ``max_abs_out`` are maxima over
  the trials of ``max|U(T, X) − ref|`` and ``max|ref|``; ``rel_err = max_abs_err / max_abs_out``.
  ``reference``: ``"attention_layer"`` (float32, :func:`attention_layer` / :func:`encoder_layer`)
  or ``"float64"`` (the numpy float64 equation; then ``ref_rel_err`` is the float32 layer's own
  error against it, measured the same way: what float32 arithmetic costs on those inputs, e.g. with
  saturating scores, whose float32 rounding moves the softmax weights)."""
  if reference not in ("attention_layer", "float64"):
    raise ValueError(f"`reference` must be 'attention_layer' or 'float64', got {reference!r}.")
  check_positive_int("trials", trials)
  for n in n_values:
    if not isinstance(n, (int, np.integer)) or not 1 <= n <= max_len:
      raise ValueError(f"`n_values` must lie in 1..max_len={max_len}, got {n!r}.")
  rng = np.random.default_rng(seed)
  rows = []
  for H in heads_list:
    sim = build_simulator(max_len, d_model, int(H), head_dim, ffn_dim=ffn_dim)
    for n in n_values:
      err, top, ref_err = 0.0, 0.0, 0.0
      for _ in range(trials):
        params = random_params(rng, d_model, int(H), head_dim, ffn_dim, scale)
        X = rng.standard_normal((int(n), d_model)).astype(np.float32)
        got = np.asarray(sim(params, X), np.float64)
        layer = attention_layer if ffn_dim is None else encoder_layer
        f32 = np.asarray(layer(params, X), np.float64)
        if reference == "float64":
          ref = attention_layer_numpy(params, X) if ffn_dim is None else encoder_layer_numpy(params, X)
          ref_err = max(ref_err, float(np.max(np.abs(f32 - ref))))
        else:
          ref = f32
        err = max(err, float(np.max(np.abs(got - ref))))
        top = max(top, float(np.max(np.abs(ref))))
      rel = (lambda e: e / top if top > 0 else float("nan"))
      rows.append(ErrorRow(int(H), int(n), err, top, rel(err),
                           rel(ref_err) if reference == "float64" else float("nan")))
  return rows
