"""tracr's entry point, for programs written against tracr: ``compile_rasp_to_model(program,
vocab, max_seq_len, causal, compiler_bos, compiler_pad, mlp_exactness)`` with tracr's
signature, returning an :class:`AssembledTransformerModel` with tracr's fields, tracr's
parameter layout and tracr's ``apply``, ``forward`` and ``get_compiled_model``.

A tracr script ports by changing its imports::

    from tracr.rasp import rasp                  →  from jaxmem import rasp
    from tracr.compiler import compiling         →  from jaxmem.rasp import compiling

    model = compiling.compile_rasp_to_model(program, {"a", "b"}, 5, compiler_bos="BOS")
    model.apply(["BOS", "a", "b"]).decoded       # ["BOS", ...] as tracr
    model.params["transformer/layer_0/attn/query"]["w"]           # [d, H·K], as tracr

The model underneath is :func:`jaxmem.rasp.compile`'s (``.compiled``, whose flat arrays
``compiled.arrays()`` stay as they were): hard attention, exact (``decoded`` equals
``rasp.evaluate(program, tokens, causal=causal)``). ``model.params`` holds the same weights in
tracr's Haiku layout (``d`` the residual width, ``H = model_config.num_heads``, ``K =
model_config.key_size``, ``l < num_layers``)::

    token_embed/embeddings [V_in, d]   rows in input_encoder id order (tracr's: BOS sorted among
                                       the tokens, pad included; the pad row is `one` alone)
    pos_embed/embeddings   [N+1, d]    row p: position p (row 0: the BOS position)
    transformer/layer_l/attn/{query,key,value}  w [d, H·K], b [H·K]   head h: columns h·K…h·K+K−1
    transformer/layer_l/attn/linear              w [H·K, d], b [d]     head h: rows h·K…h·K+K−1
    transformer/layer_l/mlp/linear_j             w, b  for j = 1..D_l+1 (the layer's D_l hidden
                                                 stages; tracr's D_l = 1): linear_1 [d, M_1],
                                                 linear_j [M_{j−1}, M_j], the last [M_{D_l}, d]

from ``compiled.arrays()``: ``layer{l}/attn/wq [h, d, dk]`` → head columns of ``query`` (and
``wk`` → ``key``, ``wv [h, d, dv]`` → ``value``, ``wo [h, dv, d]`` → rows of ``linear``), zero
padded to ``H`` heads of width ``K = max(dk, dv)`` over all layers (tracr's ``value_size =
key_size``); ``layer{l}/mlp/w{j}, b{j}`` → ``linear_{j+1}`` (``b`` real: jaxmem's MLPs have
biases), hidden stage ``j`` zero padded to ``M_j``, its widest over the layers. As in tracr,
every layer has ``attn`` and ``mlp/linear_1, linear_2``, all zero where the layer has none;
attention biases are zero.

What differs from tracr, and why: attention is AHAT (keep the keys scoring ``≥ max − tol``,
``tol = compiled.meta["tie_tol"]``, average their values) on the raw scores ``q·k`` (no
``1/√K``: the compiler's scores are exact integers and halves, a ``√K`` would round them),
where tracr's is a softmax of ``q·k/√K`` with large logits; MLPs may be deeper than tracr's
two layers (``linear_3``, … with a ReLU before every ``linear_j``, ``j ≥ 2``); pad tokens are
masked as keys (tracr's compiled model masks nothing); the residual has no
``tokens:compiler_pad`` dimension, only the dimensions jaxmem uses, in jaxmem's order (tracr
sorts its labels). Encoder ids are tracr's.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.kernels.ahat import ahat_attention
from jaxmem.rasp import rasp
from jaxmem.rasp.compiler import compile as compile_program
from jaxmem.rasp.model import CompiledModel
from jaxmem.rasp.passes.values import sort_values, value_key

COMPILER_BOS = "compiler_bos"
COMPILER_PAD = "compiler_pad"
HIGHEST = jax.lax.Precision.HIGHEST


class NumericalEncoder:
  """The identity (tracr's encoder of numerical outputs)."""

  bos_token = pad_token = bos_encoding = pad_encoding = None

  def encode(self, inputs: List[float]) -> List[float]:
    return list(inputs)

  def decode(self, encodings: List[float]) -> List[float]:
    return list(encodings)


class CategoricalEncoder:
  """Tokens ↔ ids: ``encoding_map`` (value → id), ``encode``, ``decode``, ``bos_token``,
  ``pad_token``, ``bos_encoding``, ``pad_encoding``, ``vocab_size`` (tracr's fields; with
  ``enforce_bos`` inputs must start with ``bos_token``, with ``max_seq_len`` BOS included be
  at most that long, as tracr's)."""

  def __init__(self, values: Sequence[Any], bos_token: Any = None, pad_token: Any = None,
               enforce_bos: bool = False, max_seq_len: Optional[int] = None):
    self.encoding_map: Dict[Any, int] = {v: i for i, v in enumerate(values)}
    self.bos_token, self.pad_token = bos_token, pad_token
    self.enforce_bos, self._max_seq_len = enforce_bos, max_seq_len

  @property
  def vocab_size(self) -> int:
    return len(self.encoding_map)

  @property
  def bos_encoding(self) -> Optional[int]:
    return None if self.bos_token is None else self.encoding_map[self.bos_token]

  @property
  def pad_encoding(self) -> Optional[int]:
    return None if self.pad_token is None else self.encoding_map[self.pad_token]

  def encode(self, inputs: Sequence[Any]) -> List[int]:
    inputs = list(inputs)
    if self.enforce_bos and (not inputs or value_key(inputs[0]) != value_key(self.bos_token)):
      raise ValueError(f"`inputs` must start with the BOS token {self.bos_token!r}, got {inputs[:1]!r}.")
    missing = [x for x in inputs if x not in self.encoding_map]
    if missing:
      raise ValueError(f"`inputs` {missing[:5]!r} are not in the encoding {list(self.encoding_map)!r}.")
    if self._max_seq_len is not None and len(inputs) > self._max_seq_len:
      raise ValueError(f"`inputs` has {len(inputs)} tokens, more than the maximum sequence length "
                       f"{self._max_seq_len}.")
    return [self.encoding_map[x] for x in inputs]

  def decode(self, encodings: Sequence[int]) -> List[Any]:
    back = {i: v for v, i in self.encoding_map.items()}
    missing = [i for i in encodings if i not in back]
    if missing:
      raise ValueError(f"`encodings` {missing[:5]!r} are not in the decoding map {sorted(back)!r}.")
    return [back[i] for i in encodings]


@dataclasses.dataclass
class ModelConfig:
  """The shape of :attr:`AssembledTransformerModel.params` (tracr's ``TransformerConfig`` fields):
  ``num_heads`` and ``key_size`` of every layer's attention (zero padded), ``mlp_hidden_size``
  the width of every ``mlp/linear_1``."""
  num_heads: int
  num_layers: int
  key_size: int
  mlp_hidden_size: int
  causal: bool
  dropout_rate: float = 0.0
  activation_function: Callable = jax.nn.relu
  layer_norm: bool = False


@dataclasses.dataclass
class TransformerOutput:
  """tracr's ``TransformerOutput``: ``residuals`` and ``layer_outputs`` after every sublayer
  (attention, then MLP; ``[B, T, d]`` each), ``attn_logits`` per layer ``[B, H, T, T]`` (the
  scores ``q·k``, hidden keys at −1e30), ``output`` the last residual, ``input_embeddings``."""
  layer_outputs: List[jax.Array]
  residuals: List[jax.Array]
  attn_logits: List[jax.Array]
  output: jax.Array
  input_embeddings: jax.Array


@dataclasses.dataclass
class CompiledTransformerModelOutput:
  """tracr's: ``transformer_output`` and ``unembedded_output`` ``[B, T]`` (output ids, or the
  numerical output)."""
  transformer_output: TransformerOutput
  unembedded_output: jax.Array


@dataclasses.dataclass
class AssembledTransformerModelOutput:
  """One ``apply``: ``decoded`` (``[bos, out_1, …]``), and the arrays of the forward pass,
  each with a batch axis of 1 and ``T = len(tokens)``: ``residuals`` (after every sublayer,
  attention then MLP, ``[1, T, d]`` each), ``layer_outputs`` (what each sublayer added),
  ``attn_logits`` (per layer ``[1, H, T, T]``, hidden keys at −1e30), ``transformer_output``
  (the last residual), ``input_embeddings``, ``unembedded`` (``[1, T]``: output ids, or the
  numerical output)."""
  decoded: List[Any]
  unembedded: np.ndarray
  layer_outputs: List[np.ndarray]
  residuals: List[np.ndarray]
  attn_logits: List[np.ndarray]
  transformer_output: np.ndarray
  input_embeddings: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Spec:
  """What the forward pass takes from the model besides ``params``."""
  num_heads: int
  tol: float
  causal: bool
  pad_id: Optional[int]
  out_dims: Tuple[int, ...]    # the output's dims, in output_encoder id order
  categorical: bool


def _num_layers(params) -> int:
  n = 0
  while f"transformer/layer_{n}/attn/query" in params or f"transformer/layer_{n}/mlp/linear_1" in params:
    n += 1
  return n


def _embed(params, tokens_BT):
  tok = jnp.asarray(params["token_embed"]["embeddings"])
  pos = jnp.asarray(params["pos_embed"]["embeddings"])
  return tok[tokens_BT] + pos[jnp.indices(tokens_BT.shape)[-1]]


def _linear(params, name, x):
  p = params[name]
  y = jnp.einsum("...i,io->...o", x, p["w"], precision=HIGHEST)
  return y + jnp.reshape(p["b"], (1,) * (y.ndim - 1) + (-1,))


def _transformer(spec: _Spec, params, emb_BTD, mask_BT) -> TransformerOutput:
  """The layers of ``params`` on ``emb`` (the equations in the module docstring)."""
  x = emb_BTD
  B, T, _ = x.shape
  H = spec.num_heads
  visible = jnp.broadcast_to(mask_BT[:, None, None, :], (B, 1, T, T))
  if spec.causal:
    visible = visible & jnp.tril(jnp.ones((T, T), bool))[None, None]
  residuals, outputs, logits = [], [], []
  for l in range(_num_layers(params)):
    pre = f"transformer/layer_{l}"
    q, k, v = (_linear(params, f"{pre}/attn/{n}", x).reshape(B, T, H, -1) for n in ("query", "key", "value"))
    o = ahat_attention(q, k, v, causal=spec.causal, mask_BS=mask_BT, tol=spec.tol)
    out = _linear(params, f"{pre}/attn/linear", o.reshape(B, T, -1))
    scores = jnp.einsum("bthk,bshk->bhts", q, k, precision=HIGHEST)
    logits.append(jnp.where(visible, scores, -1e30))
    x = x + out
    residuals.append(x)
    outputs.append(out)
    h, j = x, 1
    while f"{pre}/mlp/linear_{j}" in params:
      h = _linear(params, f"{pre}/mlp/linear_{j}", h if j == 1 else jax.nn.relu(h))
      j += 1
    h = h if j > 1 else jnp.zeros_like(x)
    x = x + h
    residuals.append(x)
    outputs.append(h)
  return TransformerOutput(layer_outputs=outputs, residuals=residuals, attn_logits=logits, output=x,
                           input_embeddings=emb_BTD)


def _unembed(spec: _Spec, x, use_unembed_argmax: bool):
  out = x[..., list(spec.out_dims)]
  if use_unembed_argmax:
    return jnp.argmax(out, axis=-1) if out.shape[-1] else jnp.zeros(out.shape[:-1], jnp.int32)
  return out[..., 0] if out.shape[-1] == 1 else out


def _mask(spec: _Spec, tokens_BT):
  return jnp.ones(tokens_BT.shape, bool) if spec.pad_id is None else tokens_BT != spec.pad_id


def _run(spec: _Spec, params, tokens_BT):
  tokens_BT = jnp.asarray(tokens_BT)
  emb = _embed(params, tokens_BT)
  t = _transformer(spec, params, emb, _mask(spec, tokens_BT))
  un = _unembed(spec, t.output, spec.categorical)
  return (t.layer_outputs, t.residuals, t.attn_logits, t.output, t.input_embeddings), un


class CompiledTransformerModel:
  """tracr's ``CompiledTransformerModel`` interface (what ``get_compiled_model()`` returns):
  ``embed(tokens)``, ``token_embed(tokens)``, ``position_embed(positions)``,
  ``transformer(embeddings, mask)``, ``unembed(x, use_unembed_argmax)``, ``__call__(tokens)``,
  ``use_unembed_argmax``, ``pad_token`` (the pad id: pads are masked as keys).

  Not a Haiku module: it reads the model's ``params`` when called (edits to them show) and
  runs anywhere, inside ``hk.transform`` too, where it still reads ``model.params`` and not
  the parameters given to ``apply``."""

  def __init__(self, params: Callable[[], Dict[str, Dict[str, Any]]], spec: _Spec):
    self._params, self._spec = params, spec
    self.use_unembed_argmax, self.pad_token = spec.categorical, spec.pad_id

  def token_embed(self, tokens) -> jax.Array:
    return jnp.asarray(self._params()["token_embed"]["embeddings"])[jnp.asarray(tokens)]

  def position_embed(self, positions) -> jax.Array:
    return jnp.asarray(self._params()["pos_embed"]["embeddings"])[jnp.asarray(positions)]

  def embed(self, tokens) -> jax.Array:
    tokens = jnp.asarray(tokens)
    return self.token_embed(tokens) + self.position_embed(jnp.indices(tokens.shape)[-1])

  def transformer(self, embeddings, mask, *, use_dropout: bool = True) -> TransformerOutput:
    del use_dropout  # the compiled model has none
    return _transformer(self._spec, self._params(), jnp.asarray(embeddings), jnp.asarray(mask, bool))

  def unembed(self, x, use_unembed_argmax: bool) -> jax.Array:
    return _unembed(self._spec, jnp.asarray(x), use_unembed_argmax)

  def __call__(self, tokens, use_dropout: bool = True) -> CompiledTransformerModelOutput:
    tokens = jnp.asarray(tokens)
    t = self.transformer(self.embed(tokens), _mask(self._spec, tokens), use_dropout=use_dropout)
    return CompiledTransformerModelOutput(transformer_output=t,
                                          unembedded_output=self.unembed(t.output, self.use_unembed_argmax))


class AssembledTransformerModel:
  """tracr's compiled-model interface over a :class:`~jaxmem.rasp.model.CompiledModel`
  (``.compiled``): ``apply(tokens)`` with ``tokens = [compiler_bos, *xs]``, ``forward(params,
  tokens)``, ``get_compiled_model()``, ``params`` (tracr's layout, see the module docstring),
  ``model_config``, ``residual_labels``, ``input_encoder``, ``output_encoder``.

  As in tracr, ``apply`` runs ``forward(self.params, input_encoder.encode(tokens))``, so
  replacing arrays in ``params`` changes what it computes; ``decoded`` then applies jaxmem's
  run-time checks (see :meth:`CompiledModel.apply`)."""

  def __init__(self, compiled: CompiledModel, compiler_pad: Any):
    self.compiled = compiled
    self.compiler_bos, self.compiler_pad = compiled.bos, compiler_pad
    self.residual_labels: List[str] = tracr_residual_labels(compiled)
    self.input_encoder = CategoricalEncoder(
        tracr_order("tokens", list(compiled.vocab) + [compiled.bos, compiler_pad]), bos_token=compiled.bos,
        pad_token=compiler_pad, enforce_bos=True, max_seq_len=compiled.max_seq_len + 1)
    out = compiled.meta["output"]
    categorical = out["encoding"] != "numerical"
    if categorical:
      order = tracr_order(out["label"], list(out["values"]))
      where = {value_key(v): d for v, d in zip(out["values"], out["dims"], strict=True)}
      out_dims = tuple(where[value_key(v)] for v in order)
      self.output_encoder = CategoricalEncoder(order)
    else:
      out_dims = tuple(out["dims"][:1])
      self.output_encoder = NumericalEncoder()
    self._sizes = _Sizes.of(compiled)
    s = self._sizes
    self.model_config = ModelConfig(num_heads=s.H, num_layers=compiled.num_layers, key_size=s.K,
                                    mlp_hidden_size=s.M[0], causal=compiled.causal)
    self._spec = _Spec(num_heads=self._sizes.H, tol=float(compiled.meta["tie_tol"]), causal=compiled.causal,
                       pad_id=self.input_encoder.pad_encoding, out_dims=out_dims, categorical=categorical)
    self._jit_forward = jax.jit(functools.partial(_run, self._spec))

  @functools.cached_property
  def params(self) -> Dict[str, Dict[str, jax.Array]]:
    """tracr's layout of ``compiled``'s weights (built on first use; float32 jax arrays, as tracr's)."""
    arrays = tracr_params(self.compiled, list(self.input_encoder.encoding_map), self.compiler_pad, self._sizes)
    return jax.tree_util.tree_map(jnp.asarray, arrays)

  def forward(self, params, tokens) -> CompiledTransformerModelOutput:
    """tracr's ``forward(params, tokens)``: token ids ``[B, T]`` (``input_encoder`` ids, BOS
    first) through the model whose weights are ``params`` (tracr's layout)."""
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"`tokens` must be integer ids [B, T], got dtype {tokens.dtype} shape {tokens.shape}.")
    (outs, res, logits, final, emb), un = self._jit_forward(params, tokens)
    t = TransformerOutput(layer_outputs=outs, residuals=res, attn_logits=logits, output=final,
                          input_embeddings=emb)
    return CompiledTransformerModelOutput(transformer_output=t, unembedded_output=un)

  def get_compiled_model(self) -> CompiledTransformerModel:
    """tracr's ``get_compiled_model()``: the model's modules, reading ``self.params`` (see
    :class:`CompiledTransformerModel` for how it differs from tracr's Haiku module)."""
    return CompiledTransformerModel(lambda: self.params, self._spec)

  def _split(self, tokens: Sequence[Any]):
    tokens = list(tokens)
    if not tokens or value_key(tokens[0]) != value_key(self.compiler_bos):
      raise ValueError(f"`tokens` must start with the BOS token {self.compiler_bos!r}, got "
                       f"{tokens[:1]!r}.")
    xs = tokens[1:]
    is_pad = [value_key(t) == value_key(self.compiler_pad) for t in xs]
    n = len(xs) - sum(is_pad)
    if any(is_pad[:n]):
      raise ValueError(f"`tokens` may hold the pad token {self.compiler_pad!r} only at the end, "
                       f"got one at position {is_pad.index(True) + 1}.")
    if len(xs) > self.compiled.max_seq_len:
      raise ValueError(f"`tokens` has {len(xs)} tokens after BOS, more than max_seq_len "
                       f"{self.compiled.max_seq_len}.")
    return xs[:n], len(xs) - n

  def apply(self, tokens: Sequence[Any]) -> AssembledTransformerModelOutput:
    """Runs ``[compiler_bos, *xs, compiler_pad, …]`` (pads optional, only at the end)."""
    xs, n_pad = self._split(tokens)
    self.compiled._encode([xs])  # jaxmem's token checks (type included: True is not the token 1)
    ids = self.input_encoder.encode([self.compiler_bos] + xs + [self.compiler_pad] * n_pad)
    out = self.forward(self.params, np.asarray([ids], np.int32))
    t = out.transformer_output
    final = np.asarray(t.output)
    decoded = [self.compiler_bos] + (self.compiled._decode(final[0, 1: len(xs) + 1]) if xs else []) \
        + [None] * n_pad
    return AssembledTransformerModelOutput(
        decoded=decoded, unembedded=np.asarray(out.unembedded_output),
        layer_outputs=[np.asarray(a) for a in t.layer_outputs], residuals=[np.asarray(a) for a in t.residuals],
        attn_logits=[np.asarray(a) for a in t.attn_logits], transformer_output=final,
        input_embeddings=np.asarray(t.input_embeddings))


