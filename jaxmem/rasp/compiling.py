"""tracr's entry point, for programs written against tracr: ``compile_rasp_to_model(program,
vocab, max_seq_len, causal, compiler_bos, compiler_pad, mlp_exactness)`` with tracr's
signature, returning an :class:`AssembledTransformerModel` with tracr's fields and ``apply``.

A tracr script ports by changing its imports::

    from tracr.rasp import rasp                  →  from jaxmem import rasp
    from tracr.compiler import compiling         →  from jaxmem.rasp import compiling

    model = compiling.compile_rasp_to_model(program, {"a", "b"}, 5, compiler_bos="BOS")
    model.apply(["BOS", "a", "b"]).decoded       # ["BOS", ...] as tracr

The model underneath is :func:`jaxmem.rasp.compile`'s (``.compiled``): hard attention, exact
(``decoded`` equals ``rasp.evaluate(program, tokens, causal=causal)``). ``mlp_exactness`` is
accepted and checked but has no effect: jaxmem's MLPs are exact lookup tables, not
approximations that sharpen with it. Padding: ``compiler_pad`` tokens may end the input;
they are masked as keys and decode as None.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.compiler import compile as compile_program
from jaxmem.rasp.model import CompiledModel
from jaxmem.rasp.passes.values import sort_values, value_key

COMPILER_BOS = "compiler_bos"
COMPILER_PAD = "compiler_pad"


class NumericalEncoder:
  """The identity (tracr's encoder of numerical outputs)."""

  bos_token = pad_token = bos_encoding = pad_encoding = None

  def encode(self, inputs: List[float]) -> List[float]:
    return list(inputs)

  def decode(self, encodings: List[float]) -> List[float]:
    return list(encodings)


class CategoricalEncoder:
  """Tokens ↔ ids: ``encoding_map`` (value → id), ``encode``, ``decode``, ``bos_token``,
  ``pad_token``, ``bos_encoding``, ``pad_encoding``, ``vocab_size`` (tracr's fields)."""

  def __init__(self, values: Sequence[Any], bos_token: Any = None, pad_token: Any = None):
    self.encoding_map: Dict[Any, int] = {v: i for i, v in enumerate(values)}
    self.bos_token, self.pad_token = bos_token, pad_token

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
    missing = [x for x in inputs if x not in self.encoding_map]
    if missing:
      raise ValueError(f"`inputs` {missing[:5]!r} are not in the encoding {list(self.encoding_map)!r}.")
    return [self.encoding_map[x] for x in inputs]

  def decode(self, encodings: Sequence[int]) -> List[Any]:
    back = {i: v for v, i in self.encoding_map.items()}
    missing = [i for i in encodings if i not in back]
    if missing:
      raise ValueError(f"`encodings` {missing[:5]!r} are not in the decoding map {sorted(back)!r}.")
    return [back[i] for i in encodings]


@dataclasses.dataclass
class ModelConfig:
  """The shape of the model (tracr's ``TransformerConfig`` fields)."""
  num_heads: int
  num_layers: int
  key_size: int
  mlp_hidden_size: int
  causal: bool
  dropout_rate: float = 0.0
  layer_norm: bool = False


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


class AssembledTransformerModel:
  """tracr's compiled-model interface over a :class:`~jaxmem.rasp.model.CompiledModel`
  (``.compiled``): ``apply(tokens)`` with ``tokens = [compiler_bos, *xs]``,
  ``residual_labels``, ``input_encoder``, ``output_encoder``, ``params``, ``model_config``."""

  def __init__(self, compiled: CompiledModel, compiler_pad: Any):
    self.compiled = compiled
    self.compiler_bos, self.compiler_pad = compiled.bos, compiler_pad
    self.residual_labels: List[str] = list(compiled.residual_names)
    self.input_encoder = CategoricalEncoder(list(compiled.vocab) + [compiled.bos, compiler_pad],
                                            bos_token=compiled.bos, pad_token=compiler_pad)
    out = compiled.meta["output"]
    self.output_encoder = (NumericalEncoder() if out["encoding"] == "numerical"
                           else CategoricalEncoder(out["values"]))
    self.params: Dict[str, np.ndarray] = compiled.arrays()
    heads = [l["heads"] for l in compiled._layers_np if "heads" in l]
    self.model_config = ModelConfig(
        num_heads=compiled.num_heads, num_layers=compiled.num_layers,
        key_size=max([int(h["wq"].shape[2]) for h in heads] + [int(h["wv"].shape[2]) for h in heads],
                     default=1),
        mlp_hidden_size=max(compiled.mlp_hidden, default=0), causal=compiled.causal)

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
    m = self.compiled
    T = len(xs) + 1 + n_pad
    ids, mask = m._encode([xs])
    final, residuals, _, scores = m._forward(ids, mask)
    res = [np.asarray(r)[:, :T] for r in residuals]
    decoded = [self.compiler_bos] + (m._decode(np.asarray(final)[0, 1: len(xs) + 1]) if xs else []) \
        + [None] * n_pad
    out = m.meta["output"]
    rows = res[-1][0]
    if out["encoding"] == "numerical":
      unembedded = rows[None, :, out["dims"][0]]
    else:
      v = rows[:, out["dims"]]
      unembedded = (np.argmax(v, axis=1) if v.size else np.zeros(T, int))[None]
    logits = [np.zeros((1, 1, T, T), np.float32) if s is None else np.asarray(s)[:, :, :T, :T]
              for s in scores]
    return AssembledTransformerModelOutput(
        decoded=decoded, unembedded=unembedded,
        layer_outputs=[res[i + 1] - res[i] for i in range(len(res) - 1)], residuals=res[1:],
        attn_logits=logits, transformer_output=res[-1], input_embeddings=res[0])


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
           "CategoricalEncoder", "ModelConfig", "NumericalEncoder", "compile_rasp_to_model"]
