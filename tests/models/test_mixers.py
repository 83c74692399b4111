"""Token mixers as modules: the registry, per-layer mixer tuples, and the pre-refactor golden model."""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.models import (
    AssocConfig,
    SDNCConfig,
    SDNCHybridConfig,
    SoftmaxConfig,
    TransformerConfig,
    TransformerLM,
    mixers,
)
from jaxmem.models.transformer import Block
from tests.models.adam import adam_steps

TINY = dict(d_model=24, n_layers=2, n_heads=3, d_ff=40, max_len=16)
TOKENS = jax.random.randint(jax.random.key(0), (2, 11), 0, 256)
GATED = AssocConfig(rule="gated_delta", chunk_size=4)
HYBRID_STACK = (SoftmaxConfig(), GATED, SoftmaxConfig())


# --- the registry ----------------------------------------------------------------------------


def test_registry_holds_every_mixer_and_round_trips_its_config():
  assert mixers.names() == ["ahat", "assoc", "matrix_state", "sdnc", "sdnc_hybrid", "softmax", "topk_memory"]
  for cfg in (SoftmaxConfig(short_conv=2), SDNCConfig(), SDNCHybridConfig(erase=True),
              AssocConfig(rule="oja", key_norm=True, mode="recurrent", feature_map="dpfp1")):
    assert mixers.lookup(cfg.name)[0] is type(cfg)
    assert mixers.MixerConfig.from_dict(cfg.to_dict()) == cfg
    layer = mixers.build(cfg, d_model=24, n_heads=3, n_layers=2, dtype="float32", rngs=nnx.Rngs(0))
    assert isinstance(layer, mixers.lookup(cfg.name)[1])
    assert layer(jnp.ones((2, 5, 24))).shape == (2, 5, 24)


def test_registry_rejects_duplicates_bad_names_and_unknown_fields():
  with pytest.raises(ValueError, match="registered twice"):
    mixers.register("softmax", SoftmaxConfig, mixers.SoftmaxAttention)
  with pytest.raises(ValueError, match="name is 'softmax'"):
    mixers.register("attention2", SoftmaxConfig, mixers.SoftmaxAttention)
  with pytest.raises(ValueError, match="must subclass MixerConfig"):
    mixers.register("plain", dict, mixers.SoftmaxAttention)
  with pytest.raises(ValueError, match=r"unknown field\(s\) \['rule'\] for mixer 'sdnc'"):
    mixers.MixerConfig.from_dict({"name": "sdnc", "rule": "delta"})
  with pytest.raises(ValueError, match="with a 'name'"):
    mixers.MixerConfig.from_dict({"rule": "delta"})
  with pytest.raises(ValueError, match="expected a mixer config"):
    mixers.build("softmax", d_model=24, n_heads=3, n_layers=2, dtype="float32", rngs=nnx.Rngs(0))
  with pytest.raises(TypeError):
    SoftmaxConfig(name="assoc")  # the name is not an argument: it is the class


def test_a_new_mixer_is_one_registration_away(monkeypatch):
  """What adding a memory costs: a config, a module, one ``register`` call; the body and the config
  loader need no change."""
  @dataclasses.dataclass(frozen=True)
  class MeanConfig(mixers.MixerConfig):
    name: str = dataclasses.field(default="running_mean", init=False)
    short_conv: int = 0

  class RunningMean(mixers.QKVMixer):  # o_t = mean_{s≤t} v_s: a causal memory with no keys
    def read(self, x, q, k, v):
      return jnp.cumsum(v, axis=1) / jnp.arange(1, v.shape[1] + 1)[None, :, None, None]

  monkeypatch.setitem(mixers.REGISTRY, "running_mean", (MeanConfig, RunningMean))
  cfg = TransformerConfig(**TINY, mixer=mixers.MixerConfig.from_dict({"name": "running_mean"}))
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  assert isinstance(model.blocks.attn, RunningMean) and model(TOKENS).shape == (2, 11, 256)


# --- per-layer mixers ------------------------------------------------------------------------


def _stack_model(**kw):
  cfg = TransformerConfig(**{**TINY, "n_layers": 3, "mixer": HYBRID_STACK, **kw})
  return TransformerLM(cfg, rngs=nnx.Rngs(1))


