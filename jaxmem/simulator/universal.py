"""The universal simulator U: fixed AHAT weights, ``T``'s parameters as data, output ``T(X)``.

Theorem 6 / Corollary 6.1 of Dutta, Chakrabarty, Ansari & Das, "On the Existence of
Universal Simulators of Attention" (arXiv:2506.18739 v2): one transformer ``U`` built from
average-hard-attention encoder layers, whose weights depend only on the sizes
``(N, D, H, D_h[, F])``, reads the parameters of *any* single-layer ``H``-head attention
(or encoder) layer ``T`` together with an input ``X [n, D]``, ``n <= N``, from its input
sequence and outputs ``T(X)``; constant depth, ``1 + N`` heads. This module's own design,
written from the paper's statement (see ``jaxmem/simulator/README.md``):

Input sequence (``P = 1 + n`` positions, residual width ``Simulator.layout.width``):

* position 0, the **parameter token**: ``is_param = 1`` and ``T.wq, T.wk, T.wv, T.wo``
  (and ``T.w1, T.b1, T.w2, T.b2`` for an encoder) flattened row-major into their slots;
* position ``i = 1..n``: ``is_row = 1``, the one-hot ``index`` of ``i`` (``N`` slots) and
  the row ``x_i``;
* every other slot is zero and is written by exactly one layer.

Layers (``AHAT`` = :func:`jaxmem.kernels.ahat.ahat_attention` with fixed ``W_Q, W_K, W_V, W_O``):

1. ``copy_params`` — AHAT, 1 head: query ``is_param + is_row`` (= 1 everywhere), key
   ``is_param``: every position selects the parameter token alone and copies ``T`` into
   its own slots.
2. ``project`` — position-wise: ``q_i^h = x_i wq_h``, ``k_i^h = x_i wk_h``, ``v_i^h = x_i wv_h``
   from the row and the copied weights (zero at the parameter token, whose ``x`` is zero).
3. ``gather`` — AHAT, ``N`` heads: head ``j`` has query 1 and key ``index_j + ½·is_param``.
   For ``j <= n`` the unique maximum (1) is row ``j``; for ``j > n`` no key scores 1 and the
   parameter token's ½ wins, so the head returns that token's zero ``k, v`` and a zero
   presence flag instead of the average of the whole sequence (the paper's empty-selection
   trap). Each head copies ``k_j, v_j, is_row_j`` into slots ``keys[j], values[j], present[j]``.
4. ``scores`` — position-wise: ``s_hj = q_i^h · k_j^h / √D_h``.
5. ``exp`` — position-wise: ``e_hj = [present_j] exp(s_hj − max_{present j'} s_hj')``
   (Lemma 4's elementwise exponential, max-subtracted so large scores do not overflow).
6. ``normalise`` — position-wise: ``p_hj = e_hj / Σ_j' e_hj'`` (Lemma 4's sum and division).
7. ``mix`` — position-wise: ``att_i = Σ_h (Σ_j p_hj v_j^h) wo_h`` — ``attention_layer(T, X)_i``.
8. (encoder) ``residual`` ``y = x + att``; ``ffn_hidden`` ``h = relu(y w1 + b1)``;
   ``ffn_out`` ``out = y + h w2 + b2`` — all position-wise.

The only arithmetic on data in the AHAT layers is selecting one position and copying it,
which is exact in float32 (scores are 0, ½ or 1 and the selected set is a singleton), so U's
error is the float32 rounding of the position-wise maps — the same operations
:func:`attention_layer` does, in a different order.

:meth:`Simulator.run_sequence` pads the sequence to ``1 + N`` positions with a key mask so
that one compiled program serves every ``n`` (``pad=False`` runs it unpadded; tested equal).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.checks import check_positive_int
from jaxmem.simulator.machine import (
  HIGHEST,
  AHATLayer,
  AttentionWeights,
  LayerInfo,
  Layout,
  PositionwiseLayer,
  Program,
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

  ``positions``: (positions, what they hold); ``slots``: the residual stream's slots
  (:class:`jaxmem.simulator.machine.SlotInfo`: name, start, size, is_input, meaning);
  ``params``: for each of T's matrices, ``(slot name, shape)`` at the parameter token;
  ``width``: residual width; ``input_width``: width of the input slots (the rest start 0);
  ``output_slot``: the slot holding ``T(X)_i`` at position ``i``."""
  positions: tuple[tuple[str, str], ...]
  slots: tuple
  params: dict
  width: int
  input_width: int
  output_slot: str

  def table(self) -> str:
    lines = ["| positions | hold |", "|---|---|"] + [f"| {p} | {h} |" for p, h in self.positions]
    lines += ["", "| slot | coordinates | size | input | meaning |", "|---|---|---|---|---|"]
    for s in self.slots:
      lines.append(f"| `{s.name}` | {s.start}..{s.start + s.size - 1} | {s.size} | "
                   f"{'yes' if s.is_input else ''} | {s.doc} |")
    return "\n".join(lines)


