"""A compiled RASP model run on the universal simulator's machine (:mod:`jaxmem.machine`).

:func:`to_machine` rewrites a :class:`~jaxmem.rasp.model.CompiledModel` as a machine
:class:`~jaxmem.machine.Program` built from three of the kinds U is built from, and no
kind of its own: each layer's heads are one :class:`~jaxmem.machine.AHATLayer` (the
same fixed ``W_Q, W_K, W_V, W_O``, tie tolerance and causal mask), and its ReLU MLP
``W_D relu(… relu(x W_1 + b_1) …) + b_D`` is a chain of
:class:`~jaxmem.machine.LinearLayer` (a fixed matrix; the bias is the weight on the
residual's ``one`` dimension, 1 at every position) and
:class:`~jaxmem.machine.UnaryLayer` ``relu`` over slots that hold the hidden units. The
residual keeps the compiled model's dimensions, one slot each, in the same order (the hidden slots
come after them); the input is the compiled model's embedding. So the compiler's models and U are
programs of one machine, and both run their attention through
:func:`jaxmem.kernels.ahat.ahat_sublayer`.

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


def to_machine(model: CompiledModel) -> MachineModel:
  """``model`` as a program of the simulator's machine (see the module docstring)."""
  if not isinstance(model, CompiledModel):
    raise ValueError(f"`model` must be a CompiledModel (from jaxmem.rasp.compile), got {type(model).__name__}.")
  names = list(model.residual_names)
  d = len(names)
  if len(set(names)) != d:
    raise ValueError("the compiled model's residual names are not unique; it cannot be laid out as slots.")
  if "one" not in names:
    raise ValueError("the compiled model has no `one` dimension to carry the MLP biases.")
  one = names.index("one")
  tok, pos = model._embed
  embedded = np.any(tok != 0, axis=0) | np.any(pos != 0, axis=0)
  layers_np = model._layers_np
  written = np.zeros(d, bool)   # by some layer: a head's W_O, an MLP's last map or bias
  for lw in layers_np:
    if "heads" in lw:
      written |= np.any(np.asarray(lw["heads"]["wo"]) != 0, axis=(0, 1))
    if lw.get("mlp"):
      w, b = lw["mlp"][-1]
      written |= np.any(np.asarray(w) != 0, axis=0) | (np.asarray(b) != 0)
  L = Layout()
  for i, n in enumerate(names):
    # a dimension no layer writes (a constant Map of None or 0.0) is 0 from the embedding on
    start = bool(embedded[i] or not written[i])
    L.add(n, 1, "written by the embedding" if embedded[i] else
          "a dimension of the compiled residual" if written[i] else "0 at every position (no layer writes it)",
          is_input=start)

  def mlp_of(lw) -> list:
    """The layer's MLP; one that has a hidden layer of no units (its ops write only None or 0.0)
    computes its last bias alone: one linear map from ``one``."""
    mlp = lw.get("mlp", [])
    if any(w.shape[1] == 0 for w, _ in mlp[:-1]):
      return [(np.zeros((d, d), np.float32), mlp[-1][1])]
    return mlp

  for l, lw in enumerate(layers_np):   # the hidden slots, after the compiled residual
    for j, (w, _) in enumerate(mlp_of(lw)[:-1]):
      L.add(f"layer{l}.mlp{j}.pre", w.shape[1], f"layer {l}'s MLP, hidden layer {j} before its ReLU")
      L.add(f"layer{l}.mlp{j}", w.shape[1], f"layer {l}'s MLP, hidden layer {j}")
  layers, weights = [], {}
  for l, lw in enumerate(layers_np):
    ops = model.layer_ops[l]
    if "heads" in lw:
      h = lw["heads"]
      H, _, dk = h["wq"].shape
      dv = h["wv"].shape[2]
      aw = AttentionWeights(L, num_heads=H, key_dim=dk, value_dim=dv)
      for name, mat in (("wq", h["wq"]), ("wk", h["wk"]), ("wv", h["wv"])):   # [H, d, k] -> [W, H·k]
        getattr(aw, name)[:d] = np.transpose(mat, (1, 0, 2)).reshape(d, -1)
      aw.wo[:, :d] = np.reshape(h["wo"], (H * dv, d))
      name = f"layer{l}.attn"
      layers.append(AHATLayer(name, H, dk, dv, "heads of " + ", ".join(ops["attn"]),
                              tol=float(model.meta["tie_tol"]), causal=bool(model.meta.get("causal", False))))
      weights[name] = aw
    mlp = mlp_of(lw)
    src = None   # the slot the next linear map reads: None for the residual
    for j, (w, b) in enumerate(mlp):
      lin = LinearWeights(L)
      rows = np.arange(d) if src is None else np.r_[L.slice(src)]
      last = j == len(mlp) - 1
      cols = np.arange(d) if last else np.r_[L.slice(f"layer{l}.mlp{j}.pre")]
      lin.w[np.ix_(rows, cols)] += np.asarray(w, np.float32)
      lin.w[one, cols] += np.asarray(b, np.float32)
      name = f"layer{l}.mlp.linear{j}"
      what = "the MLP's output into the residual" if last else f"hidden layer {j}'s pre-activations"
      layers.append(LinearLayer(name, f"{what} (layer {l}: " + ", ".join(ops["mlp"]) + ")"))
      weights[name] = lin
      if not last:
        hidden = f"layer{l}.mlp{j}"
        layers.append(UnaryLayer(f"layer{l}.mlp.relu{j}", "relu", ((hidden, hidden + ".pre"),),
                                 f"hidden layer {j}"))
        src = hidden
  return MachineModel(model, Program(L, layers, weights, single_assignment=False), d)


__all__ = ["MachineModel", "to_machine"]
