"""``compile(program, vocab, max_seq_len)``: RASP → an exact average-hard-attention transformer.

Stages (modules): :func:`jaxmem.rasp.passes.rewrite` (normal form) →
:func:`~jaxmem.rasp.passes.check_types` → :class:`~jaxmem.rasp.passes.ValueSets` (value-set
inference) → :func:`~jaxmem.rasp.passes.allocate` (layers) → :func:`jaxmem.rasp.craft.build`
(residual space and weights) → :class:`jaxmem.rasp.model.CompiledModel` (a Flax NNX model on
:mod:`jaxmem.kernels.ahat`).

Exactness: hard attention computes a selection's mean exactly (no soft-attention leakage to
BOS or to unselected keys, unlike tracr's logit-100 softmax), every attention score is a sum
of 0/1 table entries, and every MLP that reads a number discretises it at midpoints of its
inferred value set with steps that saturate a quarter-gap away. So the compiled model agrees
with :func:`jaxmem.rasp.evaluate` on every input of every length ``n ≤ max_seq_len``:
categorical outputs identical, numerical ones to float32 rounding of the means (≈1e−7
relative). Limits, each a ``ValueError`` at compile time rather than a wrong model: numerical
value sets above :data:`~jaxmem.rasp.passes.MAX_VALUE_SET`, values closer than float32 can
separate (relative to the values, and to each SOp's float32 error bound,
:class:`jaxmem.rasp.craft.ModelError`), constants (``ConstantSOp``), models above
``max_params`` (estimated before any weight is built).
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import numpy as np

from jaxmem.rasp import craft, passes, rasp
from jaxmem.rasp.model import CompiledModel


def _check_vocab(vocab, compiler_bos):
  try:
    vocab = list(vocab)
  except TypeError as e:
    raise ValueError(f"`vocab` must be a collection of tokens, got {vocab!r}.") from e
  if not vocab:
    raise ValueError("`vocab` must not be empty.")
  for v in vocab:
    if v is None:
      raise ValueError("`vocab` must not contain None (None is RASP's 'no value').")
  if any(v == compiler_bos for v in vocab):
    raise ValueError(f"`compiler_bos` {compiler_bos!r} equals a token in `vocab`; pick another BOS.")
  seen = {}
  for v in vocab:
    try:
      hash(v)
    except TypeError as e:
      raise ValueError(f"`vocab` token {v!r} is unhashable; tokens must be hashable.") from e
    if v in seen and type(seen[v]) is not type(v):
      raise ValueError(f"`vocab` holds {seen[v]!r} and {v!r}, equal in Python but of different "
                       "types; a compiled model reads them as one token. Keep one.")
    seen.setdefault(v, v)
  return passes.unique_values(vocab, "vocab")


def compile(program: rasp.SOp, vocab: Sequence[Any], max_seq_len: int,  # noqa: A001
            compiler_bos: Any = "BOS", max_params: Optional[int] = 100_000_000,
            causal: bool = False) -> CompiledModel:
  """Compiles ``program`` for inputs over ``vocab`` of every length ``1..max_seq_len``.

  Returns a :class:`~jaxmem.rasp.model.CompiledModel`; ``.apply(tokens)`` (no BOS) decodes
  the output at each position. ``causal=True``: every head sees only the positions at or
  before its query (BOS always), so the model computes ``rasp.evaluate(program, xs,
  causal=True)`` (the weights are the same; only the mask differs). Raises ``ValueError``
  for programs that cannot be compiled exactly (see the module docstring), for bad
  arguments, and — before allocating any weights — when the model would exceed
  ``max_params`` parameters (None: no limit)."""
  t0 = time.perf_counter()
  if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, (int, np.integer)) \
      or max_seq_len < 1:
    raise ValueError(f"`max_seq_len` must be a positive integer, got {max_seq_len!r}.")
  max_seq_len = int(max_seq_len)
  if not isinstance(causal, bool):
    raise ValueError(f"`causal` must be a bool, got {causal!r}.")
  vocab = _check_vocab(vocab, compiler_bos)
  vs = passes.ValueSets(vocab, max_seq_len)
  out = passes.rewrite(program, vs)
  nodes = passes.walk(out)
  passes.check_types(nodes, out)
  for e in nodes:  # numerical tokens / Full must be numbers
    if isinstance(e, (rasp.TokensType, rasp.Full)) and rasp.is_numerical(e):
      vs[e]
  none_checked = passes.check_none(nodes, vs, out)
  schedule = passes.allocate(nodes)
  fused = passes.allocate(nodes, fuse=True)
  if fused.num_layers < schedule.num_layers:   # MLP-only chains in one layer's (deeper) MLP
    schedule = fused
  res, tok, pos, layers = craft.build(nodes, out, vs, schedule, vocab, max_seq_len, max_params)
  space = res.spaces[out.unique_id]
  layer_dicts = []
  for lw in layers:
    d: dict = {"attn_ops": lw.attn_ops, "mlp_ops": lw.mlp_ops, "mlp": lw.mlp}
    if lw.heads:
      dk = max(h.wq.shape[1] for h in lw.heads)
      dv = max(h.wv.shape[1] for h in lw.heads)
      H, dm = len(lw.heads), res.width
      wq, wk = np.zeros((H, dm, dk)), np.zeros((H, dm, dk))
      wv, wo = np.zeros((H, dm, dv)), np.zeros((H, dv, dm))
      for i, h in enumerate(lw.heads):
        wq[i, :, : h.wq.shape[1]] = h.wq
        wk[i, :, : h.wk.shape[1]] = h.wk
        wv[i, :, : h.wv.shape[1]] = h.wv
        wo[i, : h.wo.shape[0]] = h.wo
      d["heads"] = {"wq": wq, "wk": wk, "wv": wv, "wo": wo}
    layer_dicts.append(d)
  snap = None
  if space.encoding == "numerical" and not isinstance(out, rasp.Aggregate):
    # the output's values, well apart in float32: decode each to the interpreter's own value
    # (type included). Skipped where the value set is too large to infer.
    try:
      vals = [v for v in vs[out] if v is not None]
    except ValueError:
      vals = []
    u = np.asarray([float(v) for v in vals])
    order = np.argsort(u, kind="stable")
    u = u[order]
    if u.size and np.all(np.diff(u) > 4e-6 * np.maximum(1.0, np.abs(u[1:]))):
      snap = [vals[i] for i in order]
  meta = {
      "residual": res.names, "vocab": vocab, "bos": compiler_bos, "max_seq_len": max_seq_len,
      "tie_tol": craft.TIE_TOL, "causal": causal,
      "output": {"label": out.label, "encoding": space.encoding, "dims": space.dims,
                 "values": space.values, "snap": snap},
      "one_hot_checks": [[e.label, res.spaces[e.unique_id].dims] for e in nodes
                         if isinstance(e, rasp.Aggregate) and rasp.is_categorical(e)],
      # where these SOps are None (all zero) at a real position the interpreter raises
      "none_checks": [[e.label, res.spaces[e.unique_id].dims] for e in none_checked],
      # where a raises dim is set, the SOp's function raised in the interpreter
      "raise_checks": [[sp.label, sp.raises] for sp in res.spaces.values() if sp.raises is not None],
  }
  model = CompiledModel(embed_token=tok, embed_position=pos, layers=layer_dicts, meta=meta,
                        program=program)
  model.compile_seconds = time.perf_counter() - t0  # everything up to a runnable NNX model
  return model