# ----------------------------------------------------------------------------- tracr's layout


@dataclasses.dataclass(frozen=True)
class _Sizes:
  """``H`` heads of width ``K`` in every layer; ``M[j]`` the width of hidden stage ``j``."""
  H: int
  K: int
  M: Tuple[int, ...]

  @classmethod
  def of(cls, compiled: CompiledModel) -> "_Sizes":
    heads = [l["heads"] for l in compiled._layers_np if "heads" in l]
    H = max([int(h["wq"].shape[0]) for h in heads] + [1])
    K = max([int(h["wq"].shape[2]) for h in heads] + [int(h["wv"].shape[2]) for h in heads] + [1])
    hidden = [[int(w.shape[1]) for w, _ in l.get("mlp", [])[:-1]] for l in compiled._layers_np]
    depth = max([len(h) for h in hidden] + [1])
    M = tuple(max([h[j] for h in hidden if len(h) > j] + [1]) for j in range(depth))
    return cls(H=H, K=K, M=M)


def _pad(a: np.ndarray, shape: Sequence[int]) -> np.ndarray:
  out = np.zeros(shape, np.float32)
  out[tuple(slice(0, n) for n in a.shape)] = a
  return out


def tracr_params(compiled: CompiledModel, token_order: Sequence[Any], compiler_pad: Any,
                 sizes: Optional[_Sizes] = None) -> Dict[str, Dict[str, np.ndarray]]:
  """``compiled``'s weights in tracr's layout (numpy float32; the table in the module
  docstring), the token rows in ``token_order`` (the input encoder's)."""
  s = sizes or _Sizes.of(compiled)
  arrays = compiled.arrays()
  tok = arrays["embed/token"]
  d = tok.shape[1]
  V = len(compiled.vocab)
  row = {value_key(v): i for i, v in enumerate(compiled.vocab)}
  row[value_key(compiled.bos)] = V
  one = np.zeros(d, np.float32)   # the pad row: `one` alone (jaxmem has no pad dimension; pads are masked)
  if "one" in compiled.residual_names:
    one[compiled.residual_names.index("one")] = 1.0
  token_embed = np.stack([one if value_key(t) == value_key(compiler_pad) else tok[row[value_key(t)]]
                          for t in token_order])
  params: Dict[str, Dict[str, np.ndarray]] = {"token_embed": {"embeddings": token_embed},
                                              "pos_embed": {"embeddings": arrays["embed/position"]}}
  H, K = s.H, s.K
  for l in range(compiled.num_layers):
    pre, src = f"transformer/layer_{l}", f"layer{l}"
    for name, key in (("query", "wq"), ("key", "wk"), ("value", "wv")):
      w = arrays.get(f"{src}/attn/{key}", np.zeros((0, d, 0), np.float32))   # [h, d, k]
      w = _pad(w, (H, d, K)).transpose(1, 0, 2).reshape(d, H * K)
      params[f"{pre}/attn/{name}"] = {"w": w, "b": np.zeros(H * K, np.float32)}
    wo = arrays.get(f"{src}/attn/wo", np.zeros((0, 0, d), np.float32))       # [h, dv, d]
    params[f"{pre}/attn/linear"] = {"w": _pad(wo, (H, K, d)).reshape(H * K, d), "b": np.zeros(d, np.float32)}
    n = len(compiled._layers_np[l].get("mlp", []))
    stages = [(arrays[f"{src}/mlp/w{j}"], arrays[f"{src}/mlp/b{j}"]) for j in range(n)] or \
        [(np.zeros((d, 0), np.float32), np.zeros(0, np.float32)), (np.zeros((0, d), np.float32), np.zeros(d))]
    widths = [d] + list(s.M[: len(stages) - 1]) + [d]
    for j, (w, b) in enumerate(stages):
      params[f"{pre}/mlp/linear_{j + 1}"] = {"w": _pad(w, (widths[j], widths[j + 1])),
                                             "b": _pad(b, (widths[j + 1],))}
  return params