def _param_shapes(D, H, Dh, F):
  shapes = {"wq": (H, D, Dh), "wk": (H, D, Dh), "wv": (H, D, Dh), "wo": (H, Dh, D)}
  if F is not None:
    shapes.update({"w1": (D, F), "b1": (F,), "w2": (F, D), "b2": (D,)})
  return shapes


@functools.lru_cache(maxsize=16)
def _build_program(N: int, D: int, H: int, Dh: int, F: Optional[int]) -> tuple[Program, dict]:
  """U's program for the sizes (cached: it is a pure function of them, and sharing it shares
  the compiled forward pass)."""
  shapes = _param_shapes(D, H, Dh, F)
  L = Layout()
  # -- input slots ----------------------------------------------------------------------------
  L.add("is_param", 1, "1 at the parameter token (position 0), else 0", is_input=True)
  L.add("is_row", 1, "1 at the rows of X (positions 1..n), else 0", is_input=True)
  L.add("index", N, "one-hot of i at position i (coordinate i-1); zero at the parameter token", is_input=True)
  L.add("x", D, "the row x_i at position i; zero at the parameter token", is_input=True)
  for f, shp in shapes.items():
    L.add(f"T.{f}", math.prod(shp), f"T's `{f}` {list(shp)} flattened row-major, at the parameter token "
          "only (zero elsewhere)", is_input=True)
  # -- computed slots -------------------------------------------------------------------------
  for f, shp in shapes.items():
    L.add(f, math.prod(shp), f"copy of `T.{f}` at every position (layer `copy_params`)")
  L.add("q", H * Dh, "q_i^h = x_i wq_h, [H, D_h]")
  L.add("k", H * Dh, "k_i^h = x_i wk_h, [H, D_h]")
  L.add("v", H * Dh, "v_i^h = x_i wv_h, [H, D_h]")
  L.add("keys", N * H * Dh, "k_j^h of every row j = 1..N, [N, H, D_h] (zero for j > n)")
  L.add("values", N * H * Dh, "v_j^h of every row j = 1..N, [N, H, D_h] (zero for j > n)")
  L.add("present", N, "1 where row j exists (j <= n), else 0")
  L.add("scores", H * N, "s_hj = q_i^h·k_j^h/√D_h, [H, N]")
  L.add("exp", H * N, "[present_j] exp(s_hj - max_present s_h), [H, N]")
  L.add("probs", H * N, "softmax weights p_hj, [H, N]")
  L.add("att", D, "Σ_h Σ_j p_hj v_j^h wo_h = attention_layer(T, X)_i")
  if F is not None:
    L.add("y", D, "x_i + att_i")
    L.add("hidden", F, "relu(y w1 + b1)")
    L.add("out", D, "y + hidden w2 + b2 = encoder_layer(T, X)_i")
  param_names = tuple(shapes)

  # -- layer 1: every position copies the parameter token (AHAT, 1 head) -----------------------
  Pn = sum(L[f].size for f in param_names)
  w1 = AttentionWeights(L, num_heads=1, key_dim=1, value_dim=Pn)
  w1.query(0, "is_param", [[1.0]])
  w1.query(0, "is_row", [[1.0]])          # query = is_param + is_row = 1 at every position
  w1.key(0, "is_param", [[1.0]])          # score 1 at the parameter token, 0 elsewhere
  off = 0
  for f in param_names:
    n = L[f].size
    w1.value(0, f"T.{f}", np.eye(n), value_start=off)
    w1.output(0, f, np.eye(n), value_start=off)
    off += n
  layer1 = AHATLayer("copy_params", 1, 1, Pn,
                     "every position selects the parameter token (score = key's is_param) and copies T's "
                     "parameters into its own slots")

  # -- layer 2: per-row projections (position-wise) --------------------------------------------
  def project(r):
    x = r["x"]
    return {n: jnp.einsum("d,hde->he", x, r["w" + n].reshape(H, D, Dh),
                          precision=HIGHEST) for n in ("q", "k", "v")}

  layer2 = PositionwiseLayer("project", project, ("x", "wq", "wk", "wv"), ("q", "k", "v"),
                             "q_i^h = x_i wq_h, k_i^h = x_i wk_h, v_i^h = x_i wv_h (products of the row "
                             "and the copied weights)")

  # -- layer 3: gather every row's k, v, presence to every position (AHAT, N heads) ------------
  HD = H * Dh
  w3 = AttentionWeights(L, num_heads=N, key_dim=1, value_dim=2 * HD + 1)
  for j in range(N):
    w3.query(j, "is_param", [[1.0]])
    w3.query(j, "is_row", [[1.0]])
    w3.key(j, "index", [[1.0]], slot_start=j)      # score 1 at row j+1 ...
    w3.key(j, "is_param", [[0.5]])                 # ... ½ at the parameter token (the default)
    w3.value(j, "k", np.eye(HD), value_start=0)
    w3.value(j, "v", np.eye(HD), value_start=HD)
    w3.value(j, "is_row", [[1.0]], value_start=2 * HD)
    w3.output(j, "keys", np.eye(HD), value_start=0, slot_start=j * HD)
    w3.output(j, "values", np.eye(HD), value_start=HD, slot_start=j * HD)
    w3.output(j, "present", [[1.0]], value_start=2 * HD, slot_start=j)
  layer3 = AHATLayer("gather", N, 1, 2 * HD + 1,
                     "head j (query 1, key index_j + ½·is_param) selects row j if it exists, else the "
                     "parameter token (zeros), and copies k_j, v_j and is_row_j to every position")

  # -- layers 4-7: softmax attention from the gathered rows (position-wise) --------------------
  scale = 1.0 / math.sqrt(Dh)

  def scores(r):
    s = jnp.einsum("hd,jhd->hj", r["q"].reshape(H, Dh), r["keys"].reshape(N, H, Dh), precision=HIGHEST)
    return {"scores": s * jnp.float32(scale)}

  def exp(r):
    s = r["scores"].reshape(H, N)
    present = jnp.broadcast_to((r["present"] > 0.5)[None, :], (H, N))
    top = jnp.max(jnp.where(present, s, -jnp.inf), axis=1, keepdims=True)
    return {"exp": jnp.where(present, jnp.exp(jnp.where(present, s - top, -jnp.inf)), 0.0)}

  def normalise(r):
    e = r["exp"].reshape(H, N)
    return {"probs": e / jnp.sum(e, axis=1, keepdims=True)}

  def mix(r):
    p = r["probs"].reshape(H, N)
    o = jnp.einsum("hj,jhe->he", p, r["values"].reshape(N, H, Dh), precision=HIGHEST)
    return {"att": jnp.einsum("he,hed->d", o, r["wo"].reshape(H, Dh, D), precision=HIGHEST)}

  layers = [
      layer1, layer2, layer3,
      PositionwiseLayer("scores", scores, ("q", "keys"), ("scores",), "s_hj = q_i^h·k_j^h / √D_h"),
      PositionwiseLayer("exp", exp, ("scores", "present"), ("exp",),
                        "e_hj = [present_j] exp(s_hj − max_{present j} s_hj) (Lemma 4: elementwise exp)"),
      PositionwiseLayer("normalise", normalise, ("exp",), ("probs",),
                        "p_hj = e_hj / Σ_j e_hj (Lemma 4: row sum and division)"),
      PositionwiseLayer("mix", mix, ("probs", "values", "wo"), ("att",),
                        "att_i = Σ_h (Σ_j p_hj v_j^h) wo_h = attention_layer(T, X)_i"),
  ]
  out_slot = "att"
  if F is not None:
    def residual(r):
      return {"y": r["x"] + r["att"]}

    def ffn_hidden(r):
      h = jnp.einsum("d,df->f", r["y"], r["w1"].reshape(D, F), precision=HIGHEST) + r["b1"]
      return {"hidden": jax.nn.relu(h)}

    def ffn_out(r):
      o = jnp.einsum("f,fd->d", r["hidden"], r["w2"].reshape(F, D), precision=HIGHEST)
      return {"out": r["y"] + o + r["b2"]}

    layers += [
        PositionwiseLayer("residual", residual, ("x", "att"), ("y",), "y_i = x_i + att_i"),
        PositionwiseLayer("ffn_hidden", ffn_hidden, ("y", "w1", "b1"), ("hidden",), "h_i = relu(y_i w1 + b1)"),
        PositionwiseLayer("ffn_out", ffn_out, ("y", "hidden", "w2", "b2"), ("out",),
                          "out_i = y_i + h_i w2 + b2 = encoder_layer(T, X)_i"),
    ]
    out_slot = "out"
  program = Program(L, layers, {"copy_params": w1, "gather": w3})
  return program, {"shapes": shapes, "out_slot": out_slot}


