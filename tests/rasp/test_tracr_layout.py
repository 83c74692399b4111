"""tracr's model layout on jaxmem's compiled models (``compile_rasp_to_model``): ``params`` in tracr's Haiku
names and shapes, ``forward``, ``get_compiled_model``, tracr's encoder ids and residual labels.

The proof is code written the way tracr users read tracr's weights (:func:`tracr_style_forward`: embed through
``params['token_embed']['embeddings'][encoding_map[t]]``, iterate ``transformer/layer_{l}``, read
``attn/query`` … ``mlp/linear_j``, find the output through ``residual_labels``) run on jaxmem's and tracr's
models of the same programs: with tracr's softmax it reproduces tracr's own forward pass, with jaxmem's hard
attention jaxmem's decoded outputs — so the layout is correct, not just named.

Side by side with tracr (skipped without tracr-pypi), what must agree exactly: the key pattern
(``token_embed``, ``pos_embed``, per layer ``attn/{query,key,value,linear}`` and ``mlp/linear_1, linear_2``;
jaxmem adds ``mlp/linear_3``… only for its deeper MLPs, so where both models have the same layers and 2-layer
MLPs the key sets are equal), the names and ranks inside (``embeddings``; ``w``, ``b``), the shapes tracr's
config implies (``[d, H·K]``, …), the input encoder's ids (BOS and pad included), the output encoder's ids,
and the residual label format (``name:value``, ``name``, ``one``, ``tokens:BOS``,
``s_selector_width_attn_output``). What may differ: ``d``, ``H``, ``K``, the hidden sizes and the layer count
(jaxmem's models are smaller), and the dimensions jaxmem does not need (``tokens:compiler_pad``, unused
``indices``).
"""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np
import pytest

from jaxmem import rasp
from jaxmem.rasp import compiling, conformance
from jaxmem.rasp import lib as jlib

N = 4


def tracr_style_forward(model, tokens, attention: str, tol: float = 0.25) -> np.ndarray:
  """The final residual ``[T, d]`` of ``tokens`` (BOS first) computed from ``model.params`` alone, read with
  tracr's names in float64: ``attention="softmax"`` is tracr's (``softmax(q·k/√K)``, nothing masked),
  ``"hard"`` jaxmem's (the keys scoring ``≥ max − tol`` among the visible ones, averaged; pads masked)."""
  params = {k: {n: np.asarray(a, np.float64) for n, a in v.items()} for k, v in model.params.items()}
  cfg = model.model_config
  ids = [model.input_encoder.encoding_map[t] for t in tokens]
  T = len(ids)
  x = params["token_embed"]["embeddings"][ids] + params["pos_embed"]["embeddings"][np.arange(T)]
  visible = np.tril(np.ones((T, T), bool)) if cfg.causal else np.ones((T, T), bool)
  if attention == "hard":
    visible = visible & (np.asarray(ids) != model.input_encoder.pad_encoding)[None, :]
  for layer in range(cfg.num_layers):
    p = lambda name: params[f"transformer/layer_{layer}/{name}"]  # noqa: B023
    q, k, v = ((x @ p(f"attn/{n}")["w"] + p(f"attn/{n}")["b"]).reshape(T, cfg.num_heads, -1)
               for n in ("query", "key", "value"))
    s = np.einsum("thk,shk->hts", q, k)
    if attention == "softmax":
      s = np.where(visible, s / np.sqrt(cfg.key_size), -1e30)
      w = np.exp(s - s.max(-1, keepdims=True))
    else:
      s = np.where(visible, s, -np.inf)
      w = (s >= s.max(-1, keepdims=True) - tol).astype(np.float64)
    w = w / w.sum(-1, keepdims=True)
    x = x + np.einsum("hts,shv->thv", w, v).reshape(T, -1) @ p("attn/linear")["w"] + p("attn/linear")["b"]
    h, j = x, 1
    while f"transformer/layer_{layer}/mlp/linear_{j}" in params:
      h = (h if j == 1 else np.maximum(h, 0.0)) @ p(f"mlp/linear_{j}")["w"] + p(f"mlp/linear_{j}")["b"]
      j += 1
    x = x + h
  return x