def tracr_order(name: str, values: Sequence[Any]) -> List[Any]:
  """``values`` in the order tracr gives the basis directions ``name:value`` of one space
  (``BasisDirection.__lt__``: by value, by ``str`` where values do not compare): the order of
  tracr's encoder ids."""
  def label(v):
    return name if v is None else f"{name}:{v}"

  class Key:
    __slots__ = ("v",)

    def __init__(self, v):
      self.v = v

    def __lt__(self, other):
      try:
        return (name, self.v) < (name, other.v)
      except TypeError:
        return label(self.v) < label(other.v)

  return [k.v for k in sorted(Key(v) for v in values)]


_SCRATCH = ":1/(w+1)"
_DERIVED_WIDTH = re.compile(r"(.+):(major|minor|or\[\d+\])")


def tracr_residual_labels(compiled: CompiledModel) -> List[str]:
  """``compiled.residual_names`` in tracr's convention (same order): a SOp's dimensions are
  ``label:value`` (categorical) or ``label`` (numerical), and a SOp label holds no ``:``.
  Renamed: ``bos`` → ``tokens:{bos}`` (tracr's BOS direction); ``s:1/(w+1)`` →
  ``s_selector_width_attn_output`` (the same scratch dimension in tracr); a raises dimension
  → ``s_raises``; the SOps the normal-form rewrite derives, ``s:major``, ``s:minor``,
  ``s:or[j]`` (and their sums ``s:or[0]+``) and ``s:cat`` → ``s_major``, …, ``s_cat``; a
  second SOp of one name ``s#id`` → ``s_id`` (tracr's ``name_id``). ``one``, ``tokens:v``,
  ``indices:i`` and the user's SOps are already tracr's. A rename that would clash keeps
  jaxmem's name."""
  names = list(compiled.residual_names)
  present = set(names)
  derived = {}
  for n in names:
    m = _DERIVED_WIDTH.fullmatch(n[: -len(_SCRATCH)]) if n.endswith(_SCRATCH) else None
    if m:
      derived[m[0]] = f"{m[1]}_{m[2]}"

  def sop(label: str) -> str:
    """One SOp label (or a dimension's name) in tracr's style."""
    for old in sorted(derived, key=len, reverse=True):
      rest = label[len(old):]
      if label.startswith(old) and (rest.strip("+") == "" or rest.startswith(":")):
        return derived[old] + rest
    m = re.fullmatch(r"(.+?):cat(:.*)?", label)
    if m and m[1] in present:
      return f"{sop(m[1])}_cat{m[2] or ''}"
    m = re.fullmatch(r"([^:]+)#(\d+)(:.*)?", label)
    if m:
      return f"{m[1]}_{m[2]}{m[3] or ''}"
    return label

  out = []
  raises = {dim: label for label, dim in compiled.meta.get("raise_checks", [])}
  for i, n in enumerate(names):
    if i == 1 and n == "bos":
      out.append(f"tokens:{compiled.bos}")
    elif i in raises:
      out.append(f"{sop(raises[i])}_raises")
    elif n.endswith(_SCRATCH):
      out.append(f"{sop(n[: -len(_SCRATCH)])}_selector_width_attn_output")
    else:
      out.append(sop(n))
  counts: Dict[str, int] = {}
  for lab in out:
    counts[lab] = counts.get(lab, 0) + 1
  return [lab if counts[lab] == 1 else n for lab, n in zip(out, names, strict=True)]