class Simulator:
  """U for inputs of length ``n <= max_len``: ``Simulator(params, X)`` = ``T(X)``.

  Built by :func:`build_simulator` from sizes only. ``weights`` (the fixed matrices of the
  AHAT layers, ``{layer: {"wq", "wk", "wv", "wo"}}``), ``layers`` (one
  :class:`~jaxmem.simulator.machine.LayerInfo` per layer), ``num_heads`` (AHAT heads of U in
  all, ``1 + max_len``), ``heads_per_layer``, ``num_params`` (entries of the fixed
  matrices), ``num_nonzero``, ``width`` (residual width), ``layout``
  (:class:`SimulatorLayout`), ``encode(params, X)`` → U's input sequence ``[1 + n, width]``,
  ``run_sequence(seq)`` → U's output sequence ``[1 + n, width]``, ``decode(seq)`` → ``[n, D]``.
  ``sizes`` holds ``max_len, d_model, num_heads`` (of T), ``head_dim``, ``ffn_dim``."""

  def __init__(self, max_len: int, d_model: int, num_heads: int, head_dim: int, ffn_dim: Optional[int]):
    self.max_len, self.d_model, self.target_heads, self.head_dim, self.ffn_dim = (
        max_len, d_model, num_heads, head_dim, ffn_dim)
    self._program, meta = _build_program(max_len, d_model, num_heads, head_dim, ffn_dim)
    self._shapes, self._out_slot = meta["shapes"], meta["out_slot"]

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
    """``{layer: {"wq", "wk", "wv", "wo"}}``: the fixed matrices of U's AHAT layers (a fresh
    dict of the same immutable arrays)."""
    return {name: dict(w) for name, w in self._program.weights.items()}

  @property
  def layers(self) -> list[LayerInfo]:
    return list(self._program.infos)

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

  @property
  def layout(self) -> SimulatorLayout:
    L = self._program.layout
    return SimulatorLayout(
        positions=(
            ("0", "the parameter token: is_param = 1 and T's matrices in slots " +
             ", ".join(f"T.{f}" for f in self._shapes)),
            ("1..n", "row i: is_row = 1, index = one-hot(i) (N = max_len coordinates), x = x_i"),
        ),
        slots=L.slots,
        params={f: (f"T.{f}", shp) for f, shp in self._shapes.items()},
        width=L.width, input_width=L.input_width, output_slot=self._out_slot)

  def describe(self) -> str:
    return self._program.describe()

  def __repr__(self) -> str:
    kind = "encoder" if self.ffn_dim is not None else "attention"
    return (f"Simulator({kind}, max_len={self.max_len}, d_model={self.d_model}, num_heads={self.target_heads}, "
            f"head_dim={self.head_dim}, ffn_dim={self.ffn_dim}; U: {len(self.layers)} layers, "
            f"{self.num_heads} AHAT heads, width {self.width}, {self.num_params} fixed weights)")

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
    return n

  def encode(self, params, X) -> jax.Array:
    """U's input sequence ``[1 + n, width]``: the parameter token, then the rows of X."""
    n = self._check(params, X)
    N = self.max_len
    flat = {}
    fields = dict(zip(_ATT_FIELDS, params if self.ffn_dim is None else params.att, strict=True))
    if self.ffn_dim is not None:
      fields.update(zip(_FFN_FIELDS, params[1:], strict=True))
    P = 1 + n
    is_param = np.zeros((P, 1), np.float32)
    is_param[0] = 1
    is_row = 1 - is_param
    index = np.zeros((P, N), np.float32)
    index[np.arange(1, P), np.arange(n)] = 1
    traced = any(isinstance(a, jax.core.Tracer) for a in (X, *fields.values()))
    xp = jnp if traced else np  # host-side numpy unless called under a jax transformation
    x = xp.concatenate([xp.zeros((1, self.d_model), xp.float32), xp.asarray(X, xp.float32)], 0)
    for f, val in fields.items():
      v = xp.reshape(xp.asarray(val, xp.float32), (1, -1))
      flat[f"T.{f}"] = xp.concatenate([v, xp.zeros((n, v.shape[1]), xp.float32)], 0)
    return self._program.encode(P, {"is_param": is_param, "is_row": is_row, "index": index, "x": x, **flat})

  def run_sequence(self, seq, *, pad: bool = True) -> jax.Array:
    """Runs U's layers on an input sequence ``[P, width]``, ``2 <= P <= 1 + max_len``, and
    returns the output sequence ``[P, width]`` (the final residual stream).

    ``pad=True`` (default) runs it padded to ``1 + max_len`` positions with a key mask, so one
    compiled program serves every length: padded positions are invisible to every AHAT head
    and reset to zero after each layer, and position-wise maps never mix positions, so the
    real positions compute what the unpadded sequence computes (tested). ``pad=False`` runs
    the ``P`` positions as they are (one compilation per length)."""
    shape = tuple(np.shape(seq))
    if len(shape) != 2 or shape[1] != self.width or not 2 <= shape[0] <= 1 + self.max_len:
      raise ValueError(f"`seq` must have shape [P, {self.width}] with 2 <= P <= {1 + self.max_len}, "
                       f"got {shape}.")
    check_finite_array("seq", seq)
    if not pad:
      return self._program.run(seq)
    P, full = shape[0], 1 + self.max_len
    xp = jnp if isinstance(seq, jax.core.Tracer) else np
    padded = xp.concatenate([xp.asarray(seq, xp.float32), xp.zeros((full - P, self.width), xp.float32)], 0)
    out = self._program.run(padded, mask=np.arange(full) < P)
    return out[:P] if xp is jnp else jnp.asarray(np.asarray(out)[:P])

  def decode(self, out_seq) -> jax.Array:
    """``T(X)`` ``[n, D]`` from U's output sequence: the output slot at positions 1..n."""
    if isinstance(out_seq, jax.core.Tracer):
      return self._program.read(out_seq[1:], self._out_slot)
    return jnp.asarray(np.asarray(out_seq)[1:, self._program.layout.slice(self._out_slot)])

  def __call__(self, params, X) -> jax.Array:
    return self.decode(self.run_sequence(self.encode(params, X)))


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