def tracr_style_decode(model, label: str, x: np.ndarray) -> list:
  """The output SOp ``label``'s value at every position of the residual ``x``, found through ``residual_labels``
  and ``output_encoder`` (categorical: the argmax of the dims ``label:value``; all zero is None)."""
  labels = model.residual_labels
  enc = model.output_encoder
  if not hasattr(enc, "encoding_map"):
    return x[:, labels.index(label)].tolist()
  dims = [labels.index(f"{label}:{v}") for v in enc.encoding_map]
  rows = x[:, dims]
  return [None if r.max() < 0.5 else v for r, v in zip(rows, enc.decode(np.argmax(rows, axis=1).tolist()),
                                                          strict=True)]


def _inputs(vocab, n=3):
  return [list(t) for m in range(1, n + 1) for t in itertools.product(vocab, repeat=m)]


# ----------------------------------------------------------------------------- jaxmem alone


JAXMEM_PROGRAMS = {
    "sort": (lambda: jlib.make_sort(rasp.tokens, rasp.tokens, max_seq_len=N, min_key=1), [1, 2, 3], False),
    "reverse": (lambda: jlib.make_reverse(rasp.tokens), list("abc"), False),
    "shift_by": (lambda: jlib.shift_by(1, rasp.tokens), list("ab"), False),
    "frac_prevs_causal": (lambda: jlib.make_frac_prevs(rasp.tokens == "a"), list("ab"), True),
}


@functools.cache
def _jaxmem(name):
  build, vocab, causal = JAXMEM_PROGRAMS[name]
  program = build()
  return program, vocab, rasp.compile_rasp_to_model(program, set(vocab), N, causal=causal, compiler_bos="BOS")


@pytest.mark.parametrize("name", sorted(JAXMEM_PROGRAMS))
def test_forward_read_from_tracr_layout_reproduces_jaxmem(name):
  """A numpy forward pass from ``params`` alone, tracr's names, hard attention: jaxmem's decoded outputs (the
  interpreter's) and its residual, on every input of length <= 3, padded ones too."""
  program, vocab, model = _jaxmem(name)
  causal = model.model_config.causal
  for xs in _inputs(vocab):
    want = rasp.evaluate(program, xs, causal=causal)
    pads = ["compiler_pad"] * (len(xs) < N)
    x = tracr_style_forward(model, ["BOS"] + xs + pads, "hard", tol=model.compiled.meta["tie_tol"])
    got = tracr_style_decode(model, program.label, x[1: len(xs) + 1])
    assert conformance.agree(model.compiled.meta["output"]["encoding"], want, got)[0], (xs, want, got)
    ref = model.compiled.residual([xs])[0, : len(xs) + 1]
    np.testing.assert_allclose(x[: len(xs) + 1], ref, atol=1e-5, err_msg=str(xs))


def test_params_are_the_compiled_weights_in_tracrs_packing():
  """Head ``h`` of ``layer{l}/attn/wq [h, d, dk]`` is columns ``h·K…`` of ``attn/query``, ``wo`` rows of
  ``attn/linear``, ``mlp/w{j}`` is ``mlp/linear_{j+1}``; the rest is zero; the flat layout stays in
  ``compiled.arrays()``."""
  _, _, model = _jaxmem("sort")
  flat, p, cfg = model.compiled.arrays(), model.params, model.model_config
  assert "layer0/attn/wq" in flat and "transformer/layer_0/attn/query" not in flat
  H, K = cfg.num_heads, cfg.key_size
  for l in range(cfg.num_layers):
    pre = f"transformer/layer_{l}"
    for name, key in (("query", "wq"), ("key", "wk"), ("value", "wv")):
      w = np.asarray(p[f"{pre}/attn/{name}"]["w"]).reshape(-1, H, K)
      src = flat.get(f"layer{l}/attn/{key}", np.zeros((0, w.shape[0], 0)))
      for h in range(H):
        want = np.zeros((w.shape[0], K))
        if h < src.shape[0]:
          want[:, : src.shape[2]] = src[h]
        np.testing.assert_array_equal(w[:, h], want)
      assert not np.asarray(p[f"{pre}/attn/{name}"]["b"]).any()
    wo = np.asarray(p[f"{pre}/attn/linear"]["w"]).reshape(H, K, -1)
    src = flat.get(f"layer{l}/attn/wo", np.zeros((0, 0, wo.shape[2])))
    np.testing.assert_array_equal(wo[: src.shape[0], : src.shape[1]], src)
    assert np.abs(wo).sum() == np.abs(src).sum()
    for j in itertools.count():
      if f"layer{l}/mlp/w{j}" not in flat:
        break
      w, b = np.asarray(p[f"{pre}/mlp/linear_{j + 1}"]["w"]), np.asarray(p[f"{pre}/mlp/linear_{j + 1}"]["b"])
      src_w, src_b = flat[f"layer{l}/mlp/w{j}"], flat[f"layer{l}/mlp/b{j}"]
      np.testing.assert_array_equal(w[: src_w.shape[0], : src_w.shape[1]], src_w)
      np.testing.assert_array_equal(b[: src_b.shape[0]], src_b)
      assert np.abs(w).sum() == np.abs(src_w).sum() and np.abs(b).sum() == np.abs(src_b).sum()
  assert "transformer/layer_0/mlp/linear_3" in p   # sort's first MLP is deeper than tracr's two layers
  enc = model.input_encoder.encoding_map
  tok = np.asarray(p["token_embed"]["embeddings"])
  assert tok.shape[0] == len(enc) and enc["BOS"] == 3 and enc["compiler_pad"] == 4   # tracr's ids
  np.testing.assert_array_equal(tok[enc["BOS"]], flat["embed/token"][3])
  np.testing.assert_array_equal(tok[enc[2]], flat["embed/token"][1])
  np.testing.assert_array_equal(np.asarray(p["pos_embed"]["embeddings"]), flat["embed/position"])


