"""The residual-stream machine of AHAT programs: the universal simulator U and the exact constructions
(:mod:`jaxmem.simulator`) are written in it, and the RASP compiler's models run on it
(:mod:`jaxmem.rasp.model_to_machine`).

A :class:`Program` is what the paper calls a transformer built from AHAT encoder layers
(Dutta, Chakrabarty, Ansari & Das, "On the Existence of Universal Simulators of Attention",
arXiv:2506.18739 v2, §3 and the RASP model it compiles from): a residual stream of named
*slots* (:class:`Layout`) and a list of layers. Every layer adds its output to the residual,
``x ← x + layer(x)``, and writes only fresh slots.

* :class:`AHATLayer` — average hard attention with **fixed** weight matrices
  ``W_Q, W_K [width, H·d_k]``, ``W_V [width, H·d_v]``, ``W_O [H·d_v, width]`` applied to the
  residual stream: ``x ← x + concat_h(AHAT_h(x W_Q, x W_K, x W_V)) W_O``. The layer is a
  call to :func:`jaxmem.kernels.ahat.ahat_sublayer` (the AHAT kernel between fixed projections,
  the same sublayer the RASP compiler's models run) — nothing else. The weights are numpy
  arrays built once from sizes (never from data) and are stored in :attr:`Program.weights`,
  over the layer's *span* of residual coordinates (all of them by default; a compiled model's
  heads span its own residual, not the hidden slots after it). Which slots a layer reads and
  writes is derived from the non-zero rows of ``W_Q, W_K, W_V`` and the non-zero columns of
  ``W_O``, so the description cannot drift from the weights.

The position-wise layers come in three *restricted* kinds, each a piece of data run by one
shared piece of code that can do nothing else (the universal simulator and the constructions
use only these; there is no free-form map of a position, which could compute anything):

* :class:`LinearLayer` — ``x ← x + x M`` with a fixed matrix ``M [width, width]``
  (:class:`LinearWeights`, stored in :attr:`Program.weights` like the attention weights): what
  an MLP's or a projection's weights do. ``M`` is stored sparse — its slot-to-slot terms as
  coordinate entries, an MLP's weight matrices as dense blocks — never as ``width²`` numbers, so a
  program stores what its layers use (:attr:`Program.num_params`). Reads and writes are derived
  from ``M``'s non-zero entries (:meth:`Program.linear_entries`).
* :class:`ProductLayer` — ``out_k = a_k · b_k``: each output coordinate is the product of two
  residual coordinates of the same position (a size-1 operand slot is broadcast).
* :class:`UnaryLayer` — ``out_k = op(a_k)`` for ``op`` in :data:`UNARY_OPS` (``exp``,
  ``reciprocal``, ``relu``): each output coordinate reads one coordinate.

The coordinates a product or unary layer reads and writes are resolved into integer index
arrays once (:attr:`Program.wiring`), so a test can check that every output coordinate reads
exactly two (one) scalars.

Every slot is written by at most one layer and input slots by none, so "adding to the
residual" is the same as "writing a fresh slot" and each slot has one meaning
(:meth:`Layout.table` documents them). A program built with ``single_assignment=False`` may
add to a slot again (a compiled RASP model's MLP removes the default its head wrote at BOS:
:func:`jaxmem.rasp.model_to_machine.to_machine` runs compiled models on this machine). Arithmetic is
float32 with ``precision="highest"``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.arrays import device_array
from jaxmem.kernels.ahat import ahat_sublayer

__all__ = [
    "AHATLayer", "AttentionWeights", "LayerInfo", "Layout", "LinearLayer", "LinearWeights", "ProductLayer",
    "Program", "SlotInfo", "UNARY_OPS", "UnaryLayer",
]

HIGHEST = jax.lax.Precision.HIGHEST

#: The elementwise maps a :class:`UnaryLayer` may apply (one scalar in, one scalar out).
UNARY_OPS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "exp": jnp.exp,
    "reciprocal": jnp.reciprocal,
    "relu": jax.nn.relu,
}


class SlotInfo(NamedTuple):
  name: str
  start: int
  size: int
  is_input: bool
  doc: str


class Layout:
  """Named slots of the residual stream, ``name -> [start, start + size)``, in creation order."""

  def __init__(self):
    self._slots: dict[str, SlotInfo] = {}
    self.width = 0

  def add(self, name: str, size: int, doc: str, *, is_input: bool = False) -> None:
    if name in self._slots:
      raise ValueError(f"slot {name!r} defined twice")
    if size <= 0:
      raise ValueError(f"slot {name!r} must have a positive size, got {size}")
    self._slots[name] = SlotInfo(name, self.width, int(size), is_input, doc)
    self.width += int(size)

  def __contains__(self, name: str) -> bool:
    return name in self._slots

  def __getitem__(self, name: str) -> SlotInfo:
    return self._slots[name]

  def slice(self, name: str) -> slice:
    s = self._slots[name]
    return slice(s.start, s.start + s.size)

  @property
  def slots(self) -> tuple[SlotInfo, ...]:
    return tuple(self._slots.values())

  @property
  def input_width(self) -> int:
    """Width of the leading run of input slots (all input slots come first)."""
    return sum(s.size for s in self.slots if s.is_input)

  def slot_of(self, coord: int) -> str:
    for s in self.slots:
      if s.start <= coord < s.start + s.size:
        return s.name
    raise IndexError(coord)

  def table(self) -> str:
    lines = ["| slot | coordinates | size | input | meaning |", "|---|---|---|---|---|"]
    for s in self.slots:
      lines.append(f"| `{s.name}` | {s.start}..{s.start + s.size - 1} | {s.size} | "
                   f"{'yes' if s.is_input else ''} | {s.doc} |")
    return "\n".join(lines)

  def __repr__(self) -> str:
    return f"Layout(width={self.width}, slots={[s.name for s in self.slots]})"


class LayerInfo(NamedTuple):
  """What one layer of a :class:`Program` is: ``kind`` is ``"ahat"`` (attention with fixed
  weights, ``num_heads`` heads of key width ``key_dim`` and value width ``value_dim``),
  ``"linear"``, ``"product"`` or ``"unary"`` (``op`` names the map); ``num_heads == 0`` for all
  but ``"ahat"``."""
  name: str
  kind: str
  num_heads: int
  key_dim: int
  value_dim: int
  reads: tuple[str, ...]
  writes: tuple[str, ...]
  computes: str
  op: str = ""


@dataclasses.dataclass(frozen=True)
class AHATLayer:
  """``causal``: each query sees only the positions at or before it (a compiled causal RASP model's
  heads); U and the constructions see every position."""
  name: str
  num_heads: int
  key_dim: int
  value_dim: int
  computes: str
  tol: float = 0.0
  causal: bool = False


@dataclasses.dataclass(frozen=True)
class LinearLayer:
  """``x ← x + x M``: ``M [width, width]`` is fixed, stored sparse in ``Program.weights[name]`` (built by
  :class:`LinearWeights`; :meth:`Program.linear_entries` lists its non-zero entries)."""
  name: str
  computes: str


@dataclasses.dataclass(frozen=True)
class ProductLayer:
  """``out_k = a_k · b_k`` for each ``(out, a, b)`` in ``terms`` (slot names): ``a`` and ``b`` have
  ``out``'s size, or size 1 (then that scalar multiplies every coordinate)."""
  name: str
  terms: tuple[tuple[str, str, str], ...]
  computes: str