def error_table(max_len: int, d_model: int, heads_list: Sequence[int], head_dim: int,
                n_values: Sequence[int], trials: int, seed: int, *, reference: str = "attention_layer",
                ffn_dim: Optional[int] = None, scale: float = 1.0) -> list[ErrorRow]:
  """U's error against the direct computation: one row per ``(heads, n)``.

  For each ``H`` in ``heads_list`` one simulator is built and serves ``trials`` random ``T``
  (``random_params``: N(0, 1)/√D entries, ``wq, wk`` times ``scale``) with random ``X [n, D]``
  (N(0, 1)) for each ``n`` in ``n_values``. ``max_abs_err`` and ``max_abs_out`` are maxima over
  the trials of ``max|U(T, X) − ref|`` and ``max|ref|``; ``rel_err = max_abs_err / max_abs_out``.
  ``reference``: ``"attention_layer"`` (float32, :func:`attention_layer` / :func:`encoder_layer`)
  or ``"float64"`` (the numpy float64 equation)."""
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
      err, top = 0.0, 0.0
      for _ in range(trials):
        params = random_params(rng, d_model, int(H), head_dim, ffn_dim, scale)
        X = rng.standard_normal((int(n), d_model)).astype(np.float32)
        got = np.asarray(sim(params, X), np.float64)
        if reference == "float64":
          ref = attention_layer_numpy(params, X) if ffn_dim is None else encoder_layer_numpy(params, X)
        else:
          ref = attention_layer(params, X) if ffn_dim is None else encoder_layer(params, X)
          ref = np.asarray(ref, np.float64)
        err = max(err, float(np.max(np.abs(got - ref))))
        top = max(top, float(np.max(np.abs(ref))))
      rows.append(ErrorRow(int(H), int(n), err, top, err / top if top > 0 else float("nan")))
  return rows