def test_apply_runs_forward_on_params_and_get_compiled_model_reads_them():
  """As in tracr: ``apply`` is ``forward(params, encode(tokens))``, so an ablation of ``params`` shows;
  ``get_compiled_model()`` has tracr's ``embed``, ``unembed``, ``transformer`` and ``__call__``."""
  program, _, base = _jaxmem("reverse")
  model = compiling.AssembledTransformerModel(base.compiled, "compiler_pad")
  tokens = ["BOS", "a", "b", "c"]
  out = model.apply(tokens)
  assert out.decoded == ["BOS", "c", "b", "a"]
  ids = np.asarray([model.input_encoder.encode(tokens)])
  fwd = model.forward(model.params, ids)
  np.testing.assert_array_equal(np.asarray(fwd.transformer_output.output), out.transformer_output)
  np.testing.assert_array_equal(np.asarray(fwd.unembedded_output), out.unembedded)
  assert model.output_encoder.decode(out.unembedded[0, 1:].tolist()) == ["c", "b", "a"]
  cfg = model.model_config
  assert [r.shape for r in out.residuals] == [(1, 4, len(model.residual_labels))] * (2 * cfg.num_layers)
  assert [a.shape for a in out.attn_logits] == [(1, cfg.num_heads, 4, 4)] * cfg.num_layers
  cm = model.get_compiled_model()
  assert cm.use_unembed_argmax and cm.pad_token == model.input_encoder.pad_encoding
  np.testing.assert_array_equal(np.asarray(cm.embed(ids)), out.input_embeddings)
  np.testing.assert_array_equal(np.asarray(cm(ids).transformer_output.output), out.transformer_output)
  np.testing.assert_array_equal(np.asarray(cm.unembed(out.transformer_output, True)), out.unembedded)
  # ablate the last layer's attention output: `reverse` is gone from apply, forward and get_compiled_model
  last = f"transformer/layer_{cfg.num_layers - 1}/attn/linear"
  model.params[last] = {k: 0 * v for k, v in model.params[last].items()}
  assert model.apply(tokens).decoded == ["BOS", None, None, None]
  dims = [model.residual_labels.index(f"{program.label}:{v}") for v in "abc"]
  assert not np.asarray(cm(ids).transformer_output.output)[0][:, dims].any()
  assert base.apply(tokens).decoded == ["BOS", "c", "b", "a"]


def test_residual_labels_are_tracrs_convention_for_dimensions_jaxmem_adds():
  """``bos`` is tracr's ``tokens:BOS``; the SelectorWidth scratch is tracr's ``s_selector_width_attn_output``;
  the SOps the rewrite derives (``s:major``) take ``_``, so every label is ``name`` or ``name:value`` with a
  name free of ``:``."""
  _, _, model = _jaxmem("sort")
  labels = model.residual_labels
  assert labels[:2] == ["one", "tokens:BOS"]
  assert {"target_pos_major", "target_pos_major_selector_width_attn_output", "target_pos_minor",
          "target_pos_minor_selector_width_attn_output"} <= set(labels)
  names = {lab.split(":")[0] for lab in labels}
  assert names == {"one", "tokens", "indices", "target_pos", "target_pos_major", "target_pos_minor", "sort",
                   "target_pos_major_selector_width_attn_output", "target_pos_minor_selector_width_attn_output"}
  assert len(set(labels)) == len(labels) == model.compiled.residual_width


