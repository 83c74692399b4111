"""UniMatrixLM: causality for every variant and option (exact zero Jacobian blocks w.r.t. the one-hot inputs,
and bit-identical earlier logits when later tokens change), shared depth against a Python loop, ACT's limits
and ponder cost, pointer fusion, dropout, the paper's parameter counts, bad input; and the
Recurrent-FFN-Hybrid and latent models."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxmem.models as models
from jaxmem.experiments.unimatrix.common import three_token_typed_config
from jaxmem.models import TransformerConfig, TransformerLM, UniMatrixConfig, UniMatrixLM, count_params
from jaxmem.models.unimatrix import (
  VARIANTS,
  TypedLatentCompressor,
  param_breakdown,
  recurrent_ffn_hybrid,
  triple_latent,
  triple_latent_params_from_legacy,
)
from jaxmem.models.unimatrix.hybrid import params_from_legacy as hybrid_params_from_legacy
from jaxmem.models.unimatrix.model import _Inputs
from jaxmem.train.losses import recall_loss, with_ponder_cost
from tests.models.jitted import assert_causal, forward, logits_and_aux, program_text

V, T, t0 = 19, 11, 5   # vocabulary, length, the position whose logits are checked
TINY = dict(vocab_size=V, d_model=16, n_heads=2, state_dim=5, max_len=16, depth=2, chunk_size=4)


def tiny(variant="core", **kw) -> UniMatrixConfig:
  if variant == "sparse_pointer" or kw.get("n_slots"):
    kw.setdefault("n_slots", 6)
  return UniMatrixConfig(variant=variant, **{**TINY, **kw})


def tokens(seed=1, B=2, n=T, vocab=V):
  # a small alphabet makes repeats (ROSA matches, slot merges) likely
  return jax.random.randint(jax.random.key(seed), (B, n), 0, min(vocab, 6))


# every variant, and every option in some combination: ACT, DeepEmbed, both ROSA sources and modulations, step
# embeddings, slots with / without pointer and write gate, spectral norm, dense memory, hybrid updates, no
# positions, remat, per-channel retention (chunked derivatives)
CASES = [(v, {}) for v in VARIANTS] + [
    ("core", dict(act=True, deep_embed=True, rosa="automaton", step_embed=True, remat=True,
                  rosa_modulation="token", retention="channel")),
    ("sparse_pointer", dict(act=True, write_gate=False, rosa="bigram", mode="recurrent")),
    ("sparse_pointer", dict(slot_query="prev_token", slot_cos_scale=8.0, slot_merge="key_id")),
    ("core", dict(n_slots=4, pointer=True, write_gate=True, dense_memory=True, spectral_norm=True,
                  updates="hybrid",
                  positions="none")),
]


def _ids(case):
  v, kw = case
  return v + ("-" + "-".join(f"{k}={x}" for k, x in kw.items()) if kw else "")


@nnx.jit
def _onehot_logits_and_jacobian(model, oh_BTV, w_V):
  """The logits of ``apply_onehot`` and ``J[b, t, c, s] = Σ_v |∂ (logits[b, t] · w) / ∂ onehot[c, s, v]|``:
  every position from one compiled program (one forward pass, its reverse pass vmapped over the B·T
  cotangents)."""
  graphdef, state = nnx.split(model)

  def logits(o):   # a copy of the model at this trace level (a dropout model's RNG counter is mutated)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a, state)).apply_onehot(o)

  y, pullback = jax.vjp(logits, oh_BTV)
  B, n = oh_BTV.shape[:2]
  cotangents = jnp.eye(B * n, dtype=y.dtype).reshape(B * n, B, n, 1) * w_V[None, None, None, :]
  J = jnp.abs(jax.vmap(lambda c: pullback(c)[0])(cotangents)).sum(-1)   # [(b, t), c, s]
  return y, J.reshape(B, n, B, n)


def onehot_jacobian(model, x_BT):
  """(logits of the one-hot path, ``J [B, T, B, T]``, the mask of the (b, t) ← (b, s ≤ t) entries)."""
  oh = jax.nn.one_hot(x_BT, model.cfg.vocab_size)
  w = jax.random.normal(jax.random.key(7), (model.cfg.vocab_size,))
  y, J = _onehot_logits_and_jacobian(model, oh, w)
  B, n = x_BT.shape
  seen = np.eye(B, dtype=bool)[:, None, :, None] & np.tril(np.ones((n, n), bool))[None, :, None, :]
  return np.asarray(y), np.asarray(J), seen


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.slow
def test_causal_by_gradient_and_by_changing_future_tokens(case):
  """Logits at t: exactly zero gradient w.r.t. the one-hot inputs after t (and of other rows), at every t, and
  unchanged when they change."""
  variant, kw = case
  model = UniMatrixLM(tiny(variant, **kw), rngs=nnx.Rngs(0))
  x = tokens()
  y_onehot, J, _ = onehot_jacobian(model, x)
  assert_causal(J, _ids(case))
  y = forward(model, x)
  # the one-hot path is the token path
  np.testing.assert_allclose(y_onehot, np.asarray(y), rtol=1e-5, atol=1e-6)
  for t, shift in ((0, 1), (t0, 1), (t0, 3), (T - 2, 2)):
    x2 = x.at[:, t + 1:].set((x[:, t + 1:] + shift) % V)
    y2 = forward(model, x2)
    np.testing.assert_array_equal(np.asarray(y2[:, :t + 1]), np.asarray(y[:, :t + 1]))
    assert float(jnp.abs(y2[:, t + 1:] - y[:, t + 1:]).max()) > 0  # later positions do see them


# packed rows: every option that reads another token (ROSA bigram / automaton, positions, the previous token
# of the slot keys and merge ids, the matrix state, the dense memory, the slot memory and its pointer)
PACKED_CASES = [
    ("ids", dict(act=True, deep_embed=True, step_embed=True, rosa="automaton", retention="channel",
                 dense_memory=True, n_slots=3, slot_top_k=2, pointer=True, write_gate=True, slot_merge="key_id",
                 slot_query="prev_token")),
    ("onehot", dict(rosa="bigram", spectral_norm=True, updates="hybrid", n_slots=3, slot_top_k=2, pointer=True,
                    write_gate=True, dense_top_k=2)),
]


@functools.partial(nnx.jit, static_argnames="onehot")
def _packed_logits_and_input_grads(model, x_BT, cot_BTV, segment_ids, onehot: bool):
  """Logits (ids or one-hot path) and, for one-hot inputs, the gradient of ``<cot, logits>`` w.r.t. them."""
  if not onehot:
    return model(x_BT, segment_ids), None
  graphdef, state = nnx.split(model)
  f = lambda o: nnx.merge(graphdef, state, copy=True).apply_onehot(o, segment_ids)
  y, pullback = jax.vjp(f, jax.nn.one_hot(x_BT, model.cfg.vocab_size))
  return y, pullback(cot_BTV)[0]


@pytest.mark.parametrize("path,kw", PACKED_CASES, ids=[p for p, _ in PACKED_CASES])
def test_packed_rows_give_each_document_its_own_logits(path, kw):
  """UniMatrixLM(tokens, segment_ids): each document's logits (and, on the one-hot path, their gradients
  w.r.t. the inputs) equal the model's on that document alone; padding inputs get zero gradient."""
  from tests.kernels.packed import PACKED, RUNS_B, RUNS_T
  from tests.models.params import perturb
  model = UniMatrixLM(tiny("core", **kw), rngs=nnx.Rngs(0))
  perturb(model, 1, 0.1)  # zero-initialised gates (ROSA modulation, write gate) hide nothing
  x = np.random.default_rng(2).integers(0, 3, PACKED.shape).astype(np.int32)  # repeats: ROSA matches, merges
  take = lambda a: np.asarray(a)[RUNS_B[:, None], RUNS_T]
  cot = np.random.default_rng(3).normal(size=PACKED.shape + (V,)).astype(np.float32) * (PACKED != 0)[..., None]
  onehot = path == "onehot"
  y, g = _packed_logits_and_input_grads(model, x, cot, PACKED, onehot)
  y_alone, g_alone = _packed_logits_and_input_grads(model, take(x), take(cot), None, onehot)
  np.testing.assert_allclose(take(y), y_alone, rtol=1e-4, atol=1e-5)
  y_unpacked = _packed_logits_and_input_grads(model, x, cot, None, onehot)[0]
  assert np.abs(take(y_unpacked) - y_alone).max() > 1e-3, "without segment_ids the documents see each other"
  if onehot:
    np.testing.assert_allclose(take(g), g_alone, rtol=1e-4, atol=1e-5)
    assert not np.any(np.asarray(g)[PACKED == 0])
  with pytest.raises(ValueError, match="carry_state=True cannot take `segment_ids`"):
    UniMatrixLM(tiny("core", carry_state=True), rngs=nnx.Rngs(0))(x, PACKED)
  with pytest.raises(ValueError, match=r"`segment_ids` must have shape \[B, T\] = \(2, 9\)"):
    model(x, PACKED[:, :3])


