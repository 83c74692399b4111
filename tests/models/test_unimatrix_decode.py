"""UniMatrixLM decodes: ``jaxmem.generate`` (prefill by ``scan``, then ``step``s) gives the logits of a full
re-run ``model(tokens)`` at every generated position, for every variant and option that decodes (the
per-depth-step matrix states and dense-memory caches, ACT, both ROSA sources, the slot memory with pointer,
write gate and both merges, learned positions and none), and the shortest row, prefilled beside longer ones,
the greedy tokens it gives alone (also in prefill pieces of 2); ``scan`` in two pieces equals one ``scan``;
``carry_state`` is refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxmem
from jaxmem.models import UniMatrixLM
from jaxmem.models.unimatrix import VARIANTS
from tests.models.test_unimatrix import tiny

N_NEW = 5
LENGTHS = (7, 4, 5)          # three prompt lengths: rows at different prompt ends, prefill of the shortest
CUT = 5                      # scan in two pieces: [0, CUT) then the rest

CASES = [(v, {}) for v in VARIANTS] + [
    ("core", dict(act=True, rosa="automaton", retention="channel", positions="none", deep_embed=True,
                  rosa_modulation="token", mode="chunked")),
    ("dense_memory", dict(act=True, rosa="bigram", step_embed=True, updates="hybrid")),
    ("sparse_pointer", dict(slot_merge="key_id", slot_query="prev_token", slot_write_threshold=0.5,
                            slot_strength="accumulate", rosa="automaton", positions="none")),
    ("sparse_pointer", dict(write_gate=False, pointer=True, act=True, dense_memory=True, spectral_norm=True)),
]


# the ROSA stream, the slot memory and the dense memory across prefill pieces of 2 tokens (rows ending in the
# second and third piece, the longest in the fourth)
PIECES = ("sparse_pointer", dict(slot_merge="key_id", rosa="automaton", dense_memory=True, act=True,
                                 positions="none", prefill_chunk=2))
CASES.append(PIECES)


def _ids(case):
  v, kw = case
  return v + ("-" + "-".join(f"{k}={x}" for k, x in kw.items()) if kw else "")


@nnx.jit
def _rerun_and_scans(model, tokens_BT):
  """``model(tokens)``, one ``scan`` over them from ``init_state`` and the same in two pieces (one program)."""
  B, T = tokens_BT.shape
  full = model(tokens_BT)
  _, one = model.scan(model.init_state(B, T), tokens_BT)
  state, first = model.scan(model.init_state(B, T), tokens_BT[:, :CUT])
  _, rest = model.scan(state, tokens_BT[:, CUT:])
  return full, one, jnp.concatenate([first, rest], axis=1)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_generate_equals_a_full_rerun_and_scan_pieces_equal_one_scan(case, monkeypatch):
  variant, kw = case
  kw = dict(kw)
  if "prefill_chunk" in kw:
    monkeypatch.setattr(jaxmem.decode, "PREFILL_CHUNK", kw.pop("prefill_chunk"))
  model = UniMatrixLM(tiny(variant, **kw), rngs=nnx.Rngs(0))
  model.eval()
  B, P = len(LENGTHS), max(LENGTHS)
  # a small alphabet makes repeats (ROSA matches, slot merges) likely
  prompt = np.asarray(jax.random.randint(jax.random.key(3), (B, P), 0, 6), np.int32)
  out, logits = jaxmem.generate(model, prompt, N_NEW, temperature=0.0, prompt_lengths=list(LENGTHS),
                                return_logits=True)
  out, logits = np.asarray(out), np.asarray(logits)
  full, one, pieces = (np.asarray(a) for a in _rerun_and_scans(model, jnp.asarray(out)))
  # The decoding path runs the recurrent matrix-state step and the KV-cached top-K read where the re-run
  # runs the chunked / parallel forms: the same sums in another order, so equal up to float32 rounding,
  # a few ulps of the largest logit at these sizes.
  tol = 1e-5 * np.abs(full).max()
  for b, n in enumerate(LENGTHS):
    np.testing.assert_array_equal(out[b, :n], prompt[b, :n])
    np.testing.assert_array_equal(out[b, n:n + N_NEW], logits[b].argmax(-1))   # greedy: the argmax
    np.testing.assert_array_equal(out[b, n + N_NEW:], 0)
    # the logits that chose new token j were read after position n − 1 + j
    np.testing.assert_allclose(logits[b], full[b, n - 1:n - 1 + N_NEW], rtol=0, atol=tol)
    T_b = n + N_NEW                                        # row b's own tokens (zeros follow)
    np.testing.assert_allclose(one[b, :T_b], full[b, :T_b], rtol=0, atol=tol)
  np.testing.assert_allclose(pieces, one, rtol=0, atol=tol)
  # the shortest row, prefilled beside longer ones (its padding writes nothing, its state is taken at its own
  # last prompt token), decodes exactly the greedy tokens it gives alone from its unpadded prompt
  b = int(np.argmin(LENGTHS))
  n = LENGTHS[b]
  alone = np.asarray(jaxmem.generate(model, prompt[b:b + 1, :n], N_NEW, temperature=0.0))
  np.testing.assert_array_equal(out[b, :n + N_NEW], alone[0])


def test_what_cannot_decode_is_refused_by_name():
  model = UniMatrixLM(tiny("core", carry_state=True), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="carry_state"):
    jaxmem.generate(model, np.zeros((1, 3), np.int32), 2, temperature=0.0)
  with pytest.raises(ValueError, match="carry_state"):
    model.init_state(1, 4)
  learned = UniMatrixLM(tiny("core"), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="learned positions"):
    learned.init_state(1, learned.cfg.max_len + 1)