def test_encoder_ids_are_tracrs_order():
  """tracr sorts a space's basis directions by value, and by their label ``name:value`` where values do not
  compare: BOS sits among the tokens (first before lowercase tokens, after integer ones), outputs likewise; the
  ``unembedded`` ids are the output encoder's."""
  cases = [("tokens", ["b", "compiler_pad", "a", "BOS"]), ("tokens", [3, "BOS", 1, 2, "compiler_pad"]),
           ("m", [1, "#", "z"])]
  want = [["BOS", "a", "b", "compiler_pad"], [1, 2, 3, "BOS", "compiler_pad"], ["#", 1, "z"]]
  assert [compiling.tracr_order(name, values) for name, values in cases] == want
  try:   # tracr's own sort of its basis directions
    from tracr.craft import bases
  except ImportError:
    bases = None
  if bases is not None:
    assert [[b.value for b in sorted(bases.BasisDirection(name, v) for v in values)]
            for name, values in cases] == want
  program = rasp.Map(lambda t: "#" if t == "a" else 1, rasp.tokens).named("m")
  model = rasp.compile_rasp_to_model(program, {"a", "b"}, 3)
  assert model.compiled.meta["output"]["values"] == [1, "#"]        # jaxmem's own order
  assert list(model.output_encoder.encoding_map) == ["#", 1]          # tracr's: "m:#" < "m:1"
  assert list(model.input_encoder.encoding_map) == ["a", "b", "compiler_bos", "compiler_pad"]
  out = model.apply(["compiler_bos", "a", "b", "a"])
  assert out.decoded[1:] == ["#", 1, "#"] == model.output_encoder.decode(out.unembedded[0, 1:].tolist())


# ----------------------------------------------------------------------------- beside tracr


TRACR_PROGRAMS = {  # name -> (build(lib, rasp), vocab); the same text builds jaxmem's and tracr's program
    "shift_by": (lambda lib, r: lib.shift_by(1, r.tokens), {"a", "b"}),
    "frac_prevs": (lambda lib, r: lib.make_frac_prevs(r.tokens == "a"), {"a", "b"}),
    "length": (lambda lib, r: lib.make_length(), {"a", "b"}),
}


@functools.cache
def _both(name):
  """(jaxmem program, jaxmem model, tracr program, tracr model) of one program of tracr's ``lib.py``."""
  pytest.importorskip("tracr", reason="tracr-pypi is not installed (pip install tracr-pypi==1.0.0)")
  from tracr.compiler import compiling as tracr_compiling
  from tracr.compiler import lib as tracr_lib
  from tracr.rasp import rasp as tracr_rasp
  build, vocab = TRACR_PROGRAMS[name]
  ours = build(conformance.tracr_lib(), rasp)
  theirs = build(tracr_lib, tracr_rasp)
  return (ours, rasp.compile_rasp_to_model(ours, vocab, N, compiler_bos="BOS"), theirs,
          tracr_compiling.compile_rasp_to_model(theirs, vocab, N, compiler_bos="BOS"))


def _pattern(params):
  return {re.sub(r"layer_\d+", "layer_*", k) for k in params}