def compile_rasp_to_model(program: rasp.SOp, vocab: Any, max_seq_len: int, causal: bool = False,
                          compiler_bos: Any = COMPILER_BOS, compiler_pad: Any = COMPILER_PAD,
                          mlp_exactness: int = 100, *,
                          max_params: Optional[int] = 100_000_000) -> AssembledTransformerModel:
  """tracr's ``compile_rasp_to_model``: ``program`` compiled for token sequences over ``vocab``
  (a set) of length ``1..max_seq_len`` after ``compiler_bos``; ``causal=True`` masks every
  head to the positions at or before its query. Raises ``ValueError`` naming the argument
  for bad arguments and the SOp for programs jaxmem cannot compile exactly (tracr raises
  ``NotImplementedError`` for its unsupported programs)."""
  try:
    vocab_list = list(vocab)
  except TypeError as e:
    raise ValueError(f"`vocab` must be a collection of tokens, got {vocab!r}.") from e
  if any(value_key(v) == value_key(compiler_pad) for v in vocab_list if _hashable(v)):
    raise ValueError(f"`compiler_pad` {compiler_pad!r} is a token in `vocab`; pick another pad.")
  if value_key(compiler_pad) == value_key(compiler_bos):
    raise ValueError(f"`compiler_pad` and `compiler_bos` are both {compiler_bos!r}; they must differ.")
  if isinstance(mlp_exactness, bool) or not isinstance(mlp_exactness, (int, np.integer)) \
      or mlp_exactness < 1:
    raise ValueError(f"`mlp_exactness` must be a positive integer, got {mlp_exactness!r}.")
  if isinstance(vocab, (set, frozenset)) and all(_hashable(v) for v in vocab_list):
    vocab_list = sort_values(vocab_list)
  model = compile_program(program, vocab_list, max_seq_len, compiler_bos=compiler_bos,
                          max_params=max_params, causal=causal)
  return AssembledTransformerModel(model, compiler_pad)


def _hashable(v) -> bool:
  try:
    hash(v)
  except TypeError:
    return False
  return True


__all__ = ["COMPILER_BOS", "COMPILER_PAD", "AssembledTransformerModel", "AssembledTransformerModelOutput",
           "CategoricalEncoder", "CompiledTransformerModel", "CompiledTransformerModelOutput", "ModelConfig",
           "NumericalEncoder", "TransformerOutput", "compile_rasp_to_model", "tracr_order", "tracr_params",
           "tracr_residual_labels"]