@pytest.mark.parametrize("variant", ["core", "discovery"])
@pytest.mark.slow
def test_the_papers_carried_state_leaks_and_the_checks_catch_it(variant):
  """carry_state=True is the released code's bug (state of depth step n → step n + 1): both checks fail."""
  model = UniMatrixLM(tiny(variant, carry_state=True), rngs=nnx.Rngs(0))
  x = tokens()
  _, J, seen = onehot_jacobian(model, x)
  assert J[:, t0][~seen[:, t0]].max() > 1e-6
  x2 = x.at[:, t0 + 1:].set((x[:, t0 + 1:] + 1) % V)
  assert float(jnp.abs(forward(model, x2)[:, :t0 + 1] - forward(model, x)[:, :t0 + 1]).max()) > 1e-7
  # and with one depth step there is nothing to carry: causal again
  _, J, seen = onehot_jacobian(UniMatrixLM(tiny(variant, carry_state=True, depth=1), rngs=nnx.Rngs(0)), x)
  assert np.all(J[~seen] == 0.0)


# configurations of CASES (their dropout-free forward is compiled there already): ACT with remat inside the
# depth scan, the slot memory's dropout site, the dense_memory variant
DROPOUT_CASES = [CASES[5], ("sparse_pointer", {}), ("dense_memory", {})]


