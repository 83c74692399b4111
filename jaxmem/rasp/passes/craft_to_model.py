"""Pass 6, the weights → a runnable model (:func:`assemble`): each layer's heads stacked into
``[H, d, dk]`` / ``[H, dv, d]`` arrays (zero-padded to a common head width), the decoding
metadata (residual names, the output's space, the interpreter's own values of a numerical
output) and the run-time checks (one-hots, None where the interpreter raises, raised
functions), as a :class:`jaxmem.rasp.model.CompiledModel` (tracr's ``assemble``).
"""

from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.craft.residual import TIE_TOL, Residual
from jaxmem.rasp.model import CompiledModel
from jaxmem.rasp.passes.graph_to_value_sets import ValueSets
from jaxmem.rasp.passes.schedule_to_craft import LayerWeights


def _stack_heads(heads, width: int) -> dict:
  dk = max(h.wq.shape[1] for h in heads)
  dv = max(h.wv.shape[1] for h in heads)
  H = len(heads)
  wq, wk = np.zeros((H, width, dk)), np.zeros((H, width, dk))
  wv, wo = np.zeros((H, width, dv)), np.zeros((H, dv, width))
  for i, h in enumerate(heads):
    wq[i, :, : h.wq.shape[1]] = h.wq
    wk[i, :, : h.wk.shape[1]] = h.wk
    wv[i, :, : h.wv.shape[1]] = h.wv
    wo[i, : h.wo.shape[0]] = h.wo
  return {"wq": wq, "wk": wk, "wv": wv, "wo": wo}


def _snap_values(out: rasp.SOp, vs: ValueSets):
  """The numerical output's values, sorted, when they are well apart in float32 (the model decodes each
  output to the nearest, so to the interpreter's own value, type included); None where the value set is
  too large to infer or two values are too close."""
  try:
    vals = [v for v in vs[out] if v is not None]
  except ValueError:
    return None
  u = np.asarray([float(v) for v in vals])
  order = np.argsort(u, kind="stable")
  u = u[order]
  if u.size and np.all(np.diff(u) > 4e-6 * np.maximum(1.0, np.abs(u[1:]))):
    return [vals[i] for i in order]
  return None


def assemble(program: rasp.SOp, out: rasp.SOp, nodes: Sequence[rasp.RASPExpr], vs: ValueSets,
             none_checked: Sequence[rasp.SOp], res: Residual, tok: np.ndarray, pos: np.ndarray,
             layers: List[LayerWeights], vocab: List[Any], compiler_bos: Any, max_seq_len: int,
             causal: bool) -> CompiledModel:
  """The compiled model of ``program`` (whose normal form is ``out`` with graph ``nodes``) from the
  weights of :func:`jaxmem.rasp.passes.schedule_to_craft.build`."""
  space = res.spaces[out.unique_id]
  layer_dicts = []
  for lw in layers:
    d: dict = {"attn_ops": lw.attn_ops, "mlp_ops": lw.mlp_ops, "mlp": lw.mlp}
    if lw.heads:
      d["heads"] = _stack_heads(lw.heads, res.width)
    layer_dicts.append(d)
  snap = None
  if space.encoding == "numerical" and not isinstance(out, rasp.Aggregate):
    snap = _snap_values(out, vs)
  meta = {
      "residual": res.names, "vocab": vocab, "bos": compiler_bos, "max_seq_len": max_seq_len,
      "tie_tol": TIE_TOL, "causal": causal,
      "output": {"label": out.label, "encoding": space.encoding, "dims": space.dims,
                 "values": space.values, "snap": snap},
      "one_hot_checks": [[e.label, res.spaces[e.unique_id].dims] for e in nodes
                         if isinstance(e, rasp.Aggregate) and rasp.is_categorical(e)],
      # where these SOps are None (all zero) at a real position the interpreter raises
      "none_checks": [[e.label, res.spaces[e.unique_id].dims] for e in none_checked],
      # where a raises dim is set, the SOp's function raised in the interpreter
      "raise_checks": [[sp.label, sp.raises] for sp in res.spaces.values() if sp.raises is not None],
  }
  return CompiledModel(embed_token=tok, embed_position=pos, layers=layer_dicts, meta=meta, program=program)


__all__ = ["assemble"]
