"""The DNC-tasks experiment runs end to end at tiny size; its settings build the tasks they name."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxmem.cli import main
from jaxmem.experiments import REGISTRY
from jaxmem.experiments.sdnc import dnc_tasks as exp
from jaxmem.tasks import algorithmic

# tiny settings, given on the command line as --config.dnc_tasks.<field>=<value>: copy only, 4 steps
TINY = dict(tasks=("copy",), n_steps=4, batch_size=4, lr=1e-3, log_every=1, eval_batches=(1, 1))
TINY_ARGS = [f"--config.dnc_tasks.{k}={v!r}" for k, v in TINY.items()]


def quick_settings() -> exp.DNCTasksSettings:
  return REGISTRY["dnc_tasks"].load_config(quick=True)


def test_quick_settings_build_the_tasks():
  specs = exp.task_specs(quick_settings())
  assert list(specs) == ["copy", "repeat_copy", "associative_recall"]
  assert specs["copy"].train_kwargs == dict(num_bits=6, min_length=1, max_length=6)
  assert specs["repeat_copy"].train_kwargs == dict(num_bits=6, min_length=1, max_length=3, min_repeats=1,
                                                   max_repeats=2, norm_max=10)
  assert specs["associative_recall"].train_kwargs == dict(num_bits=6, item_length=2, min_items=2, max_items=4)
  assert [s.io for s in specs.values()] == [(7, 6), (8, 7), (8, 6)]
  # a stream of a spec at a size holds exactly that size; its batch at a position is the generator's
  copy = specs["copy"]
  b = copy.stream(3, 2, size=12).batch_at(1)
  assert b["observations"].shape == (2, 2 * 12 + 1, 7) and b["targets"].shape[-1] == 6  # in, delimiter, out
  want = algorithmic.copy_task(jax.random.fold_in(jax.random.key(3), 1), **copy.kwargs_at(12, 2))
  np.testing.assert_array_equal(b["observations"], np.asarray(want.observations))


def test_settings_reject_unknown_tasks():
  with pytest.raises(ValueError, match="subset of"):
    dataclasses.replace(quick_settings(), tasks=("copy", "sort"))


@pytest.mark.slow
def test_reproduce_dnc_tasks_tiny(tmp_path):
  s = REGISTRY["dnc_tasks"].load_config(True, [a[len("--config.dnc_tasks."):] for a in TINY_ARGS])
  assert s == dataclasses.replace(quick_settings(), **TINY)
  out = tmp_path / "report"
  assert main(["reproduce", "--quick", "--only", "dnc_tasks", "--out", str(out), "--no_progress",
               *TINY_ARGS]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| dnc_tasks | ok |" in report and "| copy | dnc |" in report
  assert "| copy | +all_three |" in report and "| copy | sDNC (same weights) |" in report
  assert (out / "dnc_tasks" / "learning_curves.png").exists()
  assert "re-run as SDNCTransformer" in report