@pytest.mark.parametrize("variant, kw", DROPOUT_CASES, ids=[_ids(c) for c in DROPOUT_CASES])
@pytest.mark.slow
def test_dropout_trains_stochastic_and_causal_and_evaluates_as_the_model_without_it(variant, kw):
  """dropout > 0: the parameters are those of dropout = 0 (same seed); train-mode calls draw new masks yet
  stay causal (same masks replayed on changed future tokens leave earlier logits bit-identical; zero future
  gradient); the masks inside the depth scan act (turning only the block's off changes the output); eval mode
  is deterministic and equals the dropout-free model exactly."""
  plain = UniMatrixLM(tiny(variant, **kw), rngs=nnx.Rngs(0))
  model = UniMatrixLM(tiny(variant, dropout=0.3, **kw), rngs=nnx.Rngs(0))
  for a, b in zip(jax.tree.leaves(nnx.state(plain, nnx.Param)), jax.tree.leaves(nnx.state(model, nnx.Param)),
                  strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  x = tokens()
  replay = nnx.clone(model)                 # the same RNG state: the next call draws the same masks
  no_block = nnx.clone(model)
  no_block.block.eval()                     # the same masks everywhere but inside the shared block
  y1, y2 = forward(model, x), forward(model, x)
  assert float(jnp.abs(y1 - y2).max()) > 0  # new masks per call
  assert float(jnp.abs(forward(no_block, x) - y1).max()) > 0
  x2 = x.at[:, t0 + 1:].set((x[:, t0 + 1:] + 1) % V)
  np.testing.assert_array_equal(np.asarray(forward(replay, x2)[:, :t0 + 1]), np.asarray(y1[:, :t0 + 1]))
  _, J, seen = onehot_jacobian(model, x)
  assert np.all(J[~seen] == 0.0)
  model.eval()
  np.testing.assert_array_equal(np.asarray(forward(model, x)), np.asarray(forward(model, x)))
  # eval mode runs the dropout-free model's program (asserted) on the same parameters: bitwise equal
  assert program_text(model, x) == program_text(plain, x)
  np.testing.assert_array_equal(np.asarray(forward(model, x)), np.asarray(forward(plain, x)))


def _run_block_by_hand(model: UniMatrixLM, x_BT):
  """The documented body written out with a Python loop over depth (independent of the lax.scan)."""
  cfg = model.cfg
  h = model.embed(x_BT) + model.pos[...][None, :x_BT.shape[1]]
  for n in range(cfg.depth):
    if model.step_embed is not None:
      h = h + model.step_embed[...][n][None, None]
    h = model.block(h)
    if model.deep_embed is not None:
      h = h * (1 + jax.nn.sigmoid(model.deep_proj(model.deep_embed(x_BT))))
  return model.embed.attend(model.ln_f(h))


@pytest.mark.parametrize("variant", ["core", "discovery", "dense_memory"])
@pytest.mark.slow
def test_one_shared_block_applied_depth_times(variant):
  kw = dict(rosa="none") if variant == "discovery" else {}
  for depth in (1, 3):
    model = UniMatrixLM(tiny(variant, depth=depth, **kw), rngs=nnx.Rngs(0))
    x = tokens()
    # eager on purpose: the loop's block calls reuse one set of per-op programs, cheaper than two compiles
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(_run_block_by_hand(model, x)), rtol=2e-5,
                               atol=2e-6)
  # depth shares parameters: only the step embeddings grow with depth
  counts = [count_params(nnx.eval_shape(lambda n=n: UniMatrixLM(tiny(variant, depth=n, **kw),
                                                                rngs=nnx.Rngs(0)))) for n in (1, 4)]
  assert counts[1] - counts[0] == (3 * TINY["d_model"] if tiny(variant).step_embed else 0)


_forward_aux = nnx.jit(lambda model, x: model(x, return_aux=True))
# one block application, written out: embedding + positions, the block, the final norm, the tied read-out
_one_block = nnx.jit(lambda m, x: m.embed.attend(m.ln_f(m.block(m.embed(x) + m.pos[...][None, :x.shape[1]]))))
# the model with a block that returns its input: embedding + positions, the final norm, the tied read-out
_no_block = nnx.jit(lambda m, x: m.embed.attend(m.ln_f(m.embed(x) + m.pos[...][None, :x.shape[1]])))


def _with_halting_bias(model: UniMatrixLM, bias: float) -> UniMatrixLM:
  model.halt.kernel[...] = jnp.zeros_like(model.halt.kernel[...])
  model.halt.bias[...] = jnp.full_like(model.halt.bias[...], bias)
  return model


