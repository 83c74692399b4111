"""Pass 5, the scheduled graph → weights (:func:`build`): the residual space, then every layer's heads
(:mod:`jaxmem.rasp.craft.attention`) and MLP (:mod:`jaxmem.rasp.craft.mlp`) as numpy arrays, the
model's size estimated (:func:`estimate_params`) and checked against ``max_params`` before any
weight is built.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.craft.attention import Head, build_head, head_shape
from jaxmem.rasp.craft.mlp import (
  Lane,
  affine_lane,
  assemble_mlp,
  cleanup_lane,
  fuse_stages,
  linear_lane,
  map_lane,
  sequence_map_lane,
  width_lane,
)
from jaxmem.rasp.craft.residual import ModelError, Residual, encode
from jaxmem.rasp.passes.graph_to_schedule import Schedule
from jaxmem.rasp.passes.graph_to_value_sets import ValueSets, maybe_none
from jaxmem.rasp.passes.rasp_to_graph import kind


@dataclasses.dataclass
class LayerWeights:
  heads: List[Head]
  mlp: List[Tuple[np.ndarray, np.ndarray]]   # [(W [in, out], b [out])...]; last maps to d
  attn_ops: List[str]
  mlp_ops: List[str]


def estimate_params(d: int, heads: List[List[Tuple[int, int]]], lanes: List[List[Lane]]) -> int:
  """The dense parameter count of the head arrays (``(dk, dv)`` per head, padded to the layer's
  largest) and of :func:`assemble_mlp`'s MLPs over the lanes given so far (a lower bound while
  lanes are still missing)."""
  total = 0
  for hs, ls in zip(heads, lanes, strict=True):
    if hs:
      dk = max(h[0] for h in hs)
      dv = max(h[1] for h in hs)
      total += len(hs) * (2 * d * dk + 2 * d * dv)
    if ls and any(ln.stage for ln in ls):   # to be fused (fuse_stages): its first and last layers, at least
      total += d * (sum(len(ln.layers[0]) for ln in ls if not ln.stage) + sum(len(ln.layers[-1]) for ln in ls))
    elif ls:
      depth = max(ln.depth for ln in ls)
      widths = [sum(len(ln.layers[j]) if j < ln.depth else len(ln.layers[-1]) for ln in ls)
                for j in range(depth)]
      prev = d
      for w in widths:
        total += prev * w + w
        prev = w
      total += prev * d + d
  return total


def _check_size(est: int, d: int, max_params: Optional[int], done: bool) -> None:
  if max_params is not None and est > max_params:
    what = "" if done else "at least "
    raise ValueError(f"the compiled model would have {what}{est:,} parameters (residual width {d}; "
                     f"estimated before building), more than max_params={max_params:,}.")


def build(nodes: Sequence[rasp.RASPExpr], output: rasp.SOp, vs: ValueSets, schedule: Schedule,
          vocab: list, max_seq_len: int, max_params: Optional[int] = None):
  """Residual, embeddings and per-layer weights of the compiled program."""
  res = Residual()
  res.add("one")
  res.add("bos")
  scratch: Dict[int, int] = {}
  sops = [e for e in nodes if isinstance(e, rasp.SOp)]
  for e in sops:
    res.add_sop(e, None if rasp.is_numerical(e) else vs[e])
    if isinstance(e, rasp.SelectorWidth):
      scratch[e.unique_id] = res.add(f"{e.label}:1/(w+1)")
  # the size, before any weight exists: heads from the residual layout, then the MLP lanes
  # one by one (cheap unit lists; refused as soon as the count passes max_params)
  L = schedule.num_layers
  shapes: List[List[Tuple[int, int]]] = [[] for _ in range(L)]
  for e in sops:
    if kind(e) in ("attn", "width"):
      slot = schedule.slot[e.unique_id] if kind(e) == "attn" else schedule.attn_slot[e.unique_id]
      shapes[slot // 2].append(head_shape(e, res))
  embed_size = (len(vocab) + 1 + max_seq_len + 1) * res.width
  errors = ModelError(vs)
  maybe = maybe_none(nodes, vs)
  attn: List[List[Head]] = [[] for _ in range(L)]
  lanes: List[List[Lane]] = [[] for _ in range(L)]
  _check_size(estimate_params(res.width, shapes, lanes) + embed_size, res.width, max_params, False)
  for e in sops:
    k = kind(e)
    if k in ("attn", "width", "mlp"):
      _check_size(estimate_params(res.width, shapes, lanes) + embed_size, res.width, max_params, False)
    if k == "attn":
      layer = schedule.slot[e.unique_id] // 2
      if e.default is not None and encode(res.spaces[e.unique_id], e.default):
        lanes[layer].append(cleanup_lane(e.label, res.spaces[e.unique_id], e.default))
    elif k == "width":
      layer = schedule.attn_slot[e.unique_id] // 2
      lanes[layer].append(width_lane(e, scratch[e.unique_id], vs, res, max_seq_len))
    elif k == "mlp":
      layer = schedule.slot[e.unique_id] // 2
      if isinstance(e, rasp.LinearSequenceMap) and rasp.is_numerical(e.fst) and \
          rasp.is_numerical(e.snd) and rasp.is_numerical(e):
        lanes[layer].append(linear_lane(e, res))
        if any(c.unique_id in vs.rounding for c in (e.fst, e.snd)):
          err = 0.0
          for c, fac in ((e.fst, e.fst_fac), (e.snd, e.snd_fac)):
            a, r = vs.rounding.get(c.unique_id, (0.0, 0.0))
            err += abs(fac) * (a + r * float(np.max(np.abs(vs.numbers(c)))))
          vs.rounding[e.unique_id] = (1.01 * err, 4 * 2.0 ** -53)
      elif isinstance(e, rasp.SequenceMap):
        def budget(n):  # the pair units' first and last weight matrices, at least
          _check_size(estimate_params(res.width, shapes, lanes) + embed_size + 2 * res.width * n,
                      res.width, max_params, False)
        lanes[layer].append(affine_lane(e, vs, res, errors, maybe)
                            or sequence_map_lane(e, vs, res, errors, budget))
      else:
        lanes[layer].append(map_lane(e, vs, res, errors))
      lanes[layer][-1].stage = schedule.stage.get(e.unique_id, 0)
  d = res.width
  # the residual at BOS as each layer's MLP sees it: one, bos, every scratch dim written so
  # far (the BOS query of a SelectorWidth head reads its own bos = 1), and the defaults the
  # layer's Aggregates just wrote (cleaned up by this same MLP)
  x_bos = np.zeros((L, d))
  x_bos[:, :2] = 1.0
  for e in sops:
    k = kind(e)
    if k == "width":
      x_bos[schedule.attn_slot[e.unique_id] // 2:, scratch[e.unique_id]] = 1.0
    elif k == "attn" and e.default is not None:
      for dim, val in encode(res.spaces[e.unique_id], e.default).items():
        x_bos[schedule.slot[e.unique_id] // 2, dim] = val
  mlp_ops = [[ln.label for ln in lanes[i]] for i in range(L)]
  nonneg = {0, 1} | set(scratch.values()) | {sp.raises for sp in res.spaces.values() if sp.raises is not None}
  nonneg |= {dim for sp in res.spaces.values() if sp.encoding == "categorical" for dim in sp.dims}
  for i in range(L):
    if any(ln.stage for ln in lanes[i]):
      lanes[i] = [fuse_stages(lanes[i], x_bos[i], nonneg)]
  _check_size(estimate_params(d, shapes, lanes) + (len(vocab) + 1 + max_seq_len + 1) * d, d, max_params, True)
  # embeddings: tokens (vocab order, then BOS) and positions (0 = BOS, p = index p-1)
  tok = np.zeros((len(vocab) + 1, d))
  pos = np.zeros((max_seq_len + 1, d))
  tok[:, 0] = 1.0
  tok[len(vocab), 1] = 1.0
  for e in sops:
    sp = res.spaces[e.unique_id]
    if isinstance(e, rasp.TokensType):
      for t, v in enumerate(vocab):
        for dim, val in encode(sp, v).items():
          tok[t, dim] = val
    elif isinstance(e, rasp.IndicesType):
      for p in range(max_seq_len):
        for dim, val in encode(sp, p).items():
          pos[p + 1, dim] = val
    elif isinstance(e, rasp.Full):
      for dim, val in encode(sp, e.fill).items():
        tok[: len(vocab), dim] = val
  for e in sops:
    k = kind(e)
    if k == "attn":
      attn[schedule.slot[e.unique_id] // 2].append(build_head(e, res, d, None))
    elif k == "width":
      attn[schedule.attn_slot[e.unique_id] // 2].append(build_head(e, res, d, scratch[e.unique_id]))
  layers = [LayerWeights(attn[i], assemble_mlp(lanes[i], d, x_bos[i]), [h.label for h in attn[i]], mlp_ops[i])
            for i in range(L)]
  return res, tok, pos, layers


__all__ = ["LayerWeights", "build", "estimate_params"]
