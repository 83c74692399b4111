"""The RULER experiment end to end at tiny size: its config loads, a task below its smallest haystack is left
out, the training stream never holds a held-out example, and the reported score is recomputed here
independently — greedy decoding byte by byte in a Python loop over full forward passes, RULER's string match,
the teacher-forced byte accuracy in numpy, the table's mean ± sd over seeds.

End to end means code paths, not learning: one model (the paper's Transformer), one task that fits, two seeds,
two steps, at niah_single_1's smallest length."""

from __future__ import annotations

import json
import statistics

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem import config_files
from jaxmem.cli import main
from jaxmem.experiments import load_all
from jaxmem.experiments.unimatrix import ruler as exp
from jaxmem.tasks import ruler
from tests.conftest import forward
from tests.experiments.unimatrix.trained import keep_trained

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`


def test_ruler_config_loads():
  e = load_all()["unimatrix_ruler"]
  assert e.paper == "unimatrix" and e.settings is exp.RulerSettings
  quick, full = e.load_config(True), e.load_config(False)
  assert isinstance(quick, exp.RulerSettings) and quick != full and len(full.seeds) == 3
  default, full_dict = (config_files.load_config(f"{e.config}{v}").to_dict() for v in ("", ":full"))
  assert default == full_dict
  # every configured task fits at the longest length of either size
  for s in (quick, full):
    assert all(ruler.min_length(t) <= max(s.lengths) for t in s.tasks)
  with pytest.raises(ValueError, match="RulerSettings.tasks"):
    exp.RulerSettings(**{**quick.__dict__, "tasks": ("niah_single_2",)})


def test_training_stream_is_positioned_and_disjoint_from_held_out():
  stream = exp.RulerStream("niah_single_1", 1, batch_size=2, length=444, answer_bytes=9)
  b3 = stream.batch_at(3)
  again = ruler.ruler_batch("niah_single_1", seed=2 * exp.TRAIN_SEED0 + 3 * 2, batch_size=2, length=444,
                            answer_bytes=9)
  assert np.array_equal(b3["inputs"], again.inputs) and np.array_equal(b3["mask"], again.mask)
  stream.set_state({"seed": 1, "position": 3})
  assert np.array_equal(next(stream)["inputs"], b3["inputs"])
  assert stream.get_state() == {"seed": 1, "position": 4}
  held = ruler.ruler_batch("niah_single_1", seed=0, batch_size=4, length=444)
  train_rows = {bytes(r) for p in range(4) for r in stream.batch_at(p)["inputs"].astype(np.uint8)}
  assert not train_rows & {bytes(r) for r in held.inputs.astype(np.uint8)}
  with pytest.raises(ValueError, match="seed"):
    stream.set_state({"seed": 0, "position": 0})


def python_greedy(model, tokens, start: int, n: int) -> np.ndarray:
  """``n`` bytes, each the argmax of a full forward pass over the prompt and the bytes decoded before it."""
  tokens = np.array(tokens)
  tokens[:, start:] = 0
  out = []
  for i in range(n):
    logits = np.asarray(forward(model, jnp.asarray(tokens)))
    byte = logits[:, start - 1 + i].argmax(-1)
    out.append(byte)
    if start + i < tokens.shape[1]:
      tokens[:, start + i] = byte
  return np.stack(out, axis=1)


def test_ruler_experiment_tiny(tmp_path, monkeypatch):
  trained = keep_trained(monkeypatch, exp)
  out = tmp_path / "r"
  length = ruler.min_length("niah_single_1")
  C = "--config.unimatrix_ruler."
  args = [C + "models=('transformer',)", C + "tasks=('niah_single_1', 'vt')", C + f"lengths=({length},)",
          C + "seeds=(0, 1)", C + "train_steps=2", C + "batch_size=2", C + "eval_examples=2"]
  assert main(["reproduce", "--quick", "--only", "unimatrix_ruler", "--out", str(out), "--no_progress",
               *args]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| unimatrix_ruler | ok |" in report
  results = json.loads((out / "unimatrix_ruler" / "results.json").read_text())
  # vt's smallest haystack (851 bytes) does not fit in 444: not run, and said so
  assert sorted(results) == [f"transformer/niah_single_1/L{length}"]
  assert sorted(trained) == [f"L{length}_niah_single_1_transformer_s{seed}" for seed in (0, 1)]
  assert f"vt at {length}" in report
  r = results[f"transformer/niah_single_1/L{length}"]
  # each seed's score and byte accuracy, recomputed from its trained model on held-out examples 0 and 1
  batch, examples = ruler.ruler_batch("niah_single_1", seed=0, batch_size=2, length=length, answer_bytes=9,
                                      return_examples=True)
  start, n = len(examples[0].prompt), len(examples[0].completion)
  assert n == exp.completion_bytes("niah_single_1") == 9
  for seed in (0, 1):
    model = trained[f"L{length}_niah_single_1_transformer_s{seed}"]
    decoded = python_greedy(model, batch.inputs, start, n)
    texts = ["".join(chr(b) if b < 256 else "\ufffd" for b in row) for row in decoded.tolist()]
    score = np.mean([ruler.score("niah_single_1", t, e.answers) for t, e in zip(texts, examples, strict=True)])
    assert abs(r["score"][seed] - score) < 1e-12, (seed, r["score"][seed], score, texts)
    if seed == 0:
      assert r["predictions"] == texts
    pred = np.asarray(forward(model, jnp.asarray(batch.inputs))).argmax(-1)
    m = batch.mask > 0
    assert abs(r["byte_accuracy"][seed] - (pred == batch.targets)[m].mean()) < 1e-12
  # the tables: the paper's row of zeros, then mean ± sample sd over the seeds; "—" where a task did not run
  assert "| any | paper (its small models) | 0 | 0 | 0 |" in report
  for key in ("score", "byte_accuracy"):
    v = [100 * x for x in r[key]]
    cell = f"{statistics.fmean(v):.1f} ± {statistics.stdev(v):.1f}"
    assert f"| {length} | Transformer | {cell} | — | {statistics.fmean(v):.1f} |" in report, key