def test_act_limits_are_one_step_and_all_steps():
  x = tokens()
  plain = UniMatrixLM(tiny("core", depth=3), rngs=nnx.Rngs(0))  # same weights: the halting unit comes last
  # p ≈ 1 at the first step: halt there with weight 1 -> exactly one block application
  act = _with_halting_bias(UniMatrixLM(tiny("core", depth=3, act=True), rngs=nnx.Rngs(0)), 50.0)
  logits, aux = _forward_aux(act, x)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(_one_block(act, x)), rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(aux["ponder"]), 2.0, atol=1e-6)   # N + R = 1 + 1
  # p ≈ 0: never halts early, the last step takes weight 1 -> the plain 3-step model
  _with_halting_bias(act, -50.0)
  logits, aux = _forward_aux(act, x)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(forward(plain, x)), rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(aux["ponder"]), 4.0, atol=1e-5)   # N = 3, R ≈ 1


def test_act_weights_sum_to_one_and_ponder_is_bounded():
  model = UniMatrixLM(tiny("core", depth=4, act=True, act_threshold=0.9), rngs=nnx.Rngs(0))
  model.halt.bias[...] = jnp.full_like(model.halt.bias[...], -0.5)  # p ≈ 0.38: halts at step 3
  x = tokens()
  _, aux = _forward_aux(model, x)
  p = np.asarray(aux["ponder"])
  assert np.all(p >= 1.0) and np.all(p <= 5.0) and np.all(np.isfinite(p))
  # a block that returns its input (mixer output and FFN zeroed) keeps every hⁿ = h⁰: the output
  # Σ_n wⁿ hⁿ is h⁰ exactly when the halting weights sum to 1
  for sub in (model.block.mixer.out, model.block.ffn.down):
    sub.kernel[...] = jnp.zeros_like(sub.kernel[...])
    sub.bias[...] = jnp.zeros_like(sub.bias[...])
  np.testing.assert_allclose(np.asarray(_forward_aux(model, x)[0]), np.asarray(_no_block(model, x)), rtol=2e-5,
                             atol=2e-6)


_recall_loss = nnx.jit(lambda m, b: recall_loss(m, b))
_recall_loss_with_ponder = nnx.jit(lambda m, b: with_ponder_cost(recall_loss, 0.1)(m, b))
_only_ponder = with_ponder_cost(lambda m, b: (0.0 * m(b["inputs"]).sum(), {}), 1.0)


@functools.partial(jax.jit, static_argnums=0)
def _ponder_sgd_step(graphdef, params, rest, batch):
  g = jax.grad(lambda p: _only_ponder(nnx.merge(graphdef, p, rest), batch)[0])(params)
  return jax.tree.map(lambda p, g: p - 0.5 * g, params, g), g


def test_ponder_cost_is_the_loss_plus_tau_mean_ponder_and_training_it_halts_earlier():
  """with_ponder_cost(recall_loss, τ) = recall_loss + τ·mean(N + R) (Graves 2016, eq. 14); its gradient reaches
  the halting unit, and descending it alone lowers the mean ponder."""
  model = UniMatrixLM(tiny("core", depth=3, act=True), rngs=nnx.Rngs(0))
  x = tokens()
  batch = {"inputs": x, "targets": (x + 1) % V, "mask": jnp.ones(x.shape)}
  base, m0 = _recall_loss(model, batch)
  _, aux = _forward_aux(model, x)
  total, m1 = _recall_loss_with_ponder(model, batch)
  np.testing.assert_allclose(float(total), float(base) + 0.1 * float(aux["ponder"].mean()), rtol=1e-6)
  assert m1["accuracy"] == m0["accuracy"] and float(m1["ponder"]) == pytest.approx(float(aux["ponder"].mean()))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  ponder0 = float(aux["ponder"].mean())
  p = params
  for i in range(5):
    p, g = _ponder_sgd_step(graphdef, p, rest, batch)
    if i == 0:
      assert float(jnp.abs(g["halt"]["bias"][...]).max()) > 0
  _, aux = _forward_aux(nnx.merge(graphdef, p, rest), x)
  assert float(aux["ponder"].mean()) < ponder0 - 0.05, (ponder0, float(aux["ponder"].mean()))
  with pytest.raises(ValueError, match="tau"):
    with_ponder_cost(recall_loss, -1.0)
  # an LM without ACT (abstract: the check reads its signature, not its weights)
  lm = nnx.eval_shape(lambda: TransformerLM(TransformerConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2,
                                                              max_len=16), rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match="no return_aux argument"):
    with_ponder_cost(recall_loss, 0.1)(lm, batch)


def test_pointer_fusion_puts_mass_only_on_ids_seen_before_t():
  cfg = tiny("sparse_pointer", write_gate=False)
  on = UniMatrixLM(cfg, rngs=nnx.Rngs(0))
  off = UniMatrixLM(cfg, rngs=nnx.Rngs(0))
  for m, b in ((on, 5.0), (off, -80.0)):   # softplus(5) ≈ 5, softplus(−80) = 0 (to float32)
    m.pointer_gate.kernel[...] = jnp.zeros_like(m.pointer_gate.kernel[...])
    m.pointer_gate.bias[...] = jnp.full_like(m.pointer_gate.bias[...], b)
  x = np.asarray([[3, 4, 3, 5, 1, 3, 4, 2, 0, 5, 3]], np.int32)
  diff = np.asarray(forward(on, x)) - np.asarray(forward(off, x))   # softplus(5) · pointer
  diff = diff[0]
  for t in range(x.shape[1]):
    seen = set(x[0, :t].tolist())
    mass = diff[t]
    assert np.all(np.abs(mass[[v for v in range(V) if v not in seen]]) < 1e-5), t
    if seen:   # the read weights sum to 1 over the kept slots: total mass softplus(5)
      np.testing.assert_allclose(mass.sum(), np.log1p(np.exp(5.0)), rtol=1e-4)
    else:
      assert np.abs(mass).max() < 1e-6


