"""Conditioning-circuit Transformer: the "assoc" mixer with a learning rule as a config field. The hebb circuit
is linear attention then W_O (float64 numpy); chunked and recurrent forms agree in the model; causal by exact
zero Jacobian blocks; large weights and underflowing decays stay finite under jit (values and gradients)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.models import AssocConfig, TransformerConfig, TransformerLM
from jaxmem.models.mixers import AssociativeMemory
from tests.models.jitted import assert_causal, forward, logit_jacobian

MIXER = AssocConfig(chunk_size=4)
BASE = TransformerConfig(d_model=24, n_layers=2, n_heads=3, d_ff=40, max_len=16, mixer=MIXER)


def model_cfg(body=None, **mixer_kw):
  """BASE (with ``body`` fields replaced) whose assoc mixer has ``mixer_kw`` replaced."""
  return dataclasses.replace(BASE, **(body or {}), mixer=dataclasses.replace(MIXER, **mixer_kw))


def layer(abstract=False, **mixer_kw):
  build = lambda: AssociativeMemory(dataclasses.replace(MIXER, **mixer_kw), d_model=24, n_heads=3, n_layers=2,
                                    dtype="float32", rngs=nnx.Rngs(0))
  return nnx.eval_shape(build) if abstract else build()


X = jax.random.normal(jax.random.key(1), (2, 11, 24))
TOKENS = jax.random.randint(jax.random.key(0), (2, 11), 0, 256)
W_V = jax.random.normal(jax.random.key(7), (256,))
f64 = lambda a: np.asarray(a, np.float64)


def heads64(lay):
  """q, k, v ``[B, T, H, K]`` of ``lay`` on ``X``, in float64 numpy."""
  qkv = (f64(X) @ f64(lay.qkv.kernel[...])).reshape(2, 11, 3, 3, 8)
  return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def linear_attention(q, k, v):
  """o_t = Σ_{s≤t} v_s (k_s · q_t), written directly (Katharopoulos et al. 2020, no normaliser)."""
  scores = np.einsum("bthd,bshd->bhts", q, k) * np.tril(np.ones((q.shape[1], q.shape[1])))[None, None]
  return np.einsum("bhts,bshe->bthe", scores, v)


@pytest.mark.parametrize("feature_map", ["identity", "elu1"])
def test_hebb_circuit_is_linear_attention_then_w_o(feature_map):
  lay = layer(rule="hebb", feature_map=feature_map)
  q, k, v = heads64(lay)
  if feature_map == "elu1":
    elu1 = lambda z: np.where(z > 0, z + 1, np.exp(z))
    q, k = elu1(q), elu1(k)
  expected = linear_attention(q, k, v).reshape(2, 11, 24) @ f64(lay.out.kernel[...])
  np.testing.assert_allclose(forward(lay, X), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rule", ["delta", "oja", "decay", "gated_delta"])
def test_chunked_and_recurrent_circuits_agree_in_the_model(rule):
  a = TransformerLM(model_cfg(rule=rule, key_norm=True, mode="recurrent"), rngs=nnx.Rngs(0))
  b = TransformerLM(model_cfg(rule=rule, key_norm=True, mode="chunked"), rngs=nnx.Rngs(0))
  np.testing.assert_allclose(forward(a, TOKENS), forward(b, TOKENS), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rule", ["hebb", "delta", "oja", "gated_delta"])
@pytest.mark.slow
def test_circuit_model_is_causal_by_gradient(rule):
  """Every logit at t: exactly zero gradient w.r.t. the embeddings after t (and other rows), nonzero before."""
  model = TransformerLM(model_cfg(rule=rule, key_norm=True), rngs=nnx.Rngs(0))
  assert_causal(logit_jacobian(model, TOKENS, W_V), rule)


def test_gates_exist_only_where_the_rule_uses_them():
  gates = {r: layer(abstract=True, rule=r) for r in ("hebb", "delta", "decay", "gated_delta")}
  assert gates["hebb"].beta is None and gates["hebb"].decay is None
  assert gates["delta"].beta is not None and gates["delta"].decay is None
  assert gates["decay"].beta is None and gates["decay"].decay is not None
  assert gates["gated_delta"].beta is not None and gates["gated_delta"].decay is not None


@pytest.mark.parametrize("kw,match", [({"rule": "anti_hebb"}, "AssocConfig.rule"),
                                      ({"feature_map": "relu"}, "feature_map"),
                                      ({"chunk_size": 0}, "chunk_size"),
                                      ({"mode": "fast"}, "AssocConfig.mode"),
                                      ({"precision": "fp8"}, "AssocConfig.precision"),
                                      ({"rule": "oja", "mode": "parallel"}, "no parallel form"),
                                      ({"key_norm": 1}, "key_norm")])
def test_bad_circuit_config_raises(kw, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(MIXER, **kw)


def test_hybrid_flags_are_not_fields_of_the_circuit():
  # the sDNC hybrids are their own mixer now; an assoc mixer cannot take them
  with pytest.raises(TypeError, match="erase"):
    dataclasses.replace(MIXER, erase=True)


@pytest.mark.slow
def test_circuit_lm_trains(synthetic_data_dir, tmp_path):
  import numpy as np

  from jaxmem.train import train_lm
  from tests.conftest import tiny_lm_config
  cfg = tiny_lm_config("--config.model.mixer.name=assoc", "--config.model.mixer.rule=delta",
                       "--config.model.mixer.key_norm=true", "--config.model.mixer.chunk_size=8",
                       "--config.train.n_steps=30", "--config.train.ckpt_every=30")
  res = train_lm(cfg, tmp_path / "w", progress=False)
  losses = [r["loss"] for r in res.history if "loss" in r]
  assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])


RULES = ["hebb", "delta", "oja", "decay", "gated_delta"]


@nnx.jit
def _loss_and_grads(model, tokens):
  """Under jit (no eager check sees the values): a loss, the logits, and the gradient w.r.t. every parameter."""
  def f(m):
    logits = m(tokens)
    return jnp.mean(jax.nn.logsumexp(logits, -1)), logits

  (loss, logits), grads = nnx.value_and_grad(f, has_aux=True)(model)
  return loss, logits, grads


def _all_finite(tree):
  return all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree.leaves(tree))


def test_erase_vectors_are_normalised_by_default_for_the_erasing_rules():
  for rule in RULES:
    cfg = dataclasses.replace(MIXER, rule=rule)
    assert cfg.key_norm is None and cfg.normalizes_erase == (rule in ("delta", "oja", "gated_delta"))
    assert dataclasses.replace(cfg, key_norm=False).normalizes_erase is False  # the raw rule: opt-out
    assert dataclasses.replace(cfg, key_norm=True).normalizes_erase is True
  with pytest.raises(ValueError, match="key_norm"):
    dataclasses.replace(MIXER, key_norm="yes")


LONG = {"max_len": 64}
LONG_TOKENS = jax.random.randint(jax.random.key(2), (2, 64), 0, 256)


@pytest.mark.parametrize("rule,mode",
                         [(r, "auto") for r in RULES] + [("delta", "chunked"), ("oja", "recurrent")])
@pytest.mark.slow
def test_qkv_weights_times_ten_stay_finite_under_jit(rule, mode):
  # Large projections make ‖k‖² ≫ 2/β: the raw delta / oja rules diverge, and under jit no
  # eager guard can see it. The default (normalised erase vectors) is stable by construction.
  model = TransformerLM(model_cfg(LONG, rule=rule, mode=mode), rngs=nnx.Rngs(0))
  model.blocks.attn.qkv.kernel[...] = 10.0 * model.blocks.attn.qkv.kernel[...]
  loss, logits, grads = _loss_and_grads(model, LONG_TOKENS)
  assert np.isfinite(float(loss)) and _all_finite(logits) and _all_finite(grads)


@pytest.mark.parametrize("rule,mode", [("gated_delta", m) for m in ("auto", "chunked", "parallel", "recurrent")]
                         + [("decay", "auto")])
@pytest.mark.slow
def test_decay_gates_that_underflow_to_zero_stay_finite(rule, mode):
  # σ(−200) is exactly 0 in float32: the model passes log σ (finite) instead of σ, so
  # log γ is never log 0 and values and gradients (also of the gate itself) stay finite.
  # "auto": the long model of the test above, whose programs are then compiled once for both (the other
  # forms' programs grow with the length: they keep the short one)
  long = mode == "auto"
  model = TransformerLM(model_cfg(LONG if long else None, rule=rule, mode=mode), rngs=nnx.Rngs(0))
  assert float(jax.nn.sigmoid(jnp.float32(-200.0))) == 0.0
  model.blocks.attn.decay.bias[...] = jnp.full_like(model.blocks.attn.decay.bias[...], -200.0)
  loss, logits, grads = _loss_and_grads(model, LONG_TOKENS if long else TOKENS)
  assert np.isfinite(float(loss)) and _all_finite(logits) and _all_finite(grads)
  # a memory that forgets everything each step reads only the current token: o_t = β v_t k_tᵀ q_t
  lay = layer(rule=rule, mode=mode)
  lay.decay.bias[...] = jnp.full_like(lay.decay.bias[...], -200.0)
  q, k, v = heads64(lay)
  if lay.cfg.normalizes_erase:
    k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + 1e-6)
  beta = 1.0 if lay.beta is None else 1.0 / (1.0 + np.exp(-(f64(X) @ f64(lay.beta.kernel[...])
                                                          + f64(lay.beta.bias[...]))))[..., None]
  o = beta * v * np.sum(k * q, -1, keepdims=True)
  np.testing.assert_allclose(forward(lay, X), o.reshape(2, 11, 24) @ f64(lay.out.kernel[...]), rtol=1e-4,
                             atol=1e-5)


# ----------------------------------------------------------------------------------------
# decoding: step token by token and scan from a state against the sequence call

SPLIT = 5  # of X's 11 tokens: with chunk_size 4 both pieces end in a padded chunk, and the width-3
# convolution's window spans the split
# per rule: no convolution (elu1 keys; the parallel form, oja's chunked one), and a width-3 convolution
# (DPFP keys of twice the head width; the chunked form)
DECODE_CONFIGS = [(rule, dict(feature_map="elu1", mode="chunked" if rule == "oja" else "parallel"))
                  for rule in RULES] + [(rule, dict(feature_map="dpfp1", mode="chunked", short_conv=3))
                                        for rule in RULES]


@nnx.jit
def _decode_and_scan(mixer, x_BTD):
  """One program per config: ``__call__``; ``step`` token by token from ``init_state`` (outputs, final state);
  ``scan`` over the first ``SPLIT`` tokens, then over the rest from the state it returned (outputs, final
  state)."""
  nb, T, _ = x_BTD.shape
  y = mixer(x_BTD)
  final_step, ys = jax.lax.scan(mixer.step, mixer.init_state(nb, T), jnp.moveaxis(x_BTD, 1, 0))
  state, y1 = mixer.scan(mixer.init_state(nb, T), x_BTD[:, :SPLIT])
  final_scan, y2 = mixer.scan(state, x_BTD[:, SPLIT:])
  return y, jnp.moveaxis(ys, 0, 1), final_step, jnp.concatenate([y1, y2], axis=1), final_scan


@pytest.mark.parametrize("rule,kw", DECODE_CONFIGS, ids=[f"{r}-{'conv' if kw.get('short_conv') else 'noconv'}"
                                                         for r, kw in DECODE_CONFIGS])
def test_step_and_scan_from_a_state_equal_the_sequence_call(rule, kw):
  lay = layer(rule=rule, **kw)
  cfg = lay.cfg
  if cfg.short_conv:  # random taps: at its identity initialisation the outputs would not see the conv's tail
    lay.conv.taps[...] = jax.random.normal(jax.random.key(5), lay.conv.taps.shape) / np.sqrt(cfg.short_conv)
  state = lay.init_state(2, 11)
  assert state["kernel"].dtype == jnp.float32
  assert sum(a.size for a in jax.tree.leaves(state)) == 2 * cfg.state_floats(d_model=24, n_heads=3, seq_len=11)
  y, ys, final_step, y_scan, final_scan = _decode_and_scan(lay, X)
  # The same float32 recurrence in other evaluation orders (the recurrent update per token; the parallel or
  # chunked form over the pieces, from a state): each read is a sum of at most T·D_k = 11·16 products of
  # O(1) terms (decays ≤ 1; erase vectors normalised), then W_O sums 24 of them, so rounding stays below
  # (176 + 24)·ε₃₂ ≈ 2.4e-5 of the output's scale in the worst case (√200·ε ≈ 2e-6 typical); an ignored or
  # wrong state changes outputs after the split by O(1) of it.
  scale = float(np.abs(np.asarray(y)).max())
  tol = dict(rtol=1e-4, atol=3e-5 * scale)
  np.testing.assert_allclose(ys, y, err_msg=f"{rule}: step vs __call__", **tol)
  np.testing.assert_allclose(y_scan, y, err_msg=f"{rule}: scan split at {SPLIT} vs __call__", **tol)
  S_step, S_scan = np.asarray(final_step["kernel"]), np.asarray(final_scan["kernel"])
  np.testing.assert_allclose(S_scan, S_step, rtol=1e-4, atol=3e-5 * np.abs(S_step).max(),
                             err_msg=f"{rule}: final memory, scan vs step")
  if cfg.short_conv:
    # the convolution's tail: the last K − 1 = 2 inputs (the q, k, v projections), oldest first
    want = np.asarray(lay.qkv(X))[:, -2:]
    for name, st in (("step", final_step), ("scan", final_scan)):
      np.testing.assert_allclose(st["conv"], want, rtol=1e-5, atol=1e-6, err_msg=f"{rule}: {name} conv tail")
  else:
    assert final_step["conv"] is None and final_scan["conv"] is None