@dataclasses.dataclass(frozen=True)
class UnaryLayer:
  """``out_k = op(a_k)`` for each ``(out, a)`` in ``terms`` (slots of one size); ``op`` is a key of
  :data:`UNARY_OPS`."""
  name: str
  op: str
  terms: tuple[tuple[str, str], ...]
  computes: str

  def __post_init__(self):
    if self.op not in UNARY_OPS:
      raise ValueError(f"`op` must be one of {sorted(UNARY_OPS)}, got {self.op!r}.")


class AttentionWeights:
  """Builder of one AHAT layer's fixed matrices, addressed by slot names and head numbers.

  Head ``h`` owns columns ``[h·d_k, (h+1)·d_k)`` of ``W_Q`` and ``W_K`` and columns
  ``[h·d_v, (h+1)·d_v)`` of ``W_V`` (rows of ``W_O``). ``span = (start, stop)``: the residual
  coordinates the layer reads and writes (default: all of them); the matrices hold only those rows
  (``W_Q, W_K, W_V [stop − start, H·d]``) and columns (``W_O [H·d_v, stop − start]``), so a layer
  over a few slots of a wide residual stores what it uses."""

  def __init__(self, layout: Layout, num_heads: int, key_dim: int, value_dim: int, *,
               span: Optional[tuple[int, int]] = None):
    self.layout, self.H, self.dk, self.dv = layout, num_heads, key_dim, value_dim
    start, stop = (0, layout.width) if span is None else (int(span[0]), int(span[1]))
    if not 0 <= start < stop <= layout.width:
      raise ValueError(f"`span` must satisfy 0 <= start < stop <= width={layout.width}, got {span!r}")
    self.span = (start, stop)
    S = stop - start
    self.wq = np.zeros((S, num_heads * key_dim), np.float32)
    self.wk = np.zeros((S, num_heads * key_dim), np.float32)
    self.wv = np.zeros((S, num_heads * value_dim), np.float32)
    self.wo = np.zeros((num_heads * value_dim, S), np.float32)

  def _block(self, mat, slot, head, width, start, matrix, slot_start, into_slot):
    m = np.atleast_2d(np.asarray(matrix, np.float32))
    s = self.layout[slot]
    if not 0 <= head < self.H:
      raise IndexError(f"head {head} of {self.H}")
    head_n, slot_n = (m.shape[0], m.shape[1]) if into_slot else (m.shape[1], m.shape[0])
    if start + head_n > width or slot_start + slot_n > s.size:
      raise ValueError(f"block {m.shape} does not fit slot {slot!r} (size {s.size}) / head width {width}")
    h0, s0 = head * width + start, s.start + slot_start - self.span[0]
    if s0 < 0 or s0 + slot_n > self.span[1] - self.span[0]:
      raise ValueError(f"slot {slot!r} lies outside the layer's span {self.span}")
    if into_slot:  # W_O: head coordinates (rows) -> slot coordinates (columns)
      mat[h0:h0 + head_n, s0:s0 + slot_n] += m
    else:          # W_Q / W_K / W_V: slot coordinates (rows) -> head coordinates (columns)
      mat[s0:s0 + slot_n, h0:h0 + head_n] += m

  def query(self, head: int, slot: str, matrix, key_start: int = 0, slot_start: int = 0) -> None:
    """``q_head[key_start:] += x[slot][slot_start:] @ matrix``."""
    self._block(self.wq, slot, head, self.dk, key_start, matrix, slot_start, False)

  def key(self, head: int, slot: str, matrix, key_start: int = 0, slot_start: int = 0) -> None:
    """``k_head[key_start:] += x[slot][slot_start:] @ matrix``."""
    self._block(self.wk, slot, head, self.dk, key_start, matrix, slot_start, False)

  def value(self, head: int, slot: str, matrix, value_start: int = 0, slot_start: int = 0) -> None:
    """``v_head[value_start:] += x[slot][slot_start:] @ matrix``."""
    self._block(self.wv, slot, head, self.dv, value_start, matrix, slot_start, False)

  def output(self, head: int, slot: str, matrix, value_start: int = 0, slot_start: int = 0) -> None:
    """``x[slot][slot_start:] += out_head[value_start:] @ matrix``."""
    self._block(self.wo, slot, head, self.dv, value_start, matrix, slot_start, True)

  def arrays(self) -> dict[str, np.ndarray]:
    return {"wq": self.wq, "wk": self.wk, "wv": self.wv, "wo": self.wo}