@pytest.mark.slow
def test_prev_token_slot_query_solves_the_papers_recall_by_construction_with_gate_strength_or_strong_cosine():
  """Untrained SparsePointer with the slot query E[x_{t−1}] and a strong pointer vote. With the paper's
  score cos/√d + log(strength) and accumulated strengths the frequent filler slots outvote the queried
  key's slot (< 30%); with strength = the last write's gate (slot_strength="gate") the same score finds
  it at ANSWER (100%), as does the score √d·cos + log(strength) with accumulated strengths."""
  from jaxmem.tasks.unimatrix import recall_batch
  b = recall_batch(jax.random.key(0), batch_size=32)
  acc = {}
  for scale, strength in ((None, "accumulate"), (8.0, "accumulate"), (None, "gate")):
    m = UniMatrixLM(UniMatrixConfig(variant="sparse_pointer", vocab_size=64, max_len=128, write_gate=False,
                                    slot_query="prev_token", slot_cos_scale=scale, slot_strength=strength),
                    rngs=nnx.Rngs(0))
    m.pointer_gate.bias[...] = jnp.full_like(m.pointer_gate.bias[...], 5.0)
    pred = np.asarray(forward(m, b.inputs))[:, -1].argmax(-1)
    acc[scale, strength] = float((pred == np.asarray(b.targets)[:, -1]).mean())
  assert acc[8.0, "accumulate"] == 1.0 and acc[None, "gate"] == 1.0 and acc[None, "accumulate"] < 0.3, acc


@pytest.mark.slow
def test_write_threshold_makes_the_no_write_branch_reachable():
  """A write gate σ(w·h) is never 0, so without a threshold every token writes; with
  slot_write_threshold=0.5 and σ ≈ 0.05 nothing is written: the gate reads 0, and the slot context and
  pointer vanish (the logits do not move when the pointer gate and the context projection's weights
  change). With the threshold 0 the same weights write and the logits move."""
  x = tokens(B=2)
  moved = {}
  for threshold in (0.5, 0.0):
    m = UniMatrixLM(tiny("sparse_pointer", slot_write_threshold=threshold), rngs=nnx.Rngs(0))
    m.write_gate.bias[...] = jnp.full_like(m.write_gate.bias[...], -3.0)   # σ(−3) ≈ 0.047
    before, aux = logits_and_aux(m, x)
    gate = np.asarray(aux["slot_write_gate"])
    assert np.all(gate == 0.0) if threshold else np.all((gate > 0) & (gate < 0.5))
    m.pointer_gate.bias[...] = m.pointer_gate.bias[...] + 4.0
    m.slot_out.kernel[...] = m.slot_out.kernel[...] + 1.0   # (its bias is added to a zero context too)
    moved[threshold] = float(np.abs(np.asarray(logits_and_aux(m, x)[0]) - np.asarray(before)).max())
  assert moved[0.5] == 0.0 and moved[0.0] > 0.1, moved


@pytest.mark.slow
def test_slot_merge_by_key_id_keeps_tokens_with_equal_embeddings_apart():
  """Tokens 5 and 6 get the same embedding row. In [5, 20, 6, 21, 5, 7] the reads use the query E[x_{t−1}]
  with a strong cosine, so at the last position (query E[5]) the pointer goes to what followed 5. Merging by
  cosine (the paper) puts both writes (keys E[5] = E[6]) in one slot whose id is the latest, 21; merging by
  key id keeps two slots with ids 20 and 21 and equal scores, so the pointer moves about half its mass from
  21 to 20 (softplus(5) ≈ 5 logits in all)."""
  x = jnp.asarray([[5, 20, 6, 21, 5, 7]])
  gap = {}
  for merge in ("cosine", "key_id"):
    m = UniMatrixLM(tiny("sparse_pointer", write_gate=False, slot_query="prev_token", slot_cos_scale=8.0,
                         slot_merge=merge, vocab_size=32), rngs=nnx.Rngs(0))
    table = np.array(m.embed.embedding[...])
    table[6] = table[5]
    m.embed.embedding[...] = table
    m.pointer_gate.bias[...] = jnp.full_like(m.pointer_gate.bias[...], 5.0)
    logits = np.asarray(forward(m, x))[0, 5]
    gap[merge] = float(logits[20] - logits[21])
  assert gap["key_id"] - gap["cosine"] > 3.0, gap   # about 5 (weights a little under 1/2 each)


# --- sizes ---------------------------------------------------------------------------------

PAPER = dict(vocab_size=259, d_model=64, depth=3, n_heads=4, state_dim=16, max_len=128)


