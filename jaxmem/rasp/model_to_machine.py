"""A compiled RASP model run on the universal simulator's machine (:mod:`jaxmem.machine`).

:func:`to_machine` rewrites a :class:`~jaxmem.rasp.model.CompiledModel` as a machine
:class:`~jaxmem.machine.Program` built from three of the kinds U is built from, and no
kind of its own: each layer's heads are one :class:`~jaxmem.machine.AHATLayer` (the
same fixed ``W_Q, W_K, W_V, W_O`` over the compiled residual's span, tie tolerance and causal mask),
and its ReLU MLP ``W_D relu(… relu(x W_1 + b_1) …) + b_D`` is a chain of
:class:`~jaxmem.machine.LinearLayer` (each matrix one dense block, its bias one more row: the weight
on the residual's ``one`` dimension, 1 at every position) and
:class:`~jaxmem.machine.UnaryLayer` ``relu`` over slots that hold the hidden units. The
residual keeps the compiled model's dimensions, one slot each, in the same order (the hidden slots
come after them); the input is the compiled model's embedding, which sets every one of those
dimensions (0 where a layer computes it), so they are all input slots. So the compiler's models and
U are programs of one machine, and both run their attention through
:func:`jaxmem.kernels.ahat.ahat_sublayer`; the machine stores what the compiled model stores, less
the embeddings (``program.num_params <= model.num_params``).

A hidden unit whose pre-activation is identically 0 (no weight on a live unit before it, no bias)
is ``relu(0) = 0`` everywhere and gets no coordinate; a hidden layer left with none — the MLP of a
Map whose value encodes to nothing, numerical 0 or categorical None — is 0, and the layers after it
read only their biases (a layer with no live unit is left out). Two dimensions of one name (two
SOps of one label) become slots ``name`` and ``name#1``.

The machine's programs are single-assignment (each slot written once); a compiled model is not
(its MLP removes the default a head wrote at BOS), so the program is built with
``single_assignment=False``. Padded positions are reset to zero after every layer, which changes
nothing at the real positions.
"""

from __future__ import annotations

from typing import Any, List, Sequence

import jax.numpy as jnp
import numpy as np

from jaxmem.machine import (
  AHATLayer,
  AttentionWeights,
  Layout,
  LinearLayer,
  LinearWeights,
  Program,
  UnaryLayer,
)
from jaxmem.rasp.model import CompiledModel


class MachineModel:
  """A :class:`~jaxmem.rasp.model.CompiledModel` as a machine :attr:`program`; :meth:`apply_batch`
  / :meth:`apply` encode and decode as the compiled model does (its checks included)."""

  def __init__(self, model: CompiledModel, program: Program, width: int):
    self.model = model
    self.program = program
    self.width = width   # the compiled model's residual width: the first `width` slots

  def residual(self, inputs_batch: Sequence[Sequence[Any]]) -> np.ndarray:
    """The compiled model's residual dimensions after the last layer, ``[B, N+1, d]`` (BOS at 0)."""
    ids, mask = self.model._encode(inputs_batch)
    tok, pos = self.model._embed
    x = tok[ids] + pos[None, : ids.shape[1]]
    x = np.concatenate([x, np.zeros(x.shape[:2] + (self.program.layout.width - self.width,))], -1)
    out = self.program.run(jnp.asarray(x, jnp.float32), mask=mask)
    return np.asarray(out)[..., : self.width]

  def apply_batch(self, inputs_batch: Sequence[Sequence[Any]]) -> List[list]:
    res = self.residual([list(x) for x in inputs_batch])
    return [self.model._decode(res[b, 1: len(x) + 1]) for b, x in enumerate(inputs_batch)]

  def apply(self, inputs: Sequence[Any]) -> list:
    return self.apply_batch([list(inputs)])[0]


def _live_units(mlp, d: int) -> list[np.ndarray]:
  """Per hidden layer of ``mlp`` (``[(w, b), …]``, the last pair the output map), the units whose
  pre-activation is not identically zero: some weight on a live unit of the layer before (on the
  residual, for the first) or a bias. Every other unit is ``relu(0) = 0`` at every position, so it is
  left out of the machine (exactly: it only ever adds zeros)."""
  live, prev = [], np.arange(d)
  for w, b in mlp[:-1]:
    w, b = np.asarray(w, np.float32), np.asarray(b, np.float32)
    prev = np.flatnonzero(np.any(w[prev] != 0, axis=0) | (b != 0))
    live.append(prev)
  return live


