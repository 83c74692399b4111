"""The compiled model: an ordinary Flax NNX transformer on :mod:`jaxmem.kernels.ahat`, and
:class:`CompiledModel`, which encodes inputs, runs it and decodes the output SOp.

Forward pass (``x`` the residual ``[B, T, d]``, position 0 = BOS)::

    x = token_embed[ids] + position_embed[0..T−1]
    for each layer ℓ:
      x = x + Σ_h AHAT(x Wq[h], x Wk[h], x Wv[h]) Wo[h]          (tol ¼; causal if compiled so)
      x = x + W_D relu(… relu(x W_1 + b_1) …) + b_D              (the layer's MLP)

All matmuls use ``precision="highest"`` (exactness is the contract). Padded positions are
masked out as keys.

Exported weights (:meth:`CompiledModel.export`, :func:`load`) are one ``.npz``:

* ``embed/token [V+1, d]`` (rows: the vocab in ``meta.vocab`` order, then BOS),
  ``embed/position [N+1, d]`` (row 0: BOS, row p: the token at index p−1);
* per layer ``l``: ``layer{l}/attn/{wq,wk} [H, d, dk]``, ``layer{l}/attn/wv [H, d, dv]``,
  ``layer{l}/attn/wo [H, dv, d]`` (absent when the layer has no head; heads padded with
  zero columns to a common dk, dv) and ``layer{l}/mlp/w{j} [in, out]``, ``layer{l}/mlp/b{j}``
  for ``j = 0..D`` (absent when the layer has no MLP);
* ``meta``: a JSON string (``residual`` names, ``vocab``, ``bos``, ``max_seq_len``, the
  output's ``label``/``encoding``/``dims``/``values``, ``tie_tol``, ``causal``, per-layer op
  labels, and the run-time checks: ``one_hot_checks``, ``none_checks``, ``raise_checks``).

Any framework can run it: the attention is "scores ``q·k``, keep those ``≥ max − tol``
among real keys, average their values".
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxmem.arrays import device_array
from jaxmem.kernels.ahat import ahat_sublayer
from jaxmem.rasp.passes.values import value_key
from jaxmem.sharding import param

HIGHEST = jax.lax.Precision.HIGHEST


class CompiledLayer(nnx.Module):
  """One layer of a compiled program: the attention sublayer (:func:`jaxmem.kernels.ahat.ahat_sublayer`, the
  sublayer the universal simulator's AHAT layers run too) and the layer's MLP."""

  def __init__(self, heads: Optional[Dict[str, np.ndarray]], mlp: List[tuple], tol: float,
               causal: bool = False):
    self.has_attn = heads is not None
    self.causal = causal
    if self.has_attn:
      self.wq = param(device_array(heads["wq"], jnp.float32), ("heads", "embed", None))
      self.wk = param(device_array(heads["wk"], jnp.float32), ("heads", "embed", None))
      self.wv = param(device_array(heads["wv"], jnp.float32), ("heads", "embed", None))
      self.wo = param(device_array(heads["wo"], jnp.float32), ("heads", None, "embed"))
    self.mlp_w = nnx.List([param(device_array(w, jnp.float32), (None, None)) for w, _ in mlp])
    self.mlp_b = nnx.List([param(device_array(b, jnp.float32), (None,)) for _, b in mlp])
    self.tol = tol

  def __call__(self, x, mask):
    attn = scores = None
    if self.has_attn:
      update, attn, raw = ahat_sublayer(x, self.wq[...], self.wk[...], self.wv[...], self.wo[...],
                                        causal=self.causal, mask_BS=mask, tol=self.tol, return_scores=True)
      x = x + update
      T = x.shape[1]
      visible = mask[:, None, None, :]
      if self.causal:
        visible = visible & jnp.tril(jnp.ones((T, T), bool))[None, None]
      scores = jnp.where(visible, raw, -1e30)
    after_attn = x
    if len(self.mlp_w):
      h = x
      n = len(self.mlp_w)
      for j in range(n):
        h = jnp.matmul(h, self.mlp_w[j][...], precision=HIGHEST) + self.mlp_b[j][...][None, None, :]
        if j < n - 1:
          h = jax.nn.relu(h)
      x = x + h
    return x, after_attn, attn, scores


class AHATTransformer(nnx.Module):
  """The compiled transformer: ``(ids [B, T], mask [B, T]) -> residual [B, T, d]`` plus the
  residual after every sublayer, every layer's attention maps ``[B, H, T, T]`` and scores
  ``[B, H, T, T]`` (hidden keys at −1e30)."""

  def __init__(self, token_embed, position_embed, layers: List[dict], tol: float,
               causal: bool = False):
    self.token_embed = param(device_array(token_embed, jnp.float32), ("vocab", "embed"))
    self.position_embed = param(device_array(position_embed, jnp.float32), ("length", "embed"))
    self.layers = nnx.List([CompiledLayer(l.get("heads"), l.get("mlp", []), tol, causal) for l in layers])

  def __call__(self, ids_BT, mask_BT):
    T = ids_BT.shape[1]
    x = self.token_embed[...][ids_BT] + self.position_embed[...][:T][None]
    residuals, maps, scores = [x], [], []
    for layer in self.layers:
      x, mid, attn, sc = layer(x, mask_BT)
      residuals += [mid, x]
      maps.append(attn)
      scores.append(sc)
    return x, residuals, maps, scores


class Trace(dict):
  """``residuals``: ``[2L+1]`` arrays ``[T, d]`` (embedding, then after each attention and
  each MLP sublayer); ``attention``: per layer ``[H, T, T]`` (None for a layer without
  heads), with ``heads[l]`` naming each head's op; ``names``: the residual's dimensions."""


class CompiledModel:
  """A RASP program compiled to an AHAT transformer (see :func:`jaxmem.rasp.compile`).

  ``apply(inputs)`` takes a list of tokens *without* BOS and returns the decoded output at
  each of those positions (categorical: the value, or None; numerical: a float). If
  ``inputs`` starts with the BOS token, the output starts with it too (tracr's convention).
  """

  def __init__(self, *, embed_token, embed_position, layers: List[dict], meta: Dict[str, Any],
               program=None, compile_seconds: Optional[float] = None):
    self.meta = meta
    self.program = program
    self.compile_seconds = compile_seconds
    self.vocab = list(meta["vocab"])
    self.bos = meta["bos"]
    self.max_seq_len = int(meta["max_seq_len"])
    self.residual_names = list(meta["residual"])
    self._layers_np = layers
    self._embed = (np.asarray(embed_token), np.asarray(embed_position))
    self.causal = bool(meta.get("causal", False))
    snap = meta["output"].get("snap")
    self._snap_values = None if snap is None else (np.asarray([float(v) for v in snap]), list(snap))
    self.model = AHATTransformer(embed_token, embed_position, layers, float(meta["tie_tol"]),
                                 self.causal)
    self._token_id = {}
    for i, t in enumerate(self.vocab):
      self._token_id.setdefault(value_key(t), (i, type(t)))
    graphdef, state = nnx.split(self.model)
    self._forward = jax.jit(lambda ids, mask: nnx.merge(graphdef, state)(ids, mask))

  # ------------------------------------------------------------------- sizes
  @property
  def num_layers(self) -> int:
    return len(self._layers_np)

  @property
  def heads_per_layer(self) -> List[int]:
    return [0 if "heads" not in l else int(l["heads"]["wq"].shape[0]) for l in self._layers_np]

  @property
  def num_heads(self) -> int:
    """The most heads in any layer (tracr's "heads per layer")."""
    return max(self.heads_per_layer, default=0)

  @property
  def mlp_hidden(self) -> List[int]:
    return [sum(int(w.shape[1]) for w, _ in l.get("mlp", [])[:-1]) for l in self._layers_np]

  @property
  def residual_width(self) -> int:
    return len(self.residual_names)

  @property
  def num_params(self) -> int:
    """Every entry of every weight array (embeddings, head matrices, MLP weights and biases),
    zeros included — the count a dense implementation stores."""
    return int(sum(np.asarray(a).size for a in self.arrays().values()))

  @property
  def layer_ops(self) -> List[Dict[str, List[str]]]:
    return [{"attn": list(l.get("attn_ops", [])), "mlp": list(l.get("mlp_ops", []))}
            for l in self._layers_np]

  def summary(self) -> str:
    rows = [f"{self.meta['output']['label']}: {self.num_layers} layers, heads per layer "
            f"{self.heads_per_layer}, residual width {self.residual_width}, "
            f"{self.num_params:,} parameters"]
    for i, ops in enumerate(self.layer_ops):
      rows.append(f"  layer {i}: attn {ops['attn'] or '-'}  mlp {ops['mlp'] or '-'}")
    return "\n".join(rows)

  # ------------------------------------------------------------------- running
  def _encode(self, seqs: Sequence[Sequence[Any]]):
    T = self.max_seq_len + 1
    ids = np.zeros((len(seqs), T), np.int32)
    mask = np.zeros((len(seqs), T), bool)
    for b, xs in enumerate(seqs):
      if len(xs) > self.max_seq_len:
        raise ValueError(f"input of length {len(xs)} is longer than max_seq_len "
                         f"{self.max_seq_len} the model was compiled for.")
      ids[b, 0] = len(self.vocab)
      for i, t in enumerate(xs):
        t = t.item() if isinstance(t, np.generic) else t
        j = self._token_id.get(value_key(t))
        if j is None or (j[1] is not type(t) and not isinstance(t, str)):
          raise ValueError(f"input token {t!r} ({type(t).__name__}) at position {i} is not in the "
                           f"compiled vocab {self.vocab!r}.")
        ids[b, i + 1] = j[0]
      mask[b, : len(xs) + 1] = True
    return ids, mask

  def _split_bos(self, xs):
    xs = list(xs)
    if xs and value_key(xs[0]) == value_key(self.bos):
      return xs[1:], True
    return xs, False

  def residual(self, inputs_batch: Sequence[Sequence[Any]]) -> np.ndarray:
    """The final residual ``[B, N+1, d]`` (padded) for a batch of inputs without BOS."""
    ids, mask = self._encode(inputs_batch)
    out = self._forward(ids, mask)[0]
    return np.asarray(out)

  def apply_batch(self, inputs_batch: Sequence[Sequence[Any]], chunk: int = 512) -> List[list]:
    """Decoded outputs of many inputs (each without BOS), batched through one jitted call."""
    out = []
    for s in range(0, len(inputs_batch), chunk):
      part = [list(x) for x in inputs_batch[s: s + chunk]]
      res = self.residual(part)
      out += [self._decode(res[b, 1: len(x) + 1]) for b, x in enumerate(part)]
    return out

  def apply(self, inputs: Sequence[Any]) -> list:
    xs, with_bos = self._split_bos(inputs)
    if not xs:
      return [self.bos] if with_bos else []
    out = self.apply_batch([xs])[0]
    return [self.bos] + out if with_bos else out

  __call__ = apply

  def trace(self, inputs: Sequence[Any]) -> Trace:
    """Per-sublayer residuals and per-layer attention maps of one input (BOS at row 0)."""
    xs, _ = self._split_bos(inputs)
    ids, mask = self._encode([xs])
    _, residuals, maps, _ = self._forward(ids, mask)
    n = len(xs) + 1
    return Trace(residuals=[np.asarray(r[0, :n]) for r in residuals],
                 attention=[None if m is None else np.asarray(m[0, :, :n, :n]) for m in maps],
                 heads=[ops["attn"] for ops in self.layer_ops], names=list(self.residual_names),
                 tokens=[self.bos] + xs)

  def _check_one_hot(self, rows: np.ndarray) -> None:
    """Every categorical Aggregate's dims, at every real position: one-hot or zero. A mixture
    means the Aggregate averaged different values, which no categorical SOp can hold; the
    ops downstream of it would be computed on garbage, so this raises instead."""
    for label, dims in self.meta.get("one_hot_checks", []):
      v = rows[:, dims]
      top = np.max(np.abs(v), axis=1) if v.size else np.zeros(len(rows))
      ok = (top < 1e-3) | ((np.abs(top - 1.0) < 1e-3) & (np.sum(np.abs(v), axis=1) - top < 1e-3))
      if not np.all(ok):
        i = int(np.argmin(ok))
        raise ValueError(
            f"categorical Aggregate '{label}' at position {i} is not one-hot "
            f"({np.round(v[i], 4).tolist()}): it averaged positions holding different values, "
            "which a categorical SOp cannot represent; make it numerical or select one position.")

  def _check_raises(self, rows: np.ndarray) -> None:
    """Where the interpreter raises, so does the model: a SOp whose function raised (its raises
    dim is set), or a SOp that is None (all zero) where a Comparison reads it as a key or query."""
    for label, dim in self.meta.get("raise_checks", []):
      hit = np.flatnonzero(rows[:, dim] > 0.5)
      if hit.size:
        raise ValueError(f"the function of '{label}' raises at position {int(hit[0])} (in the "
                         "interpreter too): the input is outside the program's domain.")
    for label, dims in self.meta.get("none_checks", []):
      v = rows[:, dims]
      none = np.max(np.abs(v), axis=1) < 1e-3 if v.size else np.ones(len(rows), bool)
      if np.any(none):
        raise ValueError(f"'{label}' is None at position {int(np.argmax(none))}, where a Select's "
                         "Comparison reads it (the interpreter raises 'key is None!' / 'query is "
                         "None!'): the input is outside the program's domain.")

  def _snap(self, x: float):
    """A numerical output as the interpreter's value (type included) when the output's value
    set is known (``meta.output.snap``, sorted) and one value is within float32 rounding."""
    snap = self._snap_values
    if snap is None:
      return x
    i = int(np.searchsorted(snap[0], x))
    for j in (i - 1, i):
      if 0 <= j < len(snap[0]) and abs(snap[0][j] - x) <= 1e-6 + 1e-6 * abs(snap[0][j]):
        return snap[1][j]
    return x

  def _decode(self, rows: np.ndarray) -> list:
    self._check_raises(rows)
    self._check_one_hot(rows)
    o = self.meta["output"]
    dims = o["dims"]
    if o["encoding"] == "numerical":
      return [self._snap(float(v)) for v in rows[:, dims[0]]]
    vals = rows[:, dims]
    out = []
    for i, r in enumerate(vals):
      if r.size == 0 or np.max(np.abs(r)) < 1e-3:
        out.append(None)
        continue
      j = int(np.argmax(r))
      if abs(r[j] - 1.0) > 1e-3 or np.sum(np.abs(r)) - abs(r[j]) > 1e-3:
        raise ValueError(
            f"output '{o['label']}' at position {i} is not one-hot ({np.round(r, 4).tolist()}): "
            "a categorical Aggregate averaged positions holding different values, which a "
            "categorical SOp cannot represent; make it numerical or select one position.")
      out.append(o["values"][j])
    return out

  # ------------------------------------------------------------------- export
  def arrays(self) -> Dict[str, np.ndarray]:
    out = {"embed/token": self._embed[0], "embed/position": self._embed[1]}
    for i, l in enumerate(self._layers_np):
      if "heads" in l:
        for k in ("wq", "wk", "wv", "wo"):
          out[f"layer{i}/attn/{k}"] = np.asarray(l["heads"][k], np.float32)
      for j, (w, b) in enumerate(l.get("mlp", [])):
        out[f"layer{i}/mlp/w{j}"] = np.asarray(w, np.float32)
        out[f"layer{i}/mlp/b{j}"] = np.asarray(b, np.float32)
    return {k: np.asarray(v, np.float32) for k, v in out.items()}

  def export(self, path) -> str:
    """Writes the weights and metadata as one ``.npz`` (layout in this module's docstring);
    returns the path written (numpy adds ``.npz`` when missing). Token and output values
    must be None, bool, int, float, str, or tuples / frozensets of them."""
    arrays = self.arrays()
    meta = dict(self.meta)
    meta["vocab"] = [_to_json(v, "vocab token") for v in self.vocab]
    meta["bos"] = _to_json(self.bos, "compiler_bos")
    meta["output"] = dict(meta["output"], values=[_to_json(v, "output value")
                                                  for v in meta["output"]["values"]])
    if meta["output"].get("snap") is not None:
      meta["output"]["snap"] = [_to_json(v, "output value") for v in meta["output"]["snap"]]
    meta["layers"] = [{"attn_ops": l.get("attn_ops", []), "mlp_ops": l.get("mlp_ops", []),
                       "mlp_depth": len(l.get("mlp", []))} for l in self._layers_np]
    path = str(path)
    if not path.endswith(".npz"):
      path += ".npz"
    np.savez(path, meta=np.asarray(json.dumps(meta)), **arrays)
    return path


def _to_json(v, what: str):
  """A JSON form of a RASP value that :func:`_from_json` inverts exactly."""
  if v is None or isinstance(v, (bool, str)):
    return v
  if isinstance(v, (int, np.integer)):
    return int(v)
  if isinstance(v, (float, np.floating)):
    return float(v)
  if isinstance(v, tuple):
    return {"tuple": [_to_json(x, what) for x in v]}
  if isinstance(v, frozenset):
    return {"frozenset": [_to_json(x, what) for x in v]}
  raise ValueError(f"cannot export the {what} {v!r} of type {type(v).__name__}: values must be "
                   "None, bool, int, float, str, or tuples / frozensets of them.")


def _from_json(v):
  if isinstance(v, dict):
    if "tuple" in v:
      return tuple(_from_json(x) for x in v["tuple"])
    return frozenset(_from_json(x) for x in v["frozenset"])
  return v


def load(path) -> CompiledModel:
  """Rebuilds a :class:`CompiledModel` from :meth:`CompiledModel.export`'s ``.npz``.

  Values come back with their types (tuples and frozensets included)."""
  with np.load(path, allow_pickle=False) as z:
    meta = json.loads(str(z["meta"]))
    arrays = {k: z[k] for k in z.files if k != "meta"}
  layers = []
  for i, info in enumerate(meta["layers"]):
    l: Dict[str, Any] = {"attn_ops": info["attn_ops"], "mlp_ops": info["mlp_ops"]}
    if f"layer{i}/attn/wq" in arrays:
      l["heads"] = {k: arrays[f"layer{i}/attn/{k}"] for k in ("wq", "wk", "wv", "wo")}
    l["mlp"] = [(arrays[f"layer{i}/mlp/w{j}"], arrays[f"layer{i}/mlp/b{j}"])
                for j in range(info["mlp_depth"])]
    layers.append(l)
  meta["vocab"] = [_from_json(v) for v in meta["vocab"]]
  meta["bos"] = _from_json(meta["bos"])
  meta["output"]["values"] = [_from_json(v) for v in meta["output"]["values"]]
  if meta["output"].get("snap") is not None:
    meta["output"]["snap"] = [_from_json(v) for v in meta["output"]["snap"]]
  return CompiledModel(embed_token=arrays["embed/token"], embed_position=arrays["embed/position"],
                       layers=layers, meta=meta)