def test_pinned_interface_and_paper_sizes():
  cfg = models.UniMatrixConfig(variant="core", **PAPER)
  model = models.UniMatrixLM(cfg, rngs=nnx.Rngs(0))
  logits = forward(model, jnp.zeros((2, 9), jnp.int32))
  assert logits.shape == (2, 9, 259) and logits.dtype == jnp.float32


def _core_closed_form(V, d, H, S, L, d_ff):
  ln = 2 * d
  mixer = (d * 3 * H * S + 3 * H * S) + (d * H + H) + (H * S * d + d) + (d * d + d)  # qkv, ρ, W_o, W_g
  ffn = d * d_ff + d_ff + d_ff * d + d
  return V * d + L * d + ln + mixer + ln + ffn + ln   # embed, positions, LN1, mixer, LN2, FFN, final LN


def test_parameter_counts_at_the_papers_sizes():
  """Ours vs the paper's (Transformer-GELU 174,848; Core 83,140; ROSA 103,876), every difference accounted."""
  abstract = lambda build: nnx.eval_shape(build)   # the parameters' shapes, no initialisation run
  counts = {v: count_params(abstract(lambda v=v: UniMatrixLM(UniMatrixConfig(variant=v, **PAPER),
                                                             rngs=nnx.Rngs(0)))) for v in VARIANTS}
  assert counts["core"] == _core_closed_form(259, 64, 4, 16, 128, 256) == 79_300
  # ROSA adds the 259 × 64 table E_rosa (rosa="bigram") and the 64 → 64 modulation: 20,736, the paper's
  # difference too
  assert counts["rosa"] - counts["core"] == 259 * 64 + 64 * 64 + 64 == 103_876 - 83_140
  # the remaining 3,840 = the paper's retention gate being per channel (64 → 64, no bias, + 4 per-head
  # scalars) where ours is one scalar per head (64 → 4 + 4 biases), which the decay rule's kernel needs
  assert 83_140 - counts["core"] == (64 * 64 + 4) - (64 * 4 + 4) == 3_840
  transformer = abstract(lambda: TransformerLM(TransformerConfig(vocab_size=259, d_model=64, n_layers=3,
                                                                 n_heads=4, d_ff=256, max_len=128),
                                               rngs=nnx.Rngs(0)))
  # the paper's Transformer has biases on q, k, v and the output projection: 3 layers × (192 + 64)
  assert 174_848 - count_params(transformer) == 3 * (3 * 64 + 64) == 768
  assert counts == {"core": 79_300, "rosa": 100_036, "discovery": 125_136, "dense_memory": 99_972,
                    "sparse_pointer": 92_038}
  core = abstract(lambda: UniMatrixLM(UniMatrixConfig(**PAPER), rngs=nnx.Rngs(0)))
  assert sum(param_breakdown(core).values()) == 79_300


def test_per_channel_retention_gives_the_papers_core_and_rosa_counts():
  """retention="channel" (gate Linear(64 → 4·16, no bias) + 4 per-head biases): Core 83,140 and ROSA 103,876,
  the paper's counts exactly."""
  build = lambda v: nnx.eval_shape(lambda: UniMatrixLM(UniMatrixConfig(variant=v, retention="channel", **PAPER),
                                                       rngs=nnx.Rngs(0)))
  core, rosa = build("core"), build("rosa")
  assert core.block.mixer.rho.kernel.shape == (64, 64) and core.block.mixer.rho.bias is None
  assert core.block.mixer.rho_bias.shape == (4,)
  assert (count_params(core), count_params(rosa)) == (83_140, 103_876)


def test_rosa_modulation_is_conditioned_on_the_rosa_row_or_the_current_token():
  """_embed by hand at a tiny size: h = e ⊙ (1 + tanh(M c + b)) + r, e = E[x_t] + P_t, r = E_rosa[x_{t−1}]
  (0 at t = 0), c = r ("rosa") or E[x_t] ("token"). The model is built abstractly and given O(1) random
  tables (at init M = 0 and the embeddings are small), so only _embed's few ops run."""
  r_ = np.random.default_rng(3)
  x = r_.integers(0, V, size=(1, 6)).astype(np.int32)
  d = TINY["d_model"]
  for form in ("rosa", "token"):
    model = nnx.eval_shape(lambda form=form: UniMatrixLM(tiny("rosa", rosa_modulation=form), rngs=nnx.Rngs(0)))
    E, P, R, M = (r_.normal(size=n) for n in ((V, d), (TINY["max_len"], d), (V, d), (d, d)))
    b = r_.normal(size=d)
    for var, value in ((model.embed.embedding, E), (model.pos, P), (model.rosa_embed.embedding, R),
                       (model.rosa_mod.kernel, M), (model.rosa_mod.bias, b)):
      var.set_value(jnp.asarray(value, jnp.float32))  # abstract (ShapeDtypeStruct) until set
    e = E[x] + P[None, :6]
    r = np.concatenate([np.zeros((1, 1, d)), R[x[:, :-1]]], axis=1)
    c = r if form == "rosa" else E[x]
    # float32 against float64: O(1) entries through one 16-term product and tanh, each op within a few
    # ε = 6e-8 relative; the products up to ~|M c| ≈ 10, so 1e-5 relative, 1e-5 absolute
    np.testing.assert_allclose(model._embed(_Inputs(jnp.asarray(x)))[0], e * (1 + np.tanh(c @ M + b)) + r,
                               rtol=1e-5, atol=1e-5, err_msg=form)