@pytest.mark.parametrize("name", sorted(TRACR_PROGRAMS))
def test_params_keys_shapes_and_encoders_agree_with_tracrs(name):
  _, ours, _, theirs = _both(name)
  tracr_keys = {"token_embed", "pos_embed"} | {f"transformer/layer_{l}/{m}" for l in range(
      theirs.model_config.num_layers) for m in ("attn/query", "attn/key", "attn/value", "attn/linear",
                                                "mlp/linear_1", "mlp/linear_2")}
  assert set(theirs.params) == tracr_keys   # what tracr's layout is
  extra = _pattern(ours.params) - _pattern(theirs.params)
  assert _pattern(theirs.params) <= _pattern(ours.params) and all(
      re.fullmatch(r"transformer/layer_\*/mlp/linear_([3-9]|\d\d+)", k) for k in extra), extra
  if name != "length":   # the same layers, 2-layer MLPs: the same keys
    assert set(ours.params) == set(theirs.params)
  for m in (ours, theirs):
    cfg, d = m.model_config, len(m.residual_labels)
    HK = cfg.num_heads * cfg.key_size
    shapes = {k: {n: tuple(np.shape(a)) for n, a in v.items()} for k, v in m.params.items()}
    assert shapes["token_embed"] == {"embeddings": (m.input_encoder.vocab_size, d)}
    assert shapes["pos_embed"] == {"embeddings": (N + 1, d)}
    for l in range(cfg.num_layers):
      pre = f"transformer/layer_{l}"
      for n in ("query", "key", "value"):
        assert shapes[f"{pre}/attn/{n}"] == {"w": (d, HK), "b": (HK,)}
      assert shapes[f"{pre}/attn/linear"] == {"w": (HK, d), "b": (d,)}
      assert shapes[f"{pre}/mlp/linear_1"] == {"w": (d, cfg.mlp_hidden_size), "b": (cfg.mlp_hidden_size,)}
      chain = [shapes[f"{pre}/mlp/linear_{j}"]["w"] for j in range(1, 10) if f"{pre}/mlp/linear_{j}" in shapes]
      assert all(a[1] == b[0] for a, b in zip(chain[:-1], chain[1:], strict=True)) and chain[-1][1] == d
  assert list(ours.input_encoder.encoding_map.items()) == list(theirs.input_encoder.encoding_map.items())
  assert (ours.input_encoder.bos_encoding, ours.input_encoder.pad_encoding) == \
      (theirs.input_encoder.bos_encoding, theirs.input_encoder.pad_encoding)
  out_ids = [getattr(m.output_encoder, "encoding_map", None) for m in (ours, theirs)]
  assert out_ids[0] == out_ids[1]


@pytest.mark.parametrize("name", sorted(TRACR_PROGRAMS))
def test_residual_labels_have_tracrs_format(name):
  """The same space has the same label, up to tracr's id suffix (tracr-pypi labels a SOp ``name_id``); tracr's
  extra dimensions are ones jaxmem does not need."""
  _, ours, _, theirs = _both(name)
  strip = lambda labs: {re.sub(r"_\d+(?=:|$|_selector_width_attn_output)", "", lab) for lab in labs}
  mine, tracrs = strip(ours.residual_labels), strip(theirs.residual_labels)
  assert mine <= tracrs, mine - tracrs
  assert all(lab in ("one", "tokens:compiler_pad") or lab.startswith("indices:") for lab in tracrs - mine)


@pytest.mark.parametrize("name", sorted(TRACR_PROGRAMS))
def test_tracr_style_reader_runs_on_both_models(name):
  """One reader, both models: with softmax it is tracr's forward pass, with hard attention jaxmem's; each
  decodes its program's output through its own ``residual_labels`` and ``output_encoder``."""
  ours_prog, ours, theirs_prog, theirs = _both(name)
  for xs in (["a", "b", "a"], ["b", "b", "a", "b"]):
    tokens = ["BOS"] + xs
    x = tracr_style_forward(theirs, tokens, "softmax")
    np.testing.assert_allclose(x, np.asarray(theirs.apply(tokens).transformer_output)[0], atol=2e-3)
    x = tracr_style_forward(ours, tokens, "hard", tol=ours.compiled.meta["tie_tol"])
    np.testing.assert_allclose(x, np.asarray(ours.apply(tokens).transformer_output)[0], atol=1e-5)
    want = rasp.evaluate(ours_prog, xs)
    got = tracr_style_decode(ours, ours_prog.label, x[1:])
    assert conformance.agree(ours.compiled.meta["output"]["encoding"], want, got)[0], (xs, want, got)
  # tracr's idioms, unchanged, on both: forward(params, ids), get_compiled_model() inside hk.transform
  import haiku as hk
  import jax.numpy as jnp
  for m in (ours, theirs):
    ids = jnp.array([m.input_encoder.encode(["BOS", "a", "b"])])
    out = m.forward(m.params, ids)
    t = out.transformer_output
    assert len(t.residuals) == len(t.layer_outputs) == 2 * m.model_config.num_layers
    assert t.attn_logits[0].shape == (1, m.model_config.num_heads, 3, 3)
    assert out.unembedded_output.shape == (1, 3)
    embed = hk.without_apply_rng(hk.transform(lambda tokens: m.get_compiled_model().embed(tokens)))  # noqa: B023
    emb = embed.apply(m.params, ids)
    tok, pos = m.params["token_embed"]["embeddings"], m.params["pos_embed"]["embeddings"]
    np.testing.assert_array_equal(emb[0], np.asarray(tok)[ids[0]] + np.asarray(pos)[:3])
