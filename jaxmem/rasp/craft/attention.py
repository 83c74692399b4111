"""Every attention op as one AHAT head over the residual space.

Attention (one head per op; scores are sums of 0/1 table entries, so exact in float32):

* ``Aggregate(S, v, default)`` with ``S`` the conjunction of ``m`` Selects: the score of key
  ``k`` for query ``q`` is ``Σ_i P_i(key_i[k], query_i[q])`` ∈ {0..m}, each ``P_i`` a 0/1 table
  written into ``W_Q``/``W_K`` over the one-hot dimensions (rank ``min(|V_q|, |V_k|)``); the
  BOS key scores ``m − ½``. Hard attention takes the argmax set: the selected keys when any
  exist (score ``m``), else BOS alone, whose value is the default. Heads use a tie tolerance
  of ¼ (scores are multiples of ½), so one-hots that are 1 ± 1e−7 still tie exactly.
* ``SelectorWidth(S)``: the same scores with BOS at ``m`` (always selected) and value
  ``bos``: the head writes ``1/(w+1)`` exactly; the MLP below turns it into ``w``.

"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.craft.residual import Residual, encode
from jaxmem.rasp.passes.rasp_to_graph import selects_of
from jaxmem.rasp.passes.rasp_to_normal_form import ProductPredicate


@dataclasses.dataclass
class Head:
  label: str
  wq: np.ndarray   # [d, dk]
  wk: np.ndarray   # [d, dk]
  wv: np.ndarray   # [d, dv]
  wo: np.ndarray   # [dv, d]


def _exact_in_float64(v) -> bool:
  """A number that float64 holds exactly, so that comparing float64 copies compares the values
  (an int above 2⁵³ is not: 2⁵³ + 1 would equal 2⁵³)."""
  if isinstance(v, (bool, np.bool_, float, np.floating)):
    return True
  if isinstance(v, (int, np.integer)):
    return abs(int(v)) <= 2 ** 53
  return False


def _predicate_table(sel: rasp.Select, qvals: list, kvals: list) -> np.ndarray:
  """``P[a, b] = predicate(key=kvals[b], query=qvals[a])``, vectorised for Comparisons on
  numbers that float64 holds exactly; Python's own comparisons otherwise."""
  p = sel.predicate
  if isinstance(p, ProductPredicate):   # an And / Or / Not of Selects: combined from their own tables
    return p.table(qvals, kvals, _predicate_table).astype(np.float64)
  if isinstance(p, rasp.Comparison) and qvals and kvals and all(_exact_in_float64(v) for v in qvals + kvals):
    q = np.asarray(qvals, np.float64)[:, None]
    k = np.asarray(kvals, np.float64)[None, :]
    table = {
        rasp.Comparison.EQ: k == q, rasp.Comparison.LT: k < q, rasp.Comparison.LEQ: k <= q,
        rasp.Comparison.GT: k > q, rasp.Comparison.GEQ: k >= q, rasp.Comparison.NEQ: k != q,
        rasp.Comparison.TRUE: np.ones((len(qvals), len(kvals)), bool),
        rasp.Comparison.FALSE: np.zeros((len(qvals), len(kvals)), bool),
    }[p]
    return table.astype(np.float64)
  out = np.zeros((len(qvals), len(kvals)))
  for a, qv in enumerate(qvals):
    for b, kv in enumerate(kvals):
      try:
        out[a, b] = 1.0 if p(kv, qv) else 0.0
      except Exception as exc:
        raise ValueError(f"the predicate of '{sel.label}' raised {type(exc).__name__}: {exc} "
                         f"on key {kv!r}, query {qv!r}.") from exc
  return out


def build_head(e, res: Residual, d: int, scratch: Optional[int]) -> Head:
  """The hard-attention head of an Aggregate, or of a SelectorWidth's attention half."""
  selects = selects_of(e.selector)
  m = len(selects)
  blocks_q, blocks_k = [], []
  for s in selects:
    qs, ks = res.spaces[s.queries.unique_id], res.spaces[s.keys.unique_id]
    P = _predicate_table(s, qs.values, ks.values)
    # an empty value set (a function raising on every value: the model raises at apply) is a
    # block of width 0
    if len(qs.dims) <= len(ks.dims):
      bq = np.zeros((d, len(qs.dims)))
      bq[qs.dims, np.arange(len(qs.dims))] = 1.0
      bk = np.zeros((d, len(qs.dims)))
      bk[np.ix_(ks.dims, np.arange(len(qs.dims)))] = P.T
    else:
      bq = np.zeros((d, len(ks.dims)))
      bq[np.ix_(qs.dims, np.arange(len(ks.dims)))] = P
      bk = np.zeros((d, len(ks.dims)))
      bk[ks.dims, np.arange(len(ks.dims))] = 1.0
    blocks_q.append(bq)
    blocks_k.append(bk)
  one, bos = 0, 1
  bq = np.zeros((d, 1))
  bq[one, 0] = 1.0
  bk = np.zeros((d, 1))
  width = isinstance(e, rasp.SelectorWidth)
  bk[bos, 0] = float(m) if width else m - 0.5
  wq = np.concatenate(blocks_q + [bq], axis=1)
  wk = np.concatenate(blocks_k + [bk], axis=1)
  if width:
    wv = np.zeros((d, 1))
    wv[bos, 0] = 1.0
    wo = np.zeros((1, d))
    wo[0, scratch] = 1.0
    return Head(e.label, wq, wk, wv, wo)
  src, dst = res.spaces[e.sop.unique_id], res.spaces[e.unique_id]
  if dst.encoding == "numerical":
    wv = np.zeros((d, 1))
    if src.encoding == "numerical":
      wv[src.dims[0], 0] = 1.0
    else:
      for dim, v in zip(src.dims, src.values, strict=True):
        wv[dim, 0] = 0.0 if v is None else float(v)
    wv[bos, 0] = 0.0 if e.default is None else float(e.default)
    wo = np.zeros((1, d))
    wo[0, dst.dims[0]] = 1.0
  else:
    wv = np.zeros((d, len(dst.dims)))
    for dim, v in zip(src.dims, src.values, strict=True):
      enc = encode(dst, v)
      for j, val in enc.items():
        wv[dim, dst.dims.index(j)] = val
    if e.default is not None:
      for j, val in encode(dst, e.default).items():
        wv[bos, dst.dims.index(j)] = val
    wo = np.zeros((len(dst.dims), d))
    wo[np.arange(len(dst.dims)), dst.dims] = 1.0
  return Head(e.label, wq, wk, wv, wo)


def head_shape(e, res: Residual) -> Tuple[int, int]:
  """``(dk, dv)`` of :func:`build_head`'s head for ``e``, from the residual layout alone."""
  dk = 1 + sum(min(len(res.spaces[s.queries.unique_id].dims), len(res.spaces[s.keys.unique_id].dims))
               for s in selects_of(e.selector))
  if isinstance(e, rasp.SelectorWidth) or res.spaces[e.unique_id].encoding == "numerical":
    return dk, 1
  return dk, len(res.spaces[e.unique_id].dims)


__all__ = ["Head", "build_head", "head_shape"]