# --- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(variant="coreish"), "variant"),
    (dict(n_heads=3), "n_heads=3 must divide d_model"),
    (dict(state_dim=65), "state_dim=65 must be at most d_model"),
    (dict(state_dim=0), "state_dim must be a positive integer"),
    (dict(depth=0), "depth must be a positive integer"),
    (dict(rosa="suffix"), "rosa must be one of"),
    (dict(updates="diag"), "updates must be one of"),
    (dict(retention="row"), "retention must be one of"),
    (dict(rosa_modulation="prev"), "rosa_modulation must be one of"),
    (dict(mode="parallel"), "mode must be one of"),
    (dict(variant="discovery", mode="chunked"), "spectral_norm=True has no chunked form"),
    (dict(pointer=True), "need the slot memory"),
    (dict(variant="sparse_pointer", n_slots=2, slot_top_k=4), "slot_top_k=4 must be at most n_slots=2"),
    (dict(slot_threshold=1.5), "slot_threshold"),
    (dict(act_threshold=0.0), "act_threshold"),
    (dict(slot_query="key"), "slot_query must be one of"),
    (dict(slot_cos_scale=-1.0), "slot_cos_scale"),
    (dict(slot_strength="sum"), "slot_strength must be one of"),
    (dict(slot_merge="id"), "slot_merge must be one of"),
    (dict(variant="sparse_pointer", slot_write_threshold=1.0), r"slot_write_threshold must be in \[0, 1\)"),
    (dict(variant="sparse_pointer", write_gate=False, slot_write_threshold=0.5), "needs write_gate=True"),
    (dict(act=True, carry_state=True), "carry_state"),
    (dict(deep_embed="yes"), "deep_embed must be a bool"),
    (dict(dropout=1.0), r"dropout must be a rate in \[0, 1\)"),
    (dict(dropout=-0.1), "dropout must be a rate"),
])
def test_bad_configs_raise(kw, match):
  with pytest.raises(ValueError, match=match):
    UniMatrixConfig(**{**PAPER, **kw})


@pytest.mark.parametrize("kw, new", [(dict(variant="assoc"), '"dense_memory"'),
                                     (dict(rosa="prev_token"), '"bigram"')])
def test_renamed_values_raise_naming_the_new_ones(kw, new):
  with pytest.raises(ValueError, match=f"was renamed to {new}"):
    UniMatrixConfig(**kw)


def test_bad_inputs_raise():
  model = nnx.eval_shape(lambda: UniMatrixLM(tiny(), rngs=nnx.Rngs(0)))   # every check runs before the weights
  with pytest.raises(ValueError, match=r"tokens.*must lie in \[0, vocab_size=19\).*19"):
    model(jnp.asarray([[1, 2, 19]]))
  with pytest.raises(ValueError, match="must lie in"):
    model(jnp.asarray([[-1, 2]]))
  with pytest.raises(ValueError, match="length 17 > max_len=16"):
    model(jnp.zeros((1, 17), jnp.int32))
  with pytest.raises(ValueError, match="integer token ids"):
    model(jnp.zeros((1, 4), jnp.float32))
  with pytest.raises(ValueError, match="tokens"):
    model(jnp.zeros((4,), jnp.int32))
  with pytest.raises(ValueError, match="at least one position"):
    model(jnp.zeros((1, 0), jnp.int32))
  with pytest.raises(ValueError, match="onehot. has 5 columns"):
    model.apply_onehot(jnp.zeros((1, 3, 5)))
  with pytest.raises(ValueError, match="cfg"):
    UniMatrixLM(dataclasses.asdict(tiny()), rngs=nnx.Rngs(0))


_mean_square_grads = nnx.jit(lambda model, x: nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model))


@pytest.mark.slow
def test_jit_and_parameter_gradients_of_the_richest_variants():
  x = tokens()
  for v in ("discovery", "sparse_pointer"):   # between them: every module of UniMatrixLM but the dense memory
    leaves = jax.tree.leaves(_mean_square_grads(UniMatrixLM(tiny(v), rngs=nnx.Rngs(0)), x))
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in leaves), v
    assert sum(float(jnp.abs(leaf).sum()) for leaf in leaves) > 0, v


# --- the other architectures ---------------------------------------------------------------

def test_recurrent_ffn_hybrid_is_causal_and_sized():
  cfg = recurrent_ffn_hybrid(vocab_size=V, d_model=16, n_layers=2, n_heads=2, state_dim=8, max_len=16,
                             chunk_size=4)
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  x = tokens()
  y = forward(model, x)
  assert y.shape == (2, T, V)
  x2 = x.at[:, t0 + 1:].set((x[:, t0 + 1:] + 1) % V)
  y2 = forward(model, x2)
  np.testing.assert_array_equal(np.asarray(y2[:, :t0 + 1]), np.asarray(y[:, :t0 + 1]))
  assert float(jnp.abs(y2[:, t0 + 1:] - y[:, t0 + 1:]).max()) > 0
  # a Transformer block's FFN (d·4d + 4d + 4d·d + d) is replaced by the matrix-state block
  d, H, S = 16, 2, 8
  ms_block = (d * 3 * H * S + 3 * H * S) + (d * H + H) + (H * S * d + d) + (d * d + d)
  per_layer = 2 * 2 * d + 4 * d * d + ms_block   # two LNs, attention (no biases), memory
  assert count_params(model) == V * d + 16 * d + 2 * per_layer + 2 * d