class LinearWeights:
  """Builder of one :class:`LinearLayer`'s fixed matrix ``M [width, width]`` (``x ← x + x M``), stored
  sparse: the non-zero entries of slot-to-slot terms (``rows, cols, values``: what U and the
  constructions use, a few entries per output) and dense *blocks* (an MLP's weight matrices: a block
  reads any residual coordinates ``rows`` and writes the contiguous columns ``[col_start, col_start +
  k)``). ``M`` is their sum; nothing else is stored, so the parameters are the entries and the blocks'
  sizes, not ``width²``."""

  def __init__(self, layout: Layout):
    self.layout = layout
    self._entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    self.blocks: list[tuple[np.ndarray, int, np.ndarray]] = []
    self.biases: dict[int, tuple[int, np.ndarray]] = {}   # block index -> (coordinate of a constant 1, bias)

  def add(self, out: str, src: str, coeff: float = 1.0) -> None:
    """``x[out]_k += coeff · x[src]_k`` (``src`` of ``out``'s size), or ``coeff · x[src]_0`` for
    every ``k`` (``src`` of size 1)."""
    o, i = self.layout[out], self.layout[src]
    if i.size not in (1, o.size):
      raise ValueError(f"slot {src!r} (size {i.size}) does not fit slot {out!r} (size {o.size})")
    rows = i.start + (np.arange(o.size) if i.size > 1 else np.zeros(o.size, int))
    self.add_entries(rows, o.start + np.arange(o.size), np.full(o.size, coeff, np.float32))

  def add_entries(self, rows, cols, values) -> None:
    """``M[rows[k], cols[k]] += values[k]`` (residual coordinates; repeated pairs add up)."""
    rows, cols = np.asarray(rows, np.int64).reshape(-1), np.asarray(cols, np.int64).reshape(-1)
    values = np.asarray(values, np.float32).reshape(-1)
    if not rows.shape == cols.shape == values.shape:
      raise ValueError(f"`rows`, `cols` and `values` must have one length, got {rows.shape}, {cols.shape}, "
                       f"{values.shape}")
    W = self.layout.width
    if rows.size and (min(rows.min(), cols.min()) < 0 or max(rows.max(), cols.max()) >= W):
      raise ValueError(f"an entry lies outside the residual of width {W}")
    self._entries.append((rows, cols, values))

  def add_block(self, rows, col_start: int, matrix, bias=None, one=None) -> None:
    """``M[rows, col_start : col_start + k] += matrix`` for ``matrix [len(rows), k]``: ``x[..., col_start:
    col_start + k] += x[..., rows] @ matrix`` (``rows``: residual coordinates, distinct, or a slot name).

    ``bias [k]`` with ``one`` (a slot of size 1 or a coordinate that holds 1): ``M[one, cols] += bias``,
    computed as ``x[..., rows] @ matrix + x[..., one] · bias`` — the product first, then the bias, in
    the order of a dense layer's ``h @ W + b`` (float32 sums in another order round differently)."""
    rows = np.r_[self.layout.slice(rows)] if isinstance(rows, str) else np.asarray(rows, np.int64).reshape(-1)
    m = np.asarray(matrix, np.float32)
    W = self.layout.width
    if m.ndim != 2 or m.shape[0] != rows.size or m.size == 0:
      raise ValueError(f"`matrix` must have shape [{rows.size}, k > 0] (one row per coordinate of `rows`), "
                       f"got {m.shape}")
    if len(np.unique(rows)) != rows.size or rows.min() < 0 or rows.max() >= W:
      raise ValueError(f"`rows` must be distinct coordinates of the residual of width {W}")
    if col_start < 0 or col_start + m.shape[1] > W:
      raise ValueError(f"`col_start`: columns {col_start}..{col_start + m.shape[1] - 1} lie outside the "
                       f"residual of width {W}")
    if (bias is None) != (one is None):
      raise ValueError("`bias` and `one` go together: a bias is added as x[one] · bias")
    if bias is not None:
      b = np.asarray(bias, np.float32).reshape(-1)
      if b.shape != (m.shape[1],):
        raise ValueError(f"`bias` must have shape [{m.shape[1]}] (one value per column), got {b.shape}")
      o = self.layout[one].start if isinstance(one, str) else int(one)
      if not 0 <= o < W:
        raise ValueError(f"`one` must be a coordinate of the residual of width {W}, got {o}")
      self.biases[len(self.blocks)] = (o, b.copy())
    self.blocks.append((rows.astype(np.int32), int(col_start), m.copy()))

  def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The slot-to-slot terms as ``(rows, cols, values)``: repeated pairs summed, zeros dropped, sorted by
    ``(col, row)`` (the blocks are not included: :meth:`Program.linear_entries` gives all of ``M``)."""
    if not self._entries:
      return np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32)
    rows, cols, vals = (np.concatenate(a) for a in zip(*self._entries, strict=True))
    return _sum_duplicates(rows, cols, vals)


def _sum_duplicates(rows, cols, vals) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Entries with repeated ``(row, col)`` summed (in float32, in the order given), zeros dropped, sorted
  by ``(col, row)``."""
  order = np.lexsort((rows, cols))
  rows, cols, vals = rows[order], cols[order], vals[order]
  first = np.r_[True, (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])] if len(rows) else np.zeros(0, bool)
  rows, cols = rows[first], cols[first]
  vals = np.add.reduceat(vals, np.flatnonzero(first)).astype(np.float32) if len(vals) else vals
  keep = vals != 0
  return rows[keep].astype(np.int32), cols[keep].astype(np.int32), vals[keep].astype(np.float32)