def _layer_state(model, layer):
  """Layer ``layer``'s parameters sliced by hand out of the stacked state (independent of ``model.block``)."""
  P = len(model.cfg.pattern)
  state = nnx.state(model.blocks if P == 1 else model.blocks[layer % P])
  return jax.tree.map(lambda x: x[layer // P], state)


def test_per_layer_mixers_each_layer_equals_the_same_layer_built_alone():
  model = _stack_model()
  assert [type(model.block(i).attn).__name__ for i in range(3)] == ["SoftmaxAttention", "AssociativeMemory",
                                                                    "SoftmaxAttention"]
  x = model.embed_tokens(TOKENS)
  h = x
  for i, mixer_cfg in enumerate(HYBRID_STACK):
    alone = Block(model.cfg, mixer_cfg, rngs=nnx.Rngs(100 + i))  # built on its own, other weights
    want = _layer_state(model, i)
    assert jax.tree.structure(nnx.state(alone)) == jax.tree.structure(want)
    nnx.update(alone, want)
    for a, b in zip(jax.tree.leaves(nnx.state(model.block(i))), jax.tree.leaves(want), strict=True):
      np.testing.assert_array_equal(a, b)
    h = alone(h)
  np.testing.assert_allclose(model.read_out(h), model(TOKENS), rtol=1e-5, atol=1e-5)
  # the order matters: the same layers applied in another order give another function
  h2 = x
  for i in (1, 0, 2):
    alone = Block(model.cfg, HYBRID_STACK[i], rngs=nnx.Rngs(0))
    nnx.update(alone, _layer_state(model, i))
    h2 = alone(h2)
  assert np.abs(np.asarray(model.read_out(h2) - model(TOKENS))).max() > 1e-3


def test_per_layer_mixer_lm_is_causal_by_gradient():
  model = _stack_model()
  graphdef, state = nnx.split(model)
  x = model.embed_tokens(TOKENS)
  for t in (0, 5, 10):
    g = jax.grad(lambda x: nnx.merge(graphdef, state, copy=True).logits_from_embeddings(x)[:, t].sum())(x)
    per_pos = np.abs(np.asarray(g)).sum(axis=(0, 2))
    assert np.all(per_pos[t + 1:] == 0.0) and np.all(per_pos[: t + 1] > 0.0), (t, per_pos)


def test_per_layer_mixer_lm_trains_a_few_steps():
  model = _stack_model(remat=True)
  tokens = jax.random.randint(jax.random.key(3), (4, 16), 0, 32)
  losses, grads, _, _ = adam_steps(model, tokens, lr=3e-3, steps=12)
  for p in range(3):  # every layer's mixer learns, the gated-delta gates included
    mixer_grads = grads["blocks"][p]["attn"]
    assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree.leaves(mixer_grads)), p
  assert set(grads["blocks"][1]["attn"]) >= {"beta", "decay", "qkv", "out"}
  assert np.all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses


def test_a_pattern_repeats_and_equal_entries_collapse_to_one_stack():
  six = TransformerConfig(**{**TINY, "n_layers": 6, "mixer": (GATED, GATED, SoftmaxConfig())})
  assert [six.layer_mixer(i).name for i in range(6)] == ["assoc", "assoc", "softmax"] * 2
  model = TransformerLM(six, rngs=nnx.Rngs(0))
  assert len(model.blocks) == 3 and model.blocks[0].attn.qkv.kernel.shape == (2, 24, 72)
  h = model.embed_tokens(TOKENS)
  for i in range(6):
    h = model.block(i)(h)
  np.testing.assert_allclose(model.read_out(h), model(TOKENS), rtol=1e-5, atol=1e-5)
  same = TransformerConfig(**{**TINY, "mixer": (SoftmaxConfig(), SoftmaxConfig())})
  assert same.pattern == (SoftmaxConfig(),)
  a, b = TransformerLM(same, rngs=nnx.Rngs(0)), TransformerLM(TransformerConfig(**TINY), rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(a(TOKENS), b(TOKENS))


@pytest.mark.parametrize("mixer,match", [((), "non-empty tuple"),
                                         ((SoftmaxConfig(),) * 3, "must divide n_layers"),
                                         ("softmax", "must be a mixer config"),
                                         ((SoftmaxConfig(), "x"), "mixer")])
def test_bad_mixer_specs_raise(mixer, match):
  with pytest.raises(ValueError, match=match):
    TransformerConfig(**TINY, mixer=mixer)
  with pytest.raises(ValueError, match="layer"):
    TransformerConfig(**TINY).layer_mixer(2)


# --- the golden model: a single mixer config is the model of before the refactor ---------------

GOLDEN = pathlib.Path(__file__).with_name("golden") / "golden.npz"
A = dict(chunk_size=4)
CASES = {  # the spelling of tests/models/golden/make_golden.py's CASES in mixer configs
    "softmax": {},
    "softmax_conv": dict(mixer=SoftmaxConfig(short_conv=3)),
    "softmax_bf16": dict(dtype="bfloat16"),
    "softmax_io": dict(input_dim=5, output_dim=4, positions="sinusoidal"),
    "softmax_untied_nopos": dict(tie_embeddings=False, positions="none", n_layers=3),
    "sdnc": dict(mixer=SDNCConfig()),
    "hybrid_all": dict(mixer=SDNCHybridConfig(write_gate=True, erase=True, link_reads=True)),
    "hybrid_write": dict(mixer=SDNCHybridConfig(write_gate=True)),
    "hybrid_erase": dict(mixer=SDNCHybridConfig(erase=True)),
    "hybrid_links": dict(mixer=SDNCHybridConfig(link_reads=True)),
    "hebb": dict(mixer=AssocConfig(rule="hebb", **A)),
    "hebb_elu1": dict(mixer=AssocConfig(rule="hebb", feature_map="elu1", **A)),
    "delta": dict(mixer=AssocConfig(rule="delta", **A)),
    "delta_raw": dict(mixer=AssocConfig(rule="delta", key_norm=False, mode="recurrent", **A)),
    "oja": dict(mixer=AssocConfig(rule="oja", **A)),
    "decay": dict(mixer=AssocConfig(rule="decay", mode="parallel", **A)),
    "gated_delta": dict(mixer=AssocConfig(rule="gated_delta", **A)),
    "gated_delta_conv": dict(mixer=AssocConfig(rule="gated_delta", short_conv=4, chunk_size=8,
                                               precision="default")),
}


def _checksums(model):
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  return np.array(sorted(float(np.abs(np.asarray(x, np.float64)).sum()) for x in leaves))


@pytest.mark.parametrize("name", list(CASES))
def test_single_mixer_model_equals_the_pre_refactor_model(name):
  """Same seed -> the same weights (per-leaf checksums) and the same logits as the flat-field
  ``TransformerConfig`` of commit bc9c4d3 (``golden/make_golden.py`` wrote them)."""
  golden = np.load(GOLDEN)
  cfg = TransformerConfig(**{**TINY, **CASES[name]})
  model = TransformerLM(cfg, rngs=nnx.Rngs(3))
  np.testing.assert_allclose(_checksums(model), golden[f"{name}/params"], rtol=1e-7, atol=0)
  x = golden["inputs"] if cfg.input_dim else golden["tokens"]
  np.testing.assert_allclose(np.asarray(model(x))[..., ::4], golden[f"{name}/logits"], rtol=0, atol=1e-6)


def test_sdnc_encoder_decoder_equals_the_pre_refactor_model():
  from jaxmem.models import EncoderDecoderConfig, SDNCEncoderDecoder
  golden = np.load(GOLDEN)
  ed = SDNCEncoderDecoder(EncoderDecoderConfig(decoder=TransformerConfig(**TINY, mixer=SDNCConfig())),
                          rngs=nnx.Rngs(3))
  np.testing.assert_allclose(_checksums(ed), golden["encdec_sdnc/params"], rtol=1e-7, atol=0)
  tokens = golden["tokens"]
  np.testing.assert_allclose(np.asarray(ed(tokens[:, :7], tokens))[..., ::4], golden["encdec_sdnc/logits"],
                             rtol=0, atol=1e-6)
