"""Token mixers as modules: the registry and per-layer mixer tuples (each layer equals the same block built
alone, causal by exact zero Jacobian blocks). What every mixer must do is ``test_mixer_contract.py``; each
mixer's arithmetic is checked against an independent reference in ``tests/kernels/``."""

import dataclasses

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
from tests.models.jitted import (
  assert_causal,
  embed_tokens,
  forward,
  logit_jacobian,
  program_text,
  read_out,
)

TINY = dict(d_model=24, n_layers=2, n_heads=3, d_ff=40, max_len=16)
TOKENS = jax.random.randint(jax.random.key(0), (2, 11), 0, 256)
W_V = jax.random.normal(jax.random.key(7), (256,))   # a random read-out of the logits (causality checks)
GATED = AssocConfig(rule="gated_delta", chunk_size=4)
HYBRID_STACK = (SoftmaxConfig(), GATED, SoftmaxConfig())


# --- the registry ----------------------------------------------------------------------------


def test_registry_round_trips_configs_and_builds_by_name():
  # (every registered name is checked by tests/models/test_mixer_contract.py; here, non-default fields)
  for cfg in (SoftmaxConfig(short_conv=2), SDNCConfig(), SDNCHybridConfig(erase=True),
              AssocConfig(rule="oja", key_norm=True, mode="recurrent", feature_map="dpfp1")):
    assert mixers.lookup(cfg.name)[0] is type(cfg)
    assert mixers.MixerConfig.from_dict(cfg.to_dict()) == cfg
    # built and applied abstractly: the whole init and forward are traced, nothing is compiled
    layer = nnx.eval_shape(lambda cfg=cfg: mixers.build(cfg, d_model=24, n_heads=3, n_layers=2, dtype="float32",
                                                        rngs=nnx.Rngs(0)))
    assert isinstance(layer, mixers.lookup(cfg.name)[1])
    assert nnx.eval_shape(lambda m, x: m(x), layer, jnp.ones((2, 5, 24))).shape == (2, 5, 24)


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
    def kernel(self, q, k, v):
      return jnp.cumsum(v, axis=1) / jnp.arange(1, v.shape[1] + 1)[None, :, None, None]

  monkeypatch.setitem(mixers.REGISTRY, "running_mean", (MeanConfig, RunningMean))
  cfg = TransformerConfig(**TINY, mixer=mixers.MixerConfig.from_dict({"name": "running_mean"}))
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  assert isinstance(model.blocks.attn, RunningMean)
  logits = forward(model, TOKENS)
  assert logits.shape == (2, 11, 256) and np.isfinite(np.asarray(logits)).all()


# --- per-layer mixers ------------------------------------------------------------------------


def _stack_model(**kw):
  cfg = TransformerConfig(**{**TINY, "n_layers": 3, "mixer": HYBRID_STACK, **kw})
  return TransformerLM(cfg, rngs=nnx.Rngs(1))


@pytest.fixture(scope="module")
def stack_model():
  return _stack_model()


def _layer_state(model, layer):
  """Layer ``layer``'s parameters sliced by hand out of the stacked state (independent of ``model.block``)."""
  P = len(model.cfg.pattern)
  state = nnx.state(model.blocks if P == 1 else model.blocks[layer % P])
  return jax.tree.map(lambda x: x[layer // P], state)


def _block_alone(model, mixer_cfg, layer):
  """A block built on its own (abstractly: no weights of its own) holding layer ``layer``'s parameters."""
  alone = nnx.eval_shape(lambda: Block(model.cfg, mixer_cfg, rngs=nnx.Rngs(0)))
  want = _layer_state(model, layer)
  assert jax.tree.structure(nnx.state(alone)) == jax.tree.structure(want)
  nnx.update(alone, want)
  return alone


@pytest.mark.slow
def test_per_layer_mixers_each_layer_equals_the_same_layer_built_alone(stack_model):
  model = stack_model
  assert [type(model.block(i).attn).__name__ for i in range(3)] == ["SoftmaxAttention", "AssociativeMemory",
                                                                    "SoftmaxAttention"]
  logits = forward(model, TOKENS)
  x = embed_tokens(model, TOKENS)
  h = x
  for i, mixer_cfg in enumerate(HYBRID_STACK):
    for a, b in zip(jax.tree.leaves(nnx.state(model.block(i))), jax.tree.leaves(_layer_state(model, i)),
                    strict=True):
      np.testing.assert_array_equal(a, b)   # model.block(i) is a slice: the same numbers
    h = forward(_block_alone(model, mixer_cfg, i), h)
  np.testing.assert_allclose(read_out(model, h), logits, rtol=1e-5, atol=1e-5)
  # the order matters: the same layers applied in another order give another function
  h2 = x
  for i in (1, 0, 2):
    h2 = forward(_block_alone(model, HYBRID_STACK[i], i), h2)
  assert np.abs(np.asarray(read_out(model, h2) - logits)).max() > 1e-3


def test_per_layer_mixer_lm_is_causal_by_gradient(stack_model):
  """Every logit at t has exactly zero gradient w.r.t. the embeddings after t (and other rows), nonzero
  before: all positions at once from one Jacobian."""
  assert_causal(logit_jacobian(stack_model, TOKENS, W_V), "per-layer stack")


@pytest.mark.slow
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
  h = embed_tokens(model, TOKENS)
  for i in range(6):
    h = forward(model.block(i), h)
  np.testing.assert_allclose(read_out(model, h), forward(model, TOKENS), rtol=1e-5, atol=1e-5)
  same = TransformerConfig(**{**TINY, "mixer": (SoftmaxConfig(), SoftmaxConfig())})
  assert same.pattern == (SoftmaxConfig(),)
  a, b = TransformerLM(same, rngs=nnx.Rngs(0)), TransformerLM(TransformerConfig(**TINY), rngs=nnx.Rngs(0))
  # one stack, hence one program (asserted) on the same weights: bitwise equal by construction
  assert program_text(a, TOKENS) == program_text(b, TOKENS)
  for u, v in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b)), strict=True):
    np.testing.assert_array_equal(u, v)
  np.testing.assert_array_equal(forward(a, TOKENS), forward(b, TOKENS))