def _resolve_elementwise(layout: Layout, layer) -> dict[str, np.ndarray]:
  """Coordinates of a product / unary layer: ``{"out", "a"[, "b"]}`` integer arrays, one entry per
  output coordinate (``out_k = a_k · b_k`` or ``op(a_k)``)."""
  cols: dict[str, list] = {"out": [], "a": []} | ({"b": []} if isinstance(layer, ProductLayer) else {})
  width = 3 if isinstance(layer, ProductLayer) else 2
  for term in layer.terms:
    if len(term) != width:
      raise ValueError(f"layer {layer.name!r}: a term must name {width} slots, got {term!r}")
    out = layout[term[0]]
    cols["out"].append(out.start + np.arange(out.size))
    for key, src in zip(("a", "b")[:len(term) - 1], term[1:], strict=True):
      s = layout[src]
      if s.size not in (1, out.size):
        raise ValueError(f"layer {layer.name!r}: slot {src!r} (size {s.size}) does not fit {term[0]!r} "
                         f"(size {out.size})")
      cols[key].append(s.start + (np.arange(out.size) if s.size > 1 else np.zeros(out.size, int)))
  wire = {k: np.concatenate(v).astype(np.int32) for k, v in cols.items()}
  if len(np.unique(wire["out"])) != len(wire["out"]):
    raise ValueError(f"layer {layer.name!r} writes a coordinate twice")
  return wire


