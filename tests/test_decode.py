"""``jaxmem.generate``: greedy decoding's logits equal a full re-run of the generated sequence for every
registered mixer (a mixer that cannot decode yet is refused by name), per-layer mixer patterns, a mixer in the
ffn slot, n-gram inputs, every kind of positions and the DNC LM; rows of different prompt lengths, prefilled
together, decode the greedy tokens each gives alone; the output is ``[B, T + n]`` whatever the lengths;
sampling is deterministic per seed (any int), never leaves the top-k / top-p set and depends on a row's own
sequence and index only; 0-d arrays are numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxmem
from jaxmem.decode import filter_logits, seed_key
from jaxmem.models import DNCLM, DNCLMConfig, TransformerConfig, TransformerLM, mixers
from jaxmem.models.mixers import AssocConfig, MatrixStateConfig, SoftmaxConfig, SSDConfig

V, N_NEW = 17, 5
PROMPT = np.random.RandomState(0).randint(0, V, (3, 6))
LENGTHS = [6, 2, 4]          # right-padded rows of different lengths, one at the full width
BASE = dict(vocab_size=V, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16)
POSITIONS = ("learned", "sinusoidal", "none")


def _transformer(**kw):
  return TransformerLM(TransformerConfig(**{**BASE, **kw}), rngs=nnx.Rngs(0))


def _mixer_case(name):
  # each mixer's richest example config; the three kinds of positions spread over the mixers
  cfg = mixers.lookup(name)[0].examples()[-1]
  return lambda: _transformer(mixer=cfg, positions=POSITIONS[mixers.names().index(name) % 3])


CASES = {
    **{f"mixer_{n}": _mixer_case(n) for n in mixers.names()},
    "pattern_softmax_assoc": lambda: _transformer(
        n_layers=4, mixer=(AssocConfig(rule="gated_delta", short_conv=3), SoftmaxConfig())),
    "ffn_slot_mixer": lambda: _transformer(mixer=SoftmaxConfig(precision="highest"), ffn=MatrixStateConfig()),
    "triple_latent_ngram": lambda: _transformer(mixer=MatrixStateConfig(), positions="none", ngram_inputs=3),
    "ssd_in_ffn_slot": lambda: _transformer(mixer=MatrixStateConfig(), ffn=SSDConfig(chunk_size=4)),
    "dnc_lm": lambda: DNCLM(DNCLMConfig(vocab_size=V, d_embed=8, memory_size=6, word_size=4, num_reads=2,
                                        hidden_size=10), rngs=nnx.Rngs(0)),
}


@nnx.jit
def _full(model, tokens):
  return model(tokens)


def _decodes(model) -> bool:
  return not hasattr(model, "decodes") or model.decodes()


@pytest.mark.parametrize("case", list(CASES) + ["pattern_softmax_assoc/prefill_in_pieces"])
def test_greedy_logits_equal_a_full_rerun_and_choose_the_tokens(case, monkeypatch):
  lengths = LENGTHS
  if case.endswith("/prefill_in_pieces"):   # 3 pieces of 2: row 1 ends in the first, row 2 inside the last
    monkeypatch.setattr(jaxmem.decode, "PREFILL_CHUNK", 2)
    case, lengths = case.split("/")[0], [6, 2, 5]
  model = CASES[case]()
  if not _decodes(model):
    with pytest.raises(ValueError, match="no token-by-token decoding"):
      jaxmem.generate(model, PROMPT, N_NEW, temperature=0.0)
    pytest.skip(f"{case}: a mixer without decoding is refused by name")
  tokens, logits = jaxmem.generate(model, PROMPT, N_NEW, temperature=0.0, prompt_lengths=lengths,
                                   return_logits=True)
  tokens, logits = np.asarray(tokens), np.asarray(logits)
  assert tokens.shape == (3, 6 + N_NEW) and logits.shape == (3, N_NEW, V) and logits.dtype == np.float32
  # one causal re-run of the whole output: a row's logits before its trailing zeros are those of the row alone
  full = np.asarray(_full(model, jnp.asarray(tokens)))
  for b, L in enumerate(lengths):
    np.testing.assert_array_equal(tokens[b, :L], PROMPT[b, :L])
    np.testing.assert_array_equal(tokens[b, L + N_NEW:], 0)
    np.testing.assert_array_equal(tokens[b, L:L + N_NEW], np.argmax(logits[b], axis=-1))
    want = full[b, L - 1:L - 1 + N_NEW]
    # step / chunked forms against the parallel one: float32 rounding of a few dozen-term sums per layer,
    # relative to the logits' scale (the issue's 1e-5)
    np.testing.assert_allclose(logits[b], want, rtol=0, atol=1e-5 * float(np.abs(want).max()), err_msg=case)
  # the rows prefilled together (padding writing nothing, each state taken at its own last prompt token) give
  # exactly the greedy tokens of a row decoded alone from its unpadded prompt: the shortest, the one whose state
  # a wrong pick would move furthest (one more program per case; the other rows are held to the re-run above)
  b = int(np.argmin(lengths))
  L = lengths[b]
  alone = np.asarray(jaxmem.generate(model, PROMPT[b:b + 1, :L], N_NEW, temperature=0.0))
  np.testing.assert_array_equal(tokens[b, :L + N_NEW], alone[0], err_msg=f"{case}: row {b}")


def test_sampling_is_deterministic_and_stays_in_the_top_k_and_top_p_sets():
  model = CASES["dnc_lm"]()
  kw = dict(temperature=1.5, prompt_lengths=LENGTHS, return_logits=True)
  t1, l1 = jaxmem.generate(model, PROMPT, N_NEW, seed=7, **kw)
  t2, _ = jaxmem.generate(model, PROMPT, N_NEW, seed=7, **kw)
  np.testing.assert_array_equal(np.asarray(t1), np.asarray(t2))
  others = [np.asarray(jaxmem.generate(model, PROMPT, N_NEW, seed=s, **kw)[0]) for s in range(3)]
  assert any(not np.array_equal(o, np.asarray(t1)) for o in others), "the seed changes nothing"
  for top_k, top_p in ((3, None), (None, 0.6), (4, 0.5)):
    tokens, logits = jaxmem.generate(model, PROMPT, N_NEW, seed=1, top_k=top_k, top_p=top_p, **kw)
    tokens, logits = np.asarray(tokens), np.asarray(logits, np.float64)
    for b, L in enumerate(LENGTHS):
      for j in range(N_NEW):
        # temperature first, then top-k and top-p
        allowed = _allowed(logits[b, j] / kw["temperature"], top_k, top_p)
        assert tokens[b, L + j] in allowed, (top_k, top_p, b, j)
  # one compiled program for every seed, temperature and top_p value (they are arguments, not constants)
  from jaxmem.decode import decode_program
  before = decode_program._cache_size()
  for seed, temperature, top_p in ((11, 0.7, 0.3), (12, 1.3, 0.9), (2 ** 64 + 12, 1.3, 0.9)):
    jaxmem.generate(model, PROMPT, N_NEW, seed=seed, temperature=temperature, top_p=top_p,
                    prompt_lengths=LENGTHS)
  assert decode_program._cache_size() == before + 1   # (a seed of 2**64 and more too)
  greedy = jaxmem.generate(model, PROMPT, N_NEW, temperature=0.0, prompt_lengths=LENGTHS)
  top1 = jaxmem.generate(model, PROMPT, N_NEW, top_k=1, seed=3, prompt_lengths=LENGTHS)
  np.testing.assert_array_equal(np.asarray(top1), np.asarray(greedy))
  # a temperature so small that logits / temperature would overflow (or that rounds to 0 in float32) is greedy
  for tiny in (1e-38, 1e-46):
    cold = jaxmem.generate(model, PROMPT, N_NEW, temperature=tiny, seed=5, prompt_lengths=LENGTHS)
    np.testing.assert_array_equal(np.asarray(cold), np.asarray(greedy))
  # a row's samples depend on its own sequence, the seed and its index only: not on the other rows (dropped,
  # or changed) ...
  alone = jaxmem.generate(model, PROMPT[:2], N_NEW, seed=7, temperature=1.5, prompt_lengths=LENGTHS[:2])
  np.testing.assert_array_equal(np.asarray(alone), np.asarray(t1)[:2])
  other = PROMPT.copy()
  other[2] = (other[2] + 5) % V
  changed = jaxmem.generate(model, other, N_NEW, seed=7, prompt_lengths=[6, 2, 6], **{
      k: v for k, v in kw.items() if k != "prompt_lengths"})[0]
  np.testing.assert_array_equal(np.asarray(changed)[:2], np.asarray(t1)[:2])
  # ... while the index is part of the key, so copies of one prompt in one batch draw apart
  copies = np.asarray(jaxmem.generate(model, np.repeat(PROMPT[:1], 3, axis=0), N_NEW, seed=7, temperature=1.5))
  assert not (copies == copies[:1]).all(), "copies of a prompt sampled alike"


def test_the_output_is_T_plus_n_wide_when_every_prompt_is_shorter_than_T():
  # [B, T + n] as documented (it was [B, max(prompt_lengths) + n]): row b's prompt, its n new tokens from
  # column len_b on, zeros after; the padding's values are never read
  model = CASES["dnc_lm"]()
  lengths = [4, 2, 3]                       # all shorter than the prompt's width, 6
  out, logits = jaxmem.generate(model, PROMPT, N_NEW, temperature=0.0, prompt_lengths=lengths,
                                return_logits=True)
  out, logits = np.asarray(out), np.asarray(logits)
  assert out.shape == (3, 6 + N_NEW) and out.dtype == np.int32
  for b, L in enumerate(lengths):
    np.testing.assert_array_equal(out[b, :L], PROMPT[b, :L])
    np.testing.assert_array_equal(out[b, L:L + N_NEW], np.argmax(logits[b], axis=-1))
    np.testing.assert_array_equal(out[b, L + N_NEW:], 0)
  junk = PROMPT.copy()
  for b, L in enumerate(lengths):
    junk[b, L:] = (junk[b, L:] + 1) % V
  cut = np.asarray(jaxmem.generate(model, junk[:, :4], N_NEW, temperature=0.0, prompt_lengths=lengths))
  assert cut.shape == (3, 4 + N_NEW)
  np.testing.assert_array_equal(out, np.pad(cut, ((0, 0), (0, 2))))


def test_any_int_seed_and_0d_arrays_as_numbers():
  model = CASES["dnc_lm"]()
  run = lambda **kw: np.asarray(jaxmem.generate(model, PROMPT, N_NEW, **{
      "temperature": 1.5, "prompt_lengths": LENGTHS, **kw}))
  # seeds from 2**63 on (jax.random.key refuses them) and below -2**63 sample, deterministically
  for seed in (2 ** 63, 2 ** 64 + 5, -(2 ** 70), 10 ** 30):
    np.testing.assert_array_equal(run(seed=seed), run(seed=seed), err_msg=str(seed))
  # seed_key: jax.random.key(seed) itself below 2**32; every int a distinct key (jax.random.key alone keeps
  # the low 32 bits: 2**32 would be 0)
  seeds = [0, 1, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 1, -1, -(2 ** 32), 2 ** 63, -(2 ** 63), 2 ** 64, 2 ** 64 + 1,
           -(2 ** 64), 10 ** 30]
  data = [tuple(np.asarray(jax.random.key_data(seed_key(s))).tolist()) for s in seeds]
  assert len(set(data)) == len(seeds)
  for s in (0, 1, 2 ** 32 - 1):
    assert data[seeds.index(s)] == tuple(np.asarray(jax.random.key_data(jax.random.key(s))).tolist())
  key_of = lambda s: np.asarray(jax.random.key_data(seed_key(s)))
  np.testing.assert_array_equal(key_of(np.uint64(2 ** 64 - 1)), key_of(2 ** 64 - 1))   # numpy ints too
  # 0-d jax / numpy arrays are numbers: temperature (greedy at 0), top_p, seed
  ref = run(seed=3)
  for t in (jnp.float32(1.5), jnp.asarray(1.5), np.array(1.5), np.float64(1.5)):
    np.testing.assert_array_equal(run(seed=3, temperature=t), ref, err_msg=repr(t))
  np.testing.assert_array_equal(run(seed=jnp.int32(3)), ref)
  np.testing.assert_array_equal(run(temperature=jnp.float32(0.0)), run(temperature=0.0))
  np.testing.assert_array_equal(run(seed=3, top_p=jnp.float32(0.5)), run(seed=3, top_p=0.5))
  # what is not a number is refused by name
  for kw, match in ((dict(temperature=jnp.ones(2)), "`temperature` must be a number"),
                    (dict(temperature=jnp.asarray(True)), "`temperature` must be a number"),
                    (dict(seed=jnp.float32(1.0)), "`seed` must be an int"),
                    (dict(seed=2.0), "`seed` must be an int")):
    with pytest.raises(ValueError, match=match):
      run(**kw)
  with pytest.raises(ValueError, match="`temperature` must be a concrete number"):
    jax.jit(lambda t: run(temperature=t).sum())(1.5)


def _allowed(logits, top_k, top_p) -> set:
  """The tokens top-k / top-p may emit, from the definitions (float64)."""
  order = np.argsort(-logits, kind="stable")
  keep = set(order[:top_k].tolist()) if top_k else set(range(len(logits)))
  if top_p is not None:
    z = np.where(np.isin(np.arange(len(logits)), list(keep)), logits, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    keep &= set(order[before < top_p].tolist()) | {order[0]}
  return keep


def test_filter_logits_matches_the_definitions():
  logits = jax.random.normal(jax.random.key(0), (4, V)) * 3
  for top_k, top_p in ((5, None), (None, 0.7), (3, 0.9), (None, 1.0), (1, None)):
    got = np.asarray(filter_logits(logits, top_k, top_p))
    for row, g in zip(np.asarray(logits, np.float64), got, strict=True):
      assert set(np.flatnonzero(np.isfinite(g)).tolist()) == _allowed(row, top_k, top_p), (top_k, top_p)


def test_bad_arguments_are_clear_errors():
  model = _transformer(mixer=MatrixStateConfig())   # learned positions up to 16
  cases = [
      (dict(prompt_BT=PROMPT.astype(np.float32)), "integer token ids"),
      (dict(prompt_BT=PROMPT + V), r"must lie in \[0, vocab_size=17\)"),
      (dict(max_new_tokens=0), "max_new_tokens"),
      (dict(max_new_tokens=11), "exceeds the model's 16 positions"),
      (dict(temperature=-1.0), "temperature"),
      (dict(top_k=0), "top_k"),
      (dict(top_p=0.0), "top_p"),
      (dict(prompt_lengths=[6, 0, 4]), "prompt_lengths"),
      (dict(prompt_lengths=[6, 2]), "prompt_lengths"),
      (dict(seed=1.5), "`seed` must be an int"),
  ]
  for kw, match in cases:
    args = {"prompt_BT": PROMPT, "max_new_tokens": 3, **kw}
    with pytest.raises(ValueError, match=match):
      jaxmem.generate(model, **args)
  with pytest.raises(ValueError, match="cannot decode: it has no `init_state`"):
    jaxmem.generate(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), PROMPT, 3)
