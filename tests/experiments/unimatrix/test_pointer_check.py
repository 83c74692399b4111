"""The recall experiment's slot-merging statistics against a hand-counted case, and the SparsePointer check's
pass / fail bookkeeping end to end at tiny size."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from flax import nnx

from jaxmem.cli import main
from jaxmem.experiments.unimatrix import pointer_check, recall
from jaxmem.models import UniMatrixConfig, UniMatrixLM

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`


class _Stream:
  def __init__(self, inputs):
    self.inputs = np.asarray(inputs, np.int32)

  def batch_at(self, i):
    return {"inputs": self.inputs}


def test_slot_merge_stats_counts_distinct_tokens_sharing_a_slot():
  """Tokens 5 and 6 get the same embedding row, so their writes (keys E[x_{t−1}]) share one slot; every other
  previous token keeps its own. Counted by hand: the seven writes before the last position have previous
  tokens none, 1, 5, 20, 6, 21, 5 (6 distinct, 5 slots with 5 and 6 merged): 6 / 5 key tokens per used slot,
  1 / 5 of the used slots merged, and cosine 1 between the two rows. (Counting the written tokens instead
  would find 20, 21 and 23 in the merged slot: 7 / 5.)"""
  cfg = UniMatrixConfig(variant="sparse_pointer", vocab_size=32, d_model=16, n_heads=2, state_dim=4, depth=1,
                        max_len=16, n_slots=12, slot_top_k=2)
  model = UniMatrixLM(cfg, rngs=nnx.Rngs(0))
  table = np.array(model.embed.embedding[...])
  table[6] = table[5]
  model.embed.embedding[...] = table
  model.eval()
  seq = [[1, 5, 20, 6, 21, 5, 23, 9]]   # the last token (9) is not written before the answer's read
  stats = recall.slot_merge_stats(model, _Stream(seq))
  assert stats["ids_per_slot"] == pytest.approx(6 / 5) and stats["merged_slots"] == pytest.approx(1 / 5)
  assert stats["max_key_cos"] == pytest.approx(1.0, abs=1e-5)
  # merged by key id (slot_merge="key_id"), the same equal rows keep separate slots
  by_id = UniMatrixLM(dataclasses.replace(cfg, slot_merge="key_id"), rngs=nnx.Rngs(0))
  by_id.embed.embedding[...] = table
  by_id.eval()
  stats = recall.slot_merge_stats(by_id, _Stream(seq))
  assert stats["ids_per_slot"] == 1.0 and stats["merged_slots"] == 0.0
  assert stats["max_key_cos"] == pytest.approx(1.0, abs=1e-5)
  # distinct rows again: nothing merges, and the largest cosine is that of two random rows
  table[6] = -table[20]
  model.embed.embedding[...] = table
  stats = recall.slot_merge_stats(model, _Stream(seq))
  assert stats["ids_per_slot"] == 1.0 and stats["merged_slots"] == 0.0 and stats["max_key_cos"] < 0.85
  with pytest.raises(ValueError, match="slot memory"):
    recall.slot_merge_stats(UniMatrixLM(UniMatrixConfig(vocab_size=32, d_model=16, n_heads=2, state_dim=4,
                                                        max_len=16), rngs=nnx.Rngs(0)), _Stream(seq))


def test_pointer_check_tiny(tmp_path):
  # two steps cannot learn the recall: with min_accuracy 0 every run holds, with 1.01 none does; the table rows
  # and the summary recomputed from the saved results
  P = "--config.unimatrix_pointer_check."
  base = [P + "seq_len=24", P + "train_steps=2", P + "batch_size=4", P + "eval_batches=1", P + "seeds=(0,)",
          P + "dropouts=(0.0,)"]
  for threshold, held in ((0.0, 1), (1.01, 0)):
    out = tmp_path / f"c{threshold}"
    assert main(["reproduce", "--quick", "--only", "unimatrix_pointer_check", "--out", str(out),
                 "--no_progress", *base, P + f"min_accuracy={threshold}"]) == 0
    results = json.loads((out / "unimatrix_pointer_check" / "results.json").read_text())
    report = (out / "REPORT.md").read_text()
    assert results["expectations_held"] == held
    r = results["dropout0/s0"]
    m = r["slots"]
    assert (f"| 0 | 0 | {100 * r['accuracy']:.1f} | {r['first_step_at_100'] or 'not reached'} | "
            f"{m['ids_per_slot']:.2f} | {m['max_key_cos']:.3f} | {'yes' if held else '**no**'} |") in report
    assert f"{held}/1 runs reach" in report


def test_pointer_check_config():
  exp = pointer_check.run   # registered
  from jaxmem.experiments import load_all
  e = load_all()["unimatrix_pointer_check"]
  assert e.run is exp and e.paper == "unimatrix"
  quick, full = e.load_config(True), e.load_config(False)
  # the check: default options, 3 seeds, with and without dropout 0.1, >= 90% within a few hundred steps
  assert quick.seeds == (0, 1, 2) and quick.dropouts == (0.0, 0.1) and quick.min_accuracy == 0.9
  assert quick.options == {} and quick.train_steps <= 500 and quick.num_pairs == 4 and quick.seq_len == 128
  assert full.eval_batches > quick.eval_batches