def _slots_touched(layout: Layout, nonzero_coords: np.ndarray) -> tuple[str, ...]:
  names = []
  for s in layout.slots:
    if np.any(nonzero_coords[s.start:s.start + s.size]):
      names.append(s.name)
  return tuple(names)


class Program:
  """A residual stream ``layout`` and its ``layers``; ``weights[name]`` holds each AHAT layer's fixed
  ``wq, wk, wv, wo`` (over the rows / columns of its :attr:`spans` entry, :class:`AttentionWeights`) and
  each linear layer's stored matrix (:class:`LinearWeights`): ``entries`` (the values of its sparse terms,
  at the coordinates ``wiring[name]["rows"], ["cols"]``) and ``block{k}`` (its dense blocks, reading the
  coordinates ``wiring[name]["block{k}.rows"]``). :meth:`run` maps ``[B, P, width]`` → ``[B, P, width]``
  (or ``[P, width]`` → ``[P, width]``). ``single_assignment`` (the default): no layer writes a slot that
  is an input or that an earlier layer wrote."""

  def __init__(self, layout: Layout, layers: Sequence,
               weights: Mapping[str, "AttentionWeights | LinearWeights"], *, single_assignment: bool = True):
    self.layout = layout
    self.single_assignment = single_assignment
    self.layers = tuple(layers)
    self.weights = {}
    self.wiring: dict[str, dict[str, np.ndarray]] = {}
    self.spans: dict[str, tuple[int, int]] = {}   # AHAT layer -> the coordinates it reads and writes
    self._blocks: dict[str, tuple] = {}   # linear layer -> ((rows: (start, stop) or index array, col), ...)
    W = layout.width
    infos, written = [], {s.name for s in layout.slots if s.is_input}
    seen_out: set[str] = set()
    for layer in self.layers:
      if isinstance(layer, (AHATLayer, LinearLayer)) and layer.name not in weights:
        raise ValueError(f"`weights` has no entry for layer {layer.name!r}.")
      if isinstance(layer, AHATLayer):
        w = weights[layer.name]
        if not isinstance(w, AttentionWeights):
          raise ValueError(f"weights of {layer.name!r} must be AttentionWeights")
        if (w.H, w.dk, w.dv) != (layer.num_heads, layer.key_dim, layer.value_dim):
          raise ValueError(f"weights of {layer.name!r} do not match its head sizes")
        if w.layout.width != W:
          raise ValueError(f"weights of {layer.name!r} are for a residual of width {w.layout.width}, not {W}")
        arrs = w.arrays()
        a, b = w.span
        read, wrote = np.zeros(W, bool), np.zeros(W, bool)
        read[a:b] = np.any(arrs["wq"] != 0, 1) | np.any(arrs["wk"] != 0, 1) | np.any(arrs["wv"] != 0, 1)
        wrote[a:b] = np.any(arrs["wo"] != 0, 0)
        reads, writes = _slots_touched(layout, read), _slots_touched(layout, wrote)
        self.weights[layer.name] = {k: device_array(v) for k, v in arrs.items()}
        self.spans[layer.name] = (a, b)
        infos.append(LayerInfo(layer.name, "ahat", layer.num_heads, layer.key_dim, layer.value_dim,
                               reads, writes, layer.computes))
      elif isinstance(layer, LinearLayer):
        w = weights[layer.name]
        if not isinstance(w, LinearWeights):
          raise ValueError(f"weights of {layer.name!r} must be LinearWeights")
        if w.layout.width != W:
          raise ValueError(f"weights of {layer.name!r} are for a residual of width {w.layout.width}, not {W}")
        rows, cols, vals = w.entries()
        read, wrote = np.zeros(W, bool), np.zeros(W, bool)
        read[rows], wrote[cols] = True, True
        wire, arrs, blocks = {"rows": rows, "cols": cols}, {"entries": vals}, []
        for k, (brows, col, m) in enumerate(w.blocks):
          read[brows[np.any(m != 0, 1)]] = True
          wrote[col + np.flatnonzero(np.any(m != 0, 0))] = True
          wire[f"block{k}.rows"], arrs[f"block{k}"] = brows, m
          one = None
          if k in w.biases:
            one, bias = w.biases[k]
            read[one] = True
            wrote[col + np.flatnonzero(bias != 0)] = True
            arrs[f"block{k}.bias"] = bias
          contiguous = len(brows) > 0 and np.array_equal(brows, np.arange(brows[0], brows[0] + len(brows)))
          blocks.append(((int(brows[0]), int(brows[0]) + len(brows)) if contiguous else brows, col, one))
        reads, writes = _slots_touched(layout, read), _slots_touched(layout, wrote)
        self.wiring[layer.name] = wire
        self.weights[layer.name] = {k: device_array(v) for k, v in arrs.items()}
        self._blocks[layer.name] = tuple(blocks)
        infos.append(LayerInfo(layer.name, "linear", 0, 0, 0, reads, writes, layer.computes))
      elif isinstance(layer, (ProductLayer, UnaryLayer)):
        self.wiring[layer.name] = _resolve_elementwise(layout, layer)
        operands = [t[1:] for t in layer.terms]
        reads = tuple(dict.fromkeys(n for ops in operands for n in ops))
        writes = tuple(dict.fromkeys(t[0] for t in layer.terms))
        kind, op = ("product", "") if isinstance(layer, ProductLayer) else ("unary", layer.op)
        infos.append(LayerInfo(layer.name, kind, 0, 0, 0, reads, writes, layer.computes, op))
      else:
        raise TypeError(f"not a layer: {layer!r}")
      missing = [r for r in reads if r not in written]
      if missing:
        raise ValueError(f"layer {layer.name!r} reads {missing} before any layer writes them")
      clash = [s for s in writes if s in written or s in seen_out]
      if clash and single_assignment:
        raise ValueError(f"layer {layer.name!r} writes {clash}, already input or written")
      seen_out.update(writes)
      written.update(writes)
    self.infos = tuple(infos)
    self._forward = jax.jit(self._forward_single_or_batch, static_argnames="single")

  def linear_entries(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-zero entries ``(rows, cols, values)`` of linear layer ``name``'s matrix ``M [width, width]``
    (terms and blocks summed, sorted by ``(col, row)``): what ``x ← x + x M`` combines, without building
    ``M``."""
    if name not in self._blocks:
      raise ValueError(f"`name` must name a linear layer of this program, got {name!r}")
    wire, w = self.wiring[name], self.weights[name]
    rows, cols, vals = [wire["rows"]], [wire["cols"]], [np.asarray(w["entries"])]
    for k, (_, col, one) in enumerate(self._blocks[name]):
      m = np.asarray(w[f"block{k}"])
      r, c = np.nonzero(m)
      rows.append(wire[f"block{k}.rows"][r])
      cols.append(col + c)
      vals.append(m[r, c])
      if one is not None:   # the bias: M's row `one`
        b = np.asarray(w[f"block{k}.bias"])
        c = np.flatnonzero(b)
        rows.append(np.full(c.size, one, np.int32))
        cols.append(col + c)
        vals.append(b[c])
    return _sum_duplicates(np.concatenate(rows), np.concatenate(cols), np.concatenate(vals))

  # -- sizes ---------------------------------------------------------------------------------
  @property
  def num_heads(self) -> int:
    return sum(i.num_heads for i in self.infos)

  @property
  def num_params(self) -> int:
    """Numbers stored in the fixed weights: the attention matrices over their spans, the linear layers'
    term values and block entries (zeros inside a block included, as a dense model counts them; the
    integer coordinates in :attr:`wiring` are not parameters). Products and unary maps have none."""
    return sum(int(a.size) for w in self.weights.values() for a in w.values())

  @property
  def num_nonzero(self) -> int:
    return sum(int(np.count_nonzero(np.asarray(a))) for w in self.weights.values() for a in w.values())

  # -- running -------------------------------------------------------------------------------
  def encode(self, length: int, inputs: Mapping[str, np.ndarray], batch: Optional[int] = None) -> jax.Array:
    """Residual stream ``[B, P, width]`` (or ``[P, width]`` when ``batch is None``) with the
    given input slots filled (``inputs[name]`` of shape ``[B, P, size]`` / ``[P, size]``) and
    every other slot zero. Built on the host (numpy) unless an input is being traced."""
    shape = (length, self.layout.width) if batch is None else (batch, length, self.layout.width)
    for name in inputs:
      if not self.layout[name].is_input:
        raise ValueError(f"slot {name!r} is not an input slot")
    traced = any(isinstance(v, jax.core.Tracer) for v in inputs.values())
    xp = jnp if traced else np
    parts = []
    for s in self.layout.slots:
      if s.name in inputs:
        parts.append(xp.reshape(xp.asarray(inputs[s.name], xp.float32), shape[:-1] + (s.size,)))
      else:
        parts.append(xp.zeros(shape[:-1] + (s.size,), xp.float32))
    return device_array(xp.concatenate(parts, axis=-1))

  def read(self, seq: jax.Array, name: str) -> jax.Array:
    return seq[..., self.layout.slice(name)]

  def run(self, seq: jax.Array, mask=None, weights: Optional[Mapping] = None) -> jax.Array:
    """Runs every layer on ``seq [B, P, width]`` (or ``[P, width]``). ``mask [B, P]`` (or
    ``[P]``; True = a real position) pads: padded positions are invisible to every AHAT head
    (the kernel's ``mask_BS``) and are reset to zero after each layer, so the real positions'
    result is that of the unpadded sequence."""
    seq = device_array(seq, jnp.float32)
    w = self.weights if weights is None else weights
    mask = None if mask is None else device_array(mask, bool)
    return self._forward(w, seq, mask, single=seq.ndim == 2)

  def _forward_single_or_batch(self, weights, x, mask, single: bool):
    if single:   # one sequence [P, width]: a batch of one inside the compiled program
      x, mask = x[None], None if mask is None else mask[None]
    out = self._forward_impl(weights, x, mask)
    return out[0] if single else out

  def _forward_impl(self, weights, x, mask=None):
    keep = None if mask is None else mask[..., None]
    for layer in self.layers:
      if isinstance(layer, AHATLayer):
        x = self._ahat(layer, weights[layer.name], x, mask)
      elif isinstance(layer, LinearLayer):
        x = self._linear(layer.name, weights[layer.name], x)
      elif isinstance(layer, ProductLayer):
        wire = self.wiring[layer.name]
        x = x.at[..., wire["out"]].add(x[..., wire["a"]] * x[..., wire["b"]])
      else:   # UnaryLayer (Program.__init__ admits nothing else)
        wire = self.wiring[layer.name]
        x = x.at[..., wire["out"]].add(UNARY_OPS[layer.op](x[..., wire["a"]]))
      if keep is not None:
        x = jnp.where(keep, x, 0.0)
    return x

  def _linear(self, name: str, w, x):
    """``x + x M``: every term and block reads ``x`` as it was before the layer (gather, product, scatter-add
    for the terms; a matrix product per block)."""
    wire, out = self.wiring[name], x
    if wire["rows"].size:
      out = out.at[..., wire["cols"]].add(x[..., wire["rows"]] * w["entries"][None, None])
    for k, (rows, col, one) in enumerate(self._blocks[name]):
      m = w[f"block{k}"]
      xr = x[..., rows[0]:rows[1]] if isinstance(rows, tuple) else x[..., rows]
      y = jnp.einsum("bpr,rk->bpk", xr, m, precision=HIGHEST)
      if one is not None:   # after the product, as a dense layer's h @ W + b
        y = y + x[..., one:one + 1] * w[f"block{k}.bias"][None, None, :]
      out = out.at[..., col:col + m.shape[1]].add(y)
    return out

  def _ahat(self, layer: AHATLayer, w, x, mask=None):
    """``x`` plus the layer's update, computed over the coordinates of its span only."""
    a, b = self.spans[layer.name]
    S = b - a
    H, dk, dv = layer.num_heads, layer.key_dim, layer.value_dim
    per_head = lambda m, d: jnp.transpose(jnp.reshape(m, (S, H, d)), (1, 0, 2))   # [S, H·d] -> [H, S, d]
    update, _ = ahat_sublayer(x[..., a:b], per_head(w["wq"], dk), per_head(w["wk"], dk), per_head(w["wv"], dv),
                              jnp.reshape(w["wo"], (H, dv, S)), mask_BS=mask, tol=layer.tol,
                              causal=layer.causal)
    return x + update if S == self.layout.width else x.at[..., a:b].add(update)

  def describe(self) -> str:
    lines = ["| # | layer | kind | heads | d_k | d_v | reads | writes | computes |",
             "|---|---|---|---|---|---|---|---|---|"]
    names = {"ahat": "AHAT (fixed weights)", "linear": "linear (fixed matrix)", "product": "product a·b"}
    for n, i in enumerate(self.infos, 1):
      kind = names.get(i.kind, i.op)
      heads = str(i.num_heads) if i.kind == "ahat" else "–"
      dk = str(i.key_dim) if i.kind == "ahat" else "–"
      dv = str(i.value_dim) if i.kind == "ahat" else "–"
      lines.append(f"| {n} | `{i.name}` | {kind} | {heads} | {dk} | {dv} | {', '.join(i.reads)} | "
                   f"{', '.join(i.writes)} | {i.computes} |")
    return "\n".join(lines)
