"""The DNC-tasks experiment runs end to end at tiny size; its settings build the tasks and models they name.

End to end (a code-path check, not a learning check): the DNC, the Transformer (and its sDNC re-run) and one
hybrid on copy; the report's table is recomputed from ``results.json``, the DNC's bit errors are recounted in
numpy from the trained model, and the sDNC re-run's difference from the Transformer is float round-off."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.cli import main
from jaxmem.experiments import REGISTRY
from jaxmem.experiments.sdnc import dnc_tasks as exp
from jaxmem.tasks import algorithmic
from tests.conftest import forward

pytestmark = pytest.mark.slow   # end-to-end experiment runs: `make test`, not `make test-fast`

# tiny settings, given on the command line as --config.dnc_tasks.<field>=<value>: copy of lengths 1-3, the
# three distinct model paths (the DNC, the Transformer = the sDNC row, a hybrid), 2 steps, one longer length
TINY = dict(tasks=("copy",), models=("dnc", "transformer", "+all_three"), longer=(2,), copy_length=3, n_steps=2,
            batch_size=4, lr=1e-3, log_every=1, eval_batches=(1, 1))
TINY_ARGS = [f"--config.dnc_tasks.{k}={v!r}" for k, v in TINY.items()]


def quick_settings() -> exp.DNCTasksSettings:
  return REGISTRY["dnc_tasks"].load_config(quick=True)


def test_quick_settings_build_the_tasks():
  s = quick_settings()
  specs = exp.task_specs(s)
  assert list(specs) == ["copy", "repeat_copy", "associative_recall"]
  assert specs["copy"].train_kwargs == dict(num_bits=6, min_length=1, max_length=6)
  assert specs["repeat_copy"].train_kwargs == dict(num_bits=6, min_length=1, max_length=3, min_repeats=1,
                                                   max_repeats=2, norm_max=10)
  assert specs["associative_recall"].train_kwargs == dict(num_bits=6, item_length=2, min_items=2, max_items=4)
  assert [s.io for s in specs.values()] == [(7, 6), (8, 7), (8, 6)]
  # the shipped configs train every model and score 2L, 3L, 4L
  assert s.models == exp.MODELS and list(exp.model_builders(s, 64)) == list(exp.MODELS)
  assert s.longer == (2, 3, 4) == REGISTRY["dnc_tasks"].load_config(quick=False).longer
  assert list(exp.model_builders(dataclasses.replace(s, models=("+erase", "dnc")), 64)) == ["+erase", "dnc"]
  # a stream of a spec at a size holds exactly that size; its batch at a position is the generator's
  copy = specs["copy"]
  b = copy.stream(3, 2, size=12).batch_at(1)
  assert b["observations"].shape == (2, 2 * 12 + 1, 7) and b["targets"].shape[-1] == 6  # in, delimiter, out
  want = algorithmic.copy_task(jax.random.fold_in(jax.random.key(3), 1), **copy.kwargs_at(12, 2))
  np.testing.assert_array_equal(b["observations"], np.asarray(want.observations))


def test_settings_reject_unknown_tasks_and_models():
  with pytest.raises(ValueError, match="tasks must be a non-empty subset of"):
    dataclasses.replace(quick_settings(), tasks=("copy", "sort"))
  with pytest.raises(ValueError, match="models must be a non-empty subset of"):
    dataclasses.replace(quick_settings(), models=("dnc", "lstm"))
  with pytest.raises(ValueError, match="models must be a non-empty subset of"):
    dataclasses.replace(quick_settings(), models=())
  for longer in ((), (1,), (2.5,)):
    with pytest.raises(ValueError, match="longer must be"):
      dataclasses.replace(quick_settings(), longer=longer)


def numpy_bit_error(model, spec, size, batch_size, seed) -> float:
  """Wrong bits at the masked steps over all masked bits, one batch, counted in numpy."""
  b = {k: np.asarray(v) for k, v in spec.stream(seed, batch_size, size).batch_at(0).items()}
  logits = np.asarray(forward(model, jnp.asarray(b["observations"])))
  wrong = ((logits > 0) != (b["targets"] > 0.5)) * b["mask"][..., None].astype(np.float64)
  return float(wrong.sum() / (b["mask"].astype(np.float64).sum() * b["targets"].shape[-1]))


def test_reproduce_dnc_tasks_tiny(tmp_path, monkeypatch):
  s = REGISTRY["dnc_tasks"].load_config(True, [a[len("--config.dnc_tasks."):] for a in TINY_ARGS])
  assert s == dataclasses.replace(quick_settings(), **TINY)
  trained, orig = {}, exp.train

  def keep(task, cfg, workdir, **kw):
    r = orig(task, cfg, workdir, **kw)
    trained[workdir.name] = r.model
    return r

  monkeypatch.setattr(exp, "train", keep)
  out = tmp_path / "report"
  assert main(["reproduce", "--quick", "--only", "dnc_tasks", "--out", str(out), "--no_progress",
               *TINY_ARGS]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| dnc_tasks | ok |" in report and "re-run as SDNCTransformer" in report
  assert (out / "dnc_tasks" / "learning_curves.png").exists()
  # the table, recomputed from the saved results: the three models and the sDNC row, only the 2L column
  assert "| task | model | ≤L (train range) | 2L | train s |" in report
  results = json.loads((out / "dnc_tasks" / "results.json").read_text())
  assert list(results) == ["copy/dnc", "copy/transformer", "copy/sDNC (same weights)", "copy/+all_three"]
  for key, r in results.items():
    assert "| " + " | ".join(key.split("/") + [f"{100 * r[k]:.2f}%" for k in ("train", "2L")]) + " |" in report
  assert list(trained) == ["dnc", "transformer", "all_three"]
  # the DNC's bit errors, recounted in numpy from its trained weights on the same held-out batches
  spec = exp.task_specs(s)["copy"]
  for k, size, seed in (("train", None, 10_000), ("2L", 2 * 3, 20_002)):
    assert results["copy/dnc"][k] == pytest.approx(numpy_bit_error(trained["dnc"], spec, size, exp.EVAL_BATCH,
                                                                    seed), abs=1e-9), k
  # the sDNC row is the Transformer's weights re-run as write-once memory reads: the same function, so the
  # logits differ by float32 re-association only (softmax sums over ≤ T = 7 slots, 2 layers of width 48:
  # a few ulp of logits of size ≲ 10, far below 1e-3; a wrong read moves them by O(0.1))
  sdnc, tr = results["copy/sDNC (same weights)"], results["copy/transformer"]
  assert 0 <= sdnc["max_abs_diff"] < 1e-3
  assert {k: sdnc[k] for k in ("train", "2L")} == {k: tr[k] for k in ("train", "2L")}