@pytest.mark.parametrize("mixer,match", [((), "non-empty tuple"),
                                         ((SoftmaxConfig(),) * 3, "must divide n_layers"),
                                         ("softmax", "must be a mixer config"),
                                         ((SoftmaxConfig(), "x"), "mixer")])
def test_bad_mixer_specs_raise(mixer, match):
  with pytest.raises(ValueError, match=match):
    TransformerConfig(**TINY, mixer=mixer)
  with pytest.raises(ValueError, match="layer"):
    TransformerConfig(**TINY).layer_mixer(2)



# --- decoding with a KV cache: rows at different positions of a cache longer than the sequence -------------

# every cached read: softmax (with the conv tail), hard and soft AHAT, the literal sDNC memory, the sDNC hybrid
# with every operation (its slot presences and link reads), top-K with K = 8 > T (fewer entries than K early on)
CACHED = [SoftmaxConfig(short_conv=2), mixers.AHATConfig(), mixers.AHATConfig(beta=4.0), SDNCConfig(),
          SDNCHybridConfig(write_gate=True, erase=True, link_reads=True, short_conv=3),
          mixers.TopKMemoryConfig()]
PROMPTS, STEPS, MAX_LEN = (2, 5), 3, 12   # row r: a prompt of PROMPTS[r] tokens, then STEPS tokens; T = 8


@nnx.jit
def _rows_at_different_lengths(mixer, x_BTD):
  """Each row's prompt prefilled alone (``scan`` from ``init_state(1, MAX_LEN)``), the two states stacked, then
  ``STEPS`` tokens of both rows stepped together (row r from position ``PROMPTS[r]``): ``(prompt outputs per
  row, stepped outputs [STEPS, B, D], the final state, __call__ on the whole)``."""
  states, prompts = [], []
  for r, n in enumerate(PROMPTS):
    state, y = mixer.scan(mixer.init_state(1, MAX_LEN), x_BTD[r:r + 1, :n])
    states.append(state)
    prompts.append(y[0])
  state = jax.tree.map(lambda *xs: jnp.concatenate(xs), *states)
  xs = jnp.stack([x_BTD[r, n:n + STEPS] for r, n in enumerate(PROMPTS)], axis=1)   # [STEPS, B, D]
  state, ys = jax.lax.scan(lambda s, x: mixer.step(s, x), state, xs)
  return prompts, ys, state, mixer(x_BTD)


@pytest.mark.parametrize("cfg", CACHED, ids=lambda c: f"{c.name}-{getattr(c, 'beta', None)}")
def test_cache_rows_at_different_lengths_each_equal_their_own_sequence(cfg):
  """A cache longer than the sequence (max_len 12 > T 8), two rows at different positions stepped together:
  each row's reads equal ``__call__`` on that row (rows never read each other's slots or unwritten ones)."""
  mixer = mixers.build(cfg, d_model=12, n_heads=2, n_layers=2, dtype="float32", rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(3), (2, max(PROMPTS) + STEPS, 12))
  prompts, ys, state, y = jax.tree.map(np.asarray, _rows_at_different_lengths(mixer, x))
  tol = dict(rtol=1e-4, atol=1e-5 * float(np.abs(y).max()))
  for r, n in enumerate(PROMPTS):
    np.testing.assert_allclose(prompts[r], y[r, :n], **tol, err_msg=f"{cfg.name} row {r} prompt")
    np.testing.assert_allclose(ys[:, r], y[r, n:n + STEPS], **tol, err_msg=f"{cfg.name} row {r} steps")
  np.testing.assert_array_equal(state["kernel"]["length"], np.array(PROMPTS) + STEPS)
  assert state["kernel"]["k"].shape[1] == MAX_LEN
