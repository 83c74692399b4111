"""The UniMatrix experiments run end to end at tiny size, and what they report is recomputed here
independently (numpy accuracy / bits per byte from the trained weights, the report's table rows from the saved
results); their configs load, and the model factory builds what the tables name.

End to end means code paths, not learning: the fewest models that cover an experiment's paths (recall: one
model-table row and one ablation row; three-token: one model; LM: one model under both recipes), two steps."""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem import config_files
from jaxmem.cli import main
from jaxmem.experiments import load_all
from jaxmem.experiments.unimatrix import common, lm, recall, three_token
from jaxmem.models import count_params
from jaxmem.models.unimatrix.baselines import matched_transformer
from jaxmem.tasks import unimatrix as tt
from tests.conftest import forward
from tests.experiments.unimatrix.trained import keep_models, keep_trained

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`

NAMES = {"unimatrix_recall": recall.RecallSettings, "unimatrix_three_token": three_token.ThreeTokenSettings,
         "unimatrix_lm": lm.LMSettings}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_configs_load(name):
  exp = load_all()[name]
  assert exp.paper == "unimatrix" and exp.settings is NAMES[name]
  quick, full = exp.load_config(True), exp.load_config(False)
  assert isinstance(quick, NAMES[name]) and quick != full
  default, full = (config_files.load_config(f"{exp.config}{v}").to_dict() for v in ("", ":full"))
  assert default == full


def test_unknown_model_name():
  with pytest.raises(ValueError, match="unknown model"):
    common.model_factory("mamba", vocab_size=64, max_len=16)


def numpy_last_position_accuracy(model, stream, n_batches, group=None):
  hits, total = {}, {}
  for i in range(n_batches):
    b = {k: np.asarray(v) for k, v in stream.batch_at(i).items()}
    pred = np.asarray(forward(model, jnp.asarray(b["inputs"])))[:, -1].argmax(-1)
    assert np.all(b["mask"][:, :-1] == 0) and np.all(b["mask"][:, -1] == 1)
    for row in range(len(pred)):
      g = group(b["inputs"][row]) if group else "all"
      hits[g] = hits.get(g, 0) + int(pred[row] == b["targets"][row, -1])
      total[g] = total.get(g, 0) + 1
  return {g: hits[g] / total[g] for g in hits}


def test_recall_factory_options():
  # the recall table's dropout row and the ablation's options reach the model (built abstractly, nothing runs)
  build = lambda name, **kw: nnx.eval_shape(lambda: common.model_factory(name, vocab_size=64, max_len=24,
                                                                         **kw)(nnx.Rngs(0)))
  dropout = build("sparse_pointer_dropout")
  assert dropout.cfg.variant == "sparse_pointer" and dropout.cfg.dropout == 0.1
  label, options, paper = recall.ablation_row("32 no-pointer")
  ablated = build("sparse_pointer", **options)
  assert label == "32 slots, no pointer" and not ablated.cfg.pointer and ablated.cfg.n_slots == 32
  assert paper == "95.7 / 90.3 / 86.6" and ablated.cfg.write_gate
  assert ablated.cfg.dropout == 0.0 and build("core").cfg.variant == "core"
  label, options, paper = recall.ablation_row("8 no-gate")
  ablated = build("sparse_pointer", **options)
  assert (label, paper) == ("8 slots + pointer, no write gate", "—") and ablated.cfg.pointer
  assert ablated.cfg.n_slots == 8 and not ablated.cfg.write_gate
  assert build("sparse_pointer", **recall.ablation_row("accumulate")[1]).cfg.slot_strength == "accumulate"
  assert build("sparse_pointer").cfg.slot_strength == "gate"
  for bad in ("32 no-slots", "pointer", "0", ""):
    with pytest.raises(ValueError, match="ablation row"):
      recall.ablation_row(bad)


def test_recall_experiment_tiny(tmp_path, monkeypatch):
  # one model-table row and one ablation row (other pairs, other slot options): the experiment's two paths
  kept = keep_models(monkeypatch, recall)
  out = tmp_path / "r"
  R = "--config.unimatrix_recall."
  args = [R + "models=('core',)", R + "seq_len=24", R + "train_steps=2", R + "batch_size=4",
          R + "eval_batches=1", R + "seeds=(0,)", R + "ablation_pairs=(3,)",
          R + "ablation_rows=('32 no-pointer',)"]
  assert main(["reproduce", "--quick", "--only", "unimatrix_recall", "--out", str(out), "--no_progress",
               *args]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| unimatrix_recall | ok |" in report
  results = json.loads((out / "unimatrix_recall" / "results.json").read_text())
  assert sorted(results) == ["ablation/32 slots, no pointer/p3/s0", "core/s0"]
  # each accuracy recounted in numpy from the returned model (in eval mode) on the same held-out batch
  for name, tag in (("core/s0", "core_p4_s0"), ("ablation/32 slots, no pointer/p3/s0", ABL)):
    pairs = 3 if "ablation" in name else 4
    held = tt.recall_stream(recall.EVAL_SEED, batch_size=recall.EVAL_BATCH, num_pairs=pairs, seq_len=24)
    ours = numpy_last_position_accuracy(kept[tag], held, 1)["all"]
    assert abs(results[name]["accuracy"] - ours) < 1e-9, (name, results[name]["accuracy"], ours)
  assert not kept[ABL].cfg.pointer and kept[ABL].cfg.n_slots == 32
  assert kept["core_p4_s0"].cfg.variant == "core" and kept[ABL].cfg.variant == "sparse_pointer"
  # the tables, recomputed from the saved results (one seed: the mean is the value)
  row = results["core/s0"]
  a = f"{100 * row['accuracy']:.1f}"
  assert f"| UniMatrix-Core | {row['params']:,} | {a} | {a} | 12.9–13.7 |" in report
  abl = results["ablation/32 slots, no pointer/p3/s0"]
  assert f"| 32 slots, no pointer | {100 * abl['accuracy']:.1f} | 95.7 / 90.3 / 86.6 |" in report
  m = abl["slots"]
  assert (f"| 32 slots, no pointer | 3 | {m['ids_per_slot']:.2f} | {100 * m['merged_slots']:.0f} | "
          f"{m['max_key_cos']:.3f} |") in report


ABL = "ablation_32_nopointer_p3_s0"   # the tiny recall run's ablation work dir (its model's tag)


def test_three_token_experiment_tiny(tmp_path, monkeypatch):
  # one model under its own budget, two seeds: per-task held-out scoring over seeds, steps to 100%, both tables
  trained = keep_trained(monkeypatch, three_token,
                         lambda r, task, cfg: (r.model, cfg, task.train_iter.seed))
  out = tmp_path / "t"
  C = "--config.unimatrix_three_token."
  args = [C + "models=('typed_latent',)", C + "train_steps=2", C + "batch_size=4", C + "seeds=(0, 1)",
          C + "budgets=(('typed_latent', 3, 4, 0.01),)", C + "eval_every=2", C + "eval_batches=1"]
  assert main(["reproduce", "--quick", "--only", "unimatrix_three_token", "--out", str(out), "--no_progress",
               *args]) == 0
  report = (out / "REPORT.md").read_text()
  results = json.loads((out / "unimatrix_three_token" / "results.json").read_text())["typed_latent"]
  # the model's own budget, not the default one; one run per seed (seeded initialisation)
  assert sorted(trained) == ["typed_latent_s0", "typed_latent_s1"]
  for seed in (0, 1):
    _, cfg, stream_seed = trained[f"typed_latent_s{seed}"]
    assert (cfg.n_steps, cfg.lr, cfg.seed, cfg.eval_every, stream_seed) == (3, 0.01, seed, 2, seed)
  assert results["budget"] == {"train_steps": 3, "batch_size": 4, "lr": 0.01}
  w0, w1 = (np.asarray(trained[f"typed_latent_s{s}"][0].w1[...]) for s in (0, 1))
  assert not np.allclose(w0, w1)
  # each seed's accuracy recounted in numpy from its returned model on the same held-out batch
  held = tt.three_token_stream(three_token.EVAL_SEED, batch_size=three_token.EVAL_BATCH, seq_len=49, num_tags=4)
  per_seed = {}
  for seed in (0, 1):
    r = results["seeds"][str(seed)]
    ours = numpy_last_position_accuracy(trained[f"typed_latent_s{seed}"][0], held, 1,
                                        group=lambda x: tt.decode_three_token(x).task)
    assert set(ours) == set(tt.THREE_TOKEN_TASKS), ours   # 64 held-out rows hold every task
    for task in tt.THREE_TOKEN_TASKS:
      assert abs(r["accuracy"][task] - ours[task]) < 1e-9, (seed, task)
    n = {task: sum(tt.decode_three_token(x).task == task for x in np.asarray(held.batch_at(0)["inputs"]))
         for task in tt.THREE_TOKEN_TASKS}
    assert abs(r["accuracy"]["all"] - sum(ours[t] * n[t] for t in n) / sum(n.values())) < 1e-9
    # evaluated at steps 2 and 3 (every eval_every steps, and at the end)
    assert [step for step, _ in r["held_out_curve"]] == [2, 3]
    assert r["steps_to_100"] == three_token.steps_to_100(r["held_out_curve"])
    per_seed[seed] = r
  # the accuracy table row: mean ± sample sd over the seeds, recomputed from the saved results
  cells = []
  for task in tt.THREE_TOKEN_TASKS + ("all",):
    v = [100 * per_seed[seed]["accuracy"][task] for seed in (0, 1)]
    cells.append(f"{np.mean(v):.1f} ± {np.std(v, ddof=1):.1f}" + (" (100)" if task != "all" else ""))
  n = count_params(trained["typed_latent_s0"][0])
  assert f"| Typed-Latent | {n:,} | 3 × 4, lr 0.01 | " + " | ".join(cells) + " |" in report
  # the steps-to-100% table: one row per seed
  for seed in (0, 1):
    r = per_seed[seed]
    cells = [f"{r['steps_to_100'][g]:,}" if r["steps_to_100"][g] is not None
             else f"not reached ({100 * max(a[g] for _, a in r['held_out_curve']):.1f})"
             for g in tt.THREE_TOKEN_TASKS + ("all",)]
    assert f"| Typed-Latent | {seed} | " + " | ".join(cells) + " |" in report


def test_steps_to_100_is_the_first_perfect_evaluation():
  acc = lambda c, a, g, lk: {"copy": c, "affine": a, "gate": g, "lookup": lk, "all": (c + a + g + lk) / 4}
  evals = [(100, acc(0.5, 0.1, 0.1, 0.1)), (200, acc(1.0, 0.9, 0.2, 0.1)), (300, acc(0.98, 1.0, 1.0, 0.5)),
           (400, acc(1.0, 1.0, 1.0, 1.0))]
  assert three_token.steps_to_100(evals) == {"copy": 200, "affine": 300, "gate": 300, "lookup": 400, "all": 400}
  early = three_token.steps_to_100(evals[:3])
  assert early["lookup"] is None and early["all"] is None and early["copy"] == 200


def test_lm_matched_transformer_has_cores_parameter_count():
  # the LM experiment's "Transformer (equal params)" row: the factory's model has the count
  # matched_transformer gives for Core's at the same vocabulary and length (built abstractly, nothing runs)
  size = lambda name: count_params(nnx.eval_shape(lambda: common.model_factory(name, vocab_size=lm.VOCAB,
                                                                               max_len=16)(nnx.Rngs(0))))
  assert size("transformer_matched") == matched_transformer(size("core"), vocab_size=259, max_len=16)[1]


def test_lm_experiment_tiny(tmp_path, monkeypatch, synthetic_data_dir):
  # one model, both recipes (the paper's and the curve), two seeds; each seed's final bits per byte recomputed
  # in numpy from its trained model, and the table's mean ± sd from those
  out = tmp_path / "l"
  args = ["--config.unimatrix_lm.models=('core',)", "--config.unimatrix_lm.seq_len=16",
          "--config.unimatrix_lm.batch_size=2", "--config.unimatrix_lm.paper_steps=1",
          "--config.unimatrix_lm.curve_steps=2", "--config.unimatrix_lm.eval_every=1",
          "--config.unimatrix_lm.eval_windows=2", "--config.unimatrix_lm.corpora=('tinyshakespeare',)",
          "--config.unimatrix_lm.seeds=(0, 1)"]
  trained = keep_trained(monkeypatch, lm, key=lambda workdir, cfg: (workdir.name.split("-")[0], cfg.seed))
  assert main(["reproduce", "--quick", "--only", "unimatrix_lm", "--out", str(out), "--no_progress",
               *args]) == 0
  report = (out / "REPORT.md").read_text()
  results = json.loads((out / "unimatrix_lm" / "results.json").read_text())["tinyshakespeare"]
  assert sorted(trained) == [("curve_core", 0), ("curve_core", 1), ("paper_core", 0), ("paper_core", 1)]
  from jaxmem.data import eval_windows, load_corpus
  val = load_corpus("tinyshakespeare")["validation"]
  w = eval_windows(val, 16)

  def bpb(model):
    logits = np.concatenate([np.asarray(forward(model, jnp.asarray(w["inputs"][i:i + 64])), np.float64)
                             for i in range(0, len(w["inputs"]), 64)])
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
        -1, keepdims=True)
    nll = -np.take_along_axis(logp, w["targets"][..., None], -1)[..., 0]
    return float((nll * w["mask"]).sum() / w["mask"].sum() / math.log(2))

  core = results["core"]
  finals = [bpb(trained["curve_core", seed]) for seed in (0, 1)]
  np.testing.assert_allclose(core["final_bpb_seeds"], finals, atol=1e-4)
  assert abs(finals[0] - finals[1]) > 1e-3  # the seeds trained different models
  assert abs(core["final_bpb"] - np.mean(finals)) < 1e-4
  assert [s for s, _ in core["curve"]] == [1, 2]
  assert core["params"] == count_params(trained["curve_core", 0]) == count_params(trained["paper_core", 1])
  # the table row, recomputed from the saved per-seed results: mean ± sample sd at steps 1 and 2, then the final
  # number (the paper's WikiText-2 number in the paper column, whichever corpus)
  ms = lambda v: f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f}"
  c = dict(core["curve"])
  assert (f"| UniMatrix-Core | {core['params']:,} | {ms(core['paper_recipe_bpb_seeds'])} | 5.084 | "
          f"{c[1]:.3f} ± " in report)
  assert f"| **{ms(finals)}** |" in report



def test_lm_configs_hold_the_latent_and_hybrid_models():
  # the generic triple-latent model and the Recurrent-FFN-Hybrid in both sizes, each with a paper entry, each
  # built for the LM's vocabulary (abstractly, nothing runs)
  exp = load_all()["unimatrix_lm"]
  for quick in (True, False):
    models = exp.load_config(quick).models
    assert {"triple_latent", "hybrid", "transformer", "core"} <= set(models)
  for name in ("triple_latent", "hybrid"):
    assert name in lm.PAPER_BPB
    model = nnx.eval_shape(lambda n=name: common.model_factory(n, vocab_size=lm.VOCAB, max_len=16)(nnx.Rngs(0)))
    assert model.cfg.vocab_size == lm.VOCAB and model.cfg.max_len == 16
