"""Pass 4, the graph → a layer schedule (:func:`allocate`): every attention op (Aggregate, the attention
half of SelectorWidth) gets the earliest attention sublayer after its inputs exist, every MLP op the
earliest MLP sublayer (longest-path scheduling, as tracr does); with ``fuse``, MLP-only chains share
one layer's deeper MLP.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Sequence

from jaxmem.rasp import rasp
from jaxmem.rasp.passes.rasp_to_graph import kind, sop_inputs


@dataclasses.dataclass
class Schedule:
  """Sublayer of every op: attention sublayers are even (2ℓ), MLP sublayers odd (2ℓ+1)."""
  slot: Dict[int, int]          # unique_id -> sublayer where the op's output appears
  attn_slot: Dict[int, int]     # for 'width' ops, the attention half's sublayer
  num_layers: int
  stage: Dict[int, int] = dataclasses.field(default_factory=dict)   # MLP ops chained in one MLP: 1, 2, …


def allocate(nodes: Sequence[rasp.RASPExpr], fuse: bool = False) -> Schedule:
  """Longest-path layer allocation: each op in the first sublayer of its kind after all
  of its inputs exist. ``fuse``: an MLP op whose latest inputs come out of an MLP sublayer
  joins that sublayer, one stage after them (a deeper MLP, :func:`jaxmem.rasp.craft.mlp.fuse_stages`),
  instead of taking the next layer's."""
  slot: Dict[int, int] = {}
  attn_slot: Dict[int, int] = {}
  stage: Dict[int, int] = {}
  for e in nodes:
    k = kind(e)
    if k == "selector":
      continue
    if k == "input":
      slot[e.unique_id] = -1
      continue
    ready = max((slot[s.unique_id] for s in sop_inputs(e)), default=-1)
    if k == "mlp" and fuse and ready >= 0 and ready % 2 == 1:
      slot[e.unique_id] = ready
      stage[e.unique_id] = 1 + max(stage.get(s.unique_id, 0) for s in sop_inputs(e)
                                   if slot[s.unique_id] == ready)
    elif k == "mlp":
      s = ready + 1
      slot[e.unique_id] = s if s % 2 == 1 else s + 1
    else:
      s = ready + 1
      s = s if s % 2 == 0 else s + 1
      if k == "attn":
        slot[e.unique_id] = s
      else:
        attn_slot[e.unique_id] = s
        slot[e.unique_id] = s + 1
  top = max(slot.values(), default=-1)
  return Schedule(slot, attn_slot, num_layers=(top + 2) // 2 if top >= 0 else 0, stage=stage)


__all__ = ["Schedule", "allocate"]