def test_triple_latent_lm_is_causal():
  model = TransformerLM(triple_latent(vocab_size=V, d_model=16, n_layers=1, n_heads=2, state_dim=8, max_len=16),
                        rngs=nnx.Rngs(0))
  x = tokens()
  y = forward(model, x)
  x2 = x.at[:, t0 + 1:].set((x[:, t0 + 1:] + 1) % V)
  np.testing.assert_array_equal(np.asarray(forward(model, x2)[:, :t0 + 1]), np.asarray(y[:, :t0 + 1]))
  # the triple at t reads x_{t−2}, x_{t−1}, x_t: changing x_{t−2} changes logits at t
  x3 = x.at[:, t0 - 2].set((x[:, t0 - 2] + 1) % V)
  assert float(jnp.abs(forward(model, x3)[:, t0] - y[:, t0]).max()) > 0


def test_typed_latent_reads_only_the_queried_records_digits():
  from jaxmem.tasks import unimatrix as tt
  cfg = three_token_typed_config()
  model = TypedLatentCompressor(cfg, rngs=nnx.Rngs(0))
  assert 16_000 < count_params(model) < 18_500    # the paper's "18k parameters"
  b = tt.three_token_batch(jax.random.key(3), batch_size=8)
  x = np.asarray(b.inputs)
  y = np.asarray(forward(model, jnp.asarray(x)))[:, -1]
  cls = list(cfg.class_ids)
  assert np.all(y[:, [i for i in range(cfg.vocab_size) if i not in cls]] == -1e9)
  # each row with one digit changed, as a batch of the same shape: the same program, so a row whose
  # logits do not depend on the digit is bit-identical
  other_changed, query_changed = x.copy(), x.copy()
  for row in range(x.shape[0]):
    ex = tt.decode_three_token(x[row])
    other = next(g for g in ex.records if g != ex.query)
    pos = [i for i in range(len(x[row]) - 2) if x[row, i] == tt.TAG0 + other][0]   # that record's start
    other_changed[row, pos + 2] = tt.DIGIT0 + (x[row, pos + 2] - tt.DIGIT0 + 1) % 8   # another tag's a
    q = [i for i in range(len(x[row]) - 2) if x[row, i] == tt.TAG0 + ex.query][0]
    query_changed[row, q + 2] = tt.DIGIT0 + (x[row, q + 2] - tt.DIGIT0 + 1) % 8       # the queried tag's a
  np.testing.assert_array_equal(np.asarray(forward(model, jnp.asarray(other_changed)))[:, -1], y)
  moved = np.abs(np.asarray(forward(model, jnp.asarray(query_changed)))[:, -1] - y).max(axis=-1)
  assert np.all(moved > 0), moved


def test_recurrent_ffn_hybrid_legacy_parameters_load_into_the_body():
  # the former RecurrentFFNHybrid's parameter tree (blocks/memory) loads into the body's (blocks/ffn)
  cfg = recurrent_ffn_hybrid(vocab_size=V, d_model=16, n_layers=2, n_heads=2, state_dim=8, max_len=16)
  model = nnx.eval_shape(lambda: TransformerLM(cfg, rngs=nnx.Rngs(0)))
  body = nnx.state(model, nnx.Param).to_pure_dict()
  legacy = {**body, "blocks": {("memory" if k == "ffn" else k): v for k, v in body["blocks"].items()}}
  assert jax.tree.structure(hybrid_params_from_legacy(legacy)) == jax.tree.structure(body)
  with pytest.raises(ValueError, match="blocks/memory"):
    hybrid_params_from_legacy(body)


def test_triple_latent_legacy_paths_map_onto_the_body():
  """The former ``TripleLatentLM``'s parameter paths (written out here) convert to the body's."""
  model = nnx.eval_shape(lambda: TransformerLM(triple_latent(vocab_size=V, d_model=16, n_layers=1, n_heads=2,
                                                             state_dim=8, max_len=16), rngs=nnx.Rngs(0)))
  body = nnx.state(model, nnx.Param).to_pure_dict()
  b = body["blocks"]
  legacy = {"embed": body["embed"], "ln_f": body["ln_f"], "triple": body["ngram"],
            "blocks": {"ln1": b["ln1"], "ln2": b["ln2"], "mixer": b["attn"], "up": b["ffn"]["up"],
                       "down": b["ffn"]["down"]}}
  assert jax.tree.structure(triple_latent_params_from_legacy(legacy)) == jax.tree.structure(body)
  with pytest.raises(ValueError, match="'triple' and 'blocks/mixer'"):
    triple_latent_params_from_legacy(body)