def _slot_names(names: Sequence[str]) -> list[str]:
  """The compiled residual's dimension names as slot names: a name given to two dimensions (two SOps
  of one label) gets ``#k`` after its ``k``-th repeat."""
  seen: dict[str, int] = {}
  out = []
  for n in names:
    k = seen.get(n, 0)
    seen[n] = k + 1
    out.append(n if k == 0 else f"{n}#{k}")
  if len(set(out)) != len(out):
    return [f"{n}#{i}" for i, n in enumerate(names)]
  return out


def to_machine(model: CompiledModel) -> MachineModel:
  """``model`` as a program of the simulator's machine (see the module docstring)."""
  if not isinstance(model, CompiledModel):
    raise ValueError(f"`model` must be a CompiledModel (from jaxmem.rasp.compile), got {type(model).__name__}.")
  names = list(model.residual_names)
  d = len(names)
  if "one" not in names:
    raise ValueError("the compiled model has no `one` dimension to carry the MLP biases.")
  one = names.index("one")
  tok, pos = model._embed
  embedded = np.any(tok != 0, axis=0) | np.any(pos != 0, axis=0)
  L = Layout()
  for i, n in enumerate(_slot_names(names)):   # all input: the embedding fills every compiled dimension
    L.add(n, 1, "set by the embedding" if embedded[i] else "0 in the embedding; layers add to it",
          is_input=True)
  layers_np = model._layers_np
  live = [_live_units(lw.get("mlp", []), d) for lw in layers_np]
  for l, units in enumerate(live):   # the hidden slots, after the compiled residual
    for j, u in enumerate(units):
      if u.size:
        L.add(f"layer{l}.mlp{j}.pre", u.size, f"layer {l}'s MLP, hidden layer {j} before its ReLU")
        L.add(f"layer{l}.mlp{j}", u.size, f"layer {l}'s MLP, hidden layer {j}")
  layers, weights = [], {}
  for l, lw in enumerate(layers_np):
    ops = model.layer_ops[l]
    if "heads" in lw:
      h = lw["heads"]
      H, _, dk = h["wq"].shape
      dv = h["wv"].shape[2]
      aw = AttentionWeights(L, num_heads=H, key_dim=dk, value_dim=dv, span=(0, d))   # the compiled residual
      for name, mat in (("wq", h["wq"]), ("wk", h["wk"]), ("wv", h["wv"])):   # [H, d, k] -> [d, H·k]
        getattr(aw, name)[:] = np.transpose(mat, (1, 0, 2)).reshape(d, -1)
      aw.wo[:] = np.reshape(h["wo"], (H * dv, d))
      name = f"layer{l}.attn"
      layers.append(AHATLayer(name, H, dk, dv, "heads of " + ", ".join(ops["attn"]),
                              tol=float(model.meta["tie_tol"]), causal=bool(model.meta.get("causal", False))))
      weights[name] = aw
    mlp = lw.get("mlp", [])
    for j, (w, b) in enumerate(mlp):
      w, b = np.asarray(w, np.float32), np.asarray(b, np.float32)
      last = j == len(mlp) - 1
      cols = np.arange(d) if last else live[l][j]
      if cols.size == 0:   # no live unit: the hidden layer is 0, and so is everything it feeds
        continue
      # the bias reads `one` and is added after the product, as the compiled model's h @ W + b (its
      # clean steps' exactness rests on that order)
      if j == 0:   # the residual
        rows, mat = np.arange(d), w[:, cols]
      else:        # the previous hidden layer's live units
        prev = live[l][j - 1]
        if prev.size:
          rows, mat = np.r_[L.slice(f"layer{l}.mlp{j - 1}")], w[np.ix_(prev, cols)]
        else:      # nothing live before: the bias alone (a zero row from `one` keeps the block non-empty)
          rows, mat = np.asarray([one]), np.zeros((1, cols.size), np.float32)
      lin = LinearWeights(L)
      lin.add_block(rows, 0 if last else L[f"layer{l}.mlp{j}.pre"].start, mat, bias=b[cols], one=one)
      name = f"layer{l}.mlp.linear{j}"
      what = "the MLP's output into the residual" if last else f"hidden layer {j}'s pre-activations"
      layers.append(LinearLayer(name, f"{what} (layer {l}: " + ", ".join(ops["mlp"]) + ")"))
      weights[name] = lin
      if not last:
        hidden = f"layer{l}.mlp{j}"
        layers.append(UnaryLayer(f"layer{l}.mlp.relu{j}", "relu", ((hidden, hidden + ".pre"),),
                                 f"hidden layer {j}"))
  return MachineModel(model, Program(L, layers, weights, single_assignment=False), d)


__all__ = ["MachineModel", "to_machine"]
