"""The language-model registry (:mod:`jaxmem.models.bodies`): every body's config round-trips through the dict
form an LM config and ``config.json`` hold, the CLI switches bodies, and the bodies added to the one
Transformer body (the triple latent's n-gram inputs, the DNC LM) compute what they say. Training each body
from the command line is ``tests/test_cli.py::test_train_eval_any_body``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem import config_files
from jaxmem.models import DNCLM, DNCLMConfig, TransformerConfig, TransformerLM, bodies
from jaxmem.models.mixers import AssocConfig, SoftmaxConfig
from jaxmem.train.config import LMConfig
from jaxmem.train.lm import lm_config_from


def test_every_body_round_trips_through_its_dict_form():
  assert set(bodies.names()) >= {"transformer", "unimatrix", "dnc"}
  for name in bodies.names():
    cfg = LMConfig(model=bodies.lookup(name)[0](), data=LMConfig().data)
    d = config_files.to_dict(cfg)
    assert d["model"]["body"] == name
    assert lm_config_from(d) == cfg
  # a per-layer mixer tuple and a mixer in the ffn slot survive too
  cfg = LMConfig(model=TransformerConfig(n_layers=2, mixer=(AssocConfig(rule="delta"), SoftmaxConfig()),
                                         ffn=AssocConfig()))
  assert lm_config_from(config_files.to_dict(cfg)) == cfg


def test_a_model_section_without_a_body_is_a_transformer():
  d = config_files.to_dict(LMConfig())
  del d["model"]["body"]   # config.json written before the tag existed
  assert lm_config_from(d) == LMConfig()


def test_body_fields_are_checked_against_the_tagged_body():
  d = config_files.to_dict(LMConfig())
  d["model"]["body"] = "dnc"
  with pytest.raises(ValueError, match=r"unknown config field\(s\) \['d_ff'.*body 'dnc'"):
    lm_config_from(d)
  d["model"]["body"] = "nonesuch"
  with pytest.raises(ValueError, match="unknown model body 'nonesuch'"):
    lm_config_from(d)
  with pytest.raises(ValueError, match="TransformerConfig is 'transformer', got 'dnc'"):
    config_files.to_dataclass(TransformerConfig, {"body": "dnc"})


def test_cli_override_switches_the_body_to_its_defaults():
  base = config_files.load_config("lm_baseline:quick")
  for name in set(bodies.names()) - {"transformer"}:
    c = config_files.apply_overrides(base, [f"--config.model.body={name}"])
    assert lm_config_from(c).model == bodies.lookup(name)[0]()
  # naming the body it already has keeps the section's values
  c = config_files.apply_overrides(base, ["--config.model.body=transformer"])
  assert lm_config_from(c).model == lm_config_from(base).model
  # the next override sees the new body's fields; the old body's are gone
  c = config_files.apply_overrides(base, ["--config.model.body=dnc", "--config.model.memory_size=16"])
  assert lm_config_from(c).model == DNCLMConfig(memory_size=16)
  with pytest.raises(ValueError, match="has no field 'd_ff'"):
    config_files.apply_overrides(base, ["--config.model.body=dnc", "--config.model.d_ff=16"])
  with pytest.raises(ValueError, match="unknown model body 'nonesuch'; registered"):
    config_files.apply_overrides(base, ["--config.model.body=nonesuch"])
  # a switch after an override of the same section would silently drop it: refused, naming it
  with pytest.raises(ValueError, match="discards the earlier --config.model.d_model=96; put it before them"):
    config_files.apply_overrides(base, ["--config.model.d_model=96", "--config.model.body=unimatrix"])
  with pytest.raises(ValueError, match="discards the earlier --config.model.mixer.chunk_size=8"):
    config_files.apply_overrides(base, ["--config.model.mixer.name=assoc", "--config.model.mixer.chunk_size=8",
                                        "--config.model.mixer.name=softmax"])


def test_lm_config_refuses_models_that_are_not_byte_lms():
  with pytest.raises(ValueError, match="vocab_size=100 cannot hold the 256 byte values"):
    LMConfig(model=DNCLMConfig(vocab_size=100))
  with pytest.raises(ValueError, match="input_dim and output_dim must be 0"):
    LMConfig(model=TransformerConfig(output_dim=8))
  with pytest.raises(ValueError, match="LMConfig.model must be a model config"):
    LMConfig(model=AssocConfig())
  with pytest.raises(ValueError, match="ngram_inputs=3 needs token inputs"):
    TransformerConfig(ngram_inputs=3, input_dim=4)


def test_ngram_inputs_read_exactly_the_last_n_tokens():
  """Input embedding at t: ``e_t + GELU(W [e_{t−2}; e_{t−1}; e_t] + b)``, written out here from the model's own
  parameters; a token 3 back changes nothing at t, one 2 back does; T shorter than the window works."""
  cfg = TransformerConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_len=9, positions="none",
                          ngram_inputs=3)
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  x = jnp.asarray([[3, 1, 4, 1, 5, 9, 2, 6, 5]])
  got = np.asarray(model.embed_tokens(x))
  E, W, b = model.embed.embedding[...], model.ngram.kernel[...], model.ngram.bias[...]
  e = np.concatenate([np.zeros((2, 8), np.float32), np.asarray(E[x[0]])])
  want = np.stack([e[t + 2] + np.asarray(jax.nn.gelu(np.concatenate([e[t], e[t + 1], e[t + 2]]) @ W + b))
                   for t in range(9)])
  np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)   # float32 matmul of 24 terms vs numpy
  t = 6
  assert np.array_equal(np.asarray(model.embed_tokens(x.at[0, t - 3].set(0)))[0, t], got[0, t])
  assert not np.array_equal(np.asarray(model.embed_tokens(x.at[0, t - 2].set(0)))[0, t], got[0, t])
  # a shorter sequence is a different-shaped matmul: equal to float32 rounding (an ulp or so)
  np.testing.assert_allclose(np.asarray(model.embed_tokens(x[:, :1])), got[:, :1], rtol=1e-6, atol=1e-7)


def test_dnc_lm_is_the_dnc_on_embeddings_and_reports_its_state():
  cfg = DNCLMConfig(vocab_size=256, d_embed=8, memory_size=6, word_size=4, num_reads=2, hidden_size=10)
  model = DNCLM(cfg, rngs=nnx.Rngs(0))
  x = jnp.asarray([[0, 255, 7, 7, 3]])
  logits = model(x)
  assert logits.shape == (1, 5, 256) and logits.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(model.dnc(model.embed(x))))
  # causal: a later token changes nothing before it
  np.testing.assert_array_equal(np.asarray(model(x.at[0, 3].set(1)))[0, :3], np.asarray(logits)[0, :3])
  state = model.dnc.initial_state(1)
  assert cfg.state_floats(5) == sum(int(np.size(leaf)) for leaf in jax.tree.leaves(state))
  with pytest.raises(ValueError, match=r"`tokens` must lie in \[0, vocab_size=256\)"):
    model(jnp.asarray([[256]]))
  with pytest.raises(ValueError, match="controller must be 'lstm' or 'feedforward'"):
    DNCLMConfig(controller="gru")


def test_packed_rows_give_each_document_its_own_logits():
  # TransformerLM(tokens, segment_ids): learned positions and the n-gram window restart per document, and no
  # layer (a short convolution, a gated delta memory, softmax attention) reads across a boundary: each
  # document's logits equal the model's on that document alone (padding inside a document skipped)
  from tests.kernels.packed import PACKED, RUNS_B, RUNS_T
  mixers = (AssocConfig(rule="gated_delta", short_conv=3, chunk_size=2), SoftmaxConfig(short_conv=2))
  model = TransformerLM(TransformerConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16,
                                          mixer=mixers, ngram_inputs=3), rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)   # perturbed: identity-initialised convolution taps hide nothing
  keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(params))))
  nnx.update(model, jax.tree.map(lambda p: p + 0.05 * jax.random.normal(next(keys), p.shape, p.dtype), params))
  tokens = np.random.default_rng(2).integers(0, 32, PACKED.shape).astype(np.int32)
  packed = nnx.jit(lambda m, t, s: m(t, segment_ids=s))(model, tokens, PACKED)
  alone = nnx.jit(lambda m, t: m(t))(model, tokens[RUNS_B[:, None], RUNS_T])
  np.testing.assert_allclose(np.asarray(packed)[RUNS_B[:, None], RUNS_T], alone, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match=r"`segment_ids` must have shape \[B, T\] = \(2, 9\)"):
    model(tokens, segment_ids=PACKED[:, :3])
