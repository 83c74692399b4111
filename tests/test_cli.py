"""The jaxmem command: train / eval / reproduce / bench, and its error messages."""

import json

import pytest

from jaxmem.cli import main
from tests.conftest import TINY_OVERRIDES


def test_train_then_eval(synthetic_data_dir, tmp_path, capsys):
  wd = str(tmp_path / "run")
  rc = main(["train", "--config", "configs/lm_baseline.py:quick", "--workdir", wd,
             "--no_progress", *TINY_OVERRIDES])
  assert rc == 0
  out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert out["step"] == 8 and out["val_bpb"] > 0
  assert main(["eval", "--workdir", wd, "--split", "test"]) == 0
  ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert ev["step"] == 8 and ev["split"] == "test" and 0 < ev["bpb"] < 8.5


def test_unknown_config_field_is_a_clear_error(synthetic_data_dir, tmp_path, capsys):
  rc = main(["train", "--config", "lm_baseline:quick", "--workdir", str(tmp_path),
             "--config.model.widthh=3"])
  assert rc == 2
  assert "unknown config field 'model.widthh'" in capsys.readouterr().err


def test_missing_corpus_is_a_clear_error(isolated_data_env, tmp_path, capsys):
  rc = main(["train", "--config", "lm_baseline:quick", "--workdir", str(tmp_path / "w"),
             *TINY_OVERRIDES])
  assert rc == 2
  err = capsys.readouterr().err
  assert "Tiny Shakespeare not found" in err and "JAXMEM_DATA_DIR" in err


def test_unwritable_workdir_is_a_clear_error(synthetic_data_dir, tmp_path, capsys):
  (tmp_path / "file").write_text("x")
  rc = main(["train", "--config", "lm_baseline:quick", "--workdir", str(tmp_path / "file" / "w"),
             *TINY_OVERRIDES])
  assert rc == 2 and "is not writable" in capsys.readouterr().err


def test_eval_of_a_non_run_is_a_clear_error(tmp_path, capsys):
  assert main(["eval", "--workdir", str(tmp_path)]) == 2
  assert "no config.json" in capsys.readouterr().err


def test_stray_arguments_are_rejected(capsys):
  with pytest.raises(SystemExit):
    main(["reproduce", "--config.train.lr=1"])


def test_reproduce_without_corpus_reports_skipped_with_fix(isolated_data_env, tmp_path, capsys):
  out = tmp_path / "report"
  assert main(["reproduce", "--quick", "--only", "lm_baseline", "--out", str(out), "--no_progress"]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| lm_baseline | skipped |" in report
  assert "**Fix:** export JAXMEM_DATA_DIR" in report
  assert json.loads((out / "results.json").read_text())["lm_baseline"]["status"] == "skipped"


def test_reproduce_list_and_unknown_name(capsys):
  assert main(["reproduce", "--list"]) == 0
  assert "lm_baseline" in capsys.readouterr().out
  assert main(["reproduce", "--only", "nope", "--out", "/tmp/jaxmem_never"]) == 2
  assert "unknown experiment(s) ['nope']" in capsys.readouterr().err


def test_bench_prints_ratios(capsys, monkeypatch):
  import jaxmem.bench.attention as bench
  monkeypatch.setattr(bench, "_torch_sdpa_timer", lambda *a: None)
  assert main(["bench", "attention", "--quick", "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  assert "jax.nn fwd / ours" in out and "×" in out
  assert main(["bench", "nope"]) == 2


def test_reproduce_writes_tables_and_figures(synthetic_data_dir, tmp_path, monkeypatch):
  from jaxmem import config as config_lib
  from jaxmem.experiments import lm_baseline
  real_load = config_lib.load_config
  monkeypatch.setattr(lm_baseline.config_lib, "load_config",
                      lambda spec: config_lib.apply_overrides(real_load(spec), TINY_OVERRIDES))
  out = tmp_path / "report"
  assert main(["reproduce", "--quick", "--only", "lm_baseline", "--out", str(out),
               "--no_progress"]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| lm_baseline | ok |" in report and "### Bits per byte on Tiny Shakespeare" in report
  assert "| bigram (add-0.1) |" in report
  assert (out / "lm_baseline" / "learning_curve.png").stat().st_size > 1000
  assert "![learning_curve](lm_baseline/learning_curve.png)" in report


@pytest.mark.slow
def test_bench_dnc_quick_prints_ratio_and_memory(capsys, monkeypatch):
  import jaxmem.bench.dnc as bench_dnc
  monkeypatch.setattr(bench_dnc, "_torch_step_timer", lambda *a: None)
  assert main(["bench", "dnc", "--quick", "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  assert "jaxmem DNC (jit, remat)" in out and "XLA temp buffers, jax.checkpoint on the step" in out


@pytest.mark.slow
def test_reproduce_dnc_tasks_tiny(tmp_path, monkeypatch):
  from jaxmem.experiments import dnc_tasks
  monkeypatch.setattr(dnc_tasks, "run_settings", lambda quick: {
      "n_steps": 4, "batch_size": 4, "lr": 1e-3, "log_every": 1, "eval_batches": (1, 1)})
  real_specs = dnc_tasks.task_specs
  monkeypatch.setattr(dnc_tasks, "task_specs", lambda quick: {
      k: v for k, v in real_specs(quick).items() if k == "copy"})
  out = tmp_path / "report"
  assert main(["reproduce", "--quick", "--only", "dnc_tasks", "--out", str(out), "--no_progress"]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| dnc_tasks | ok |" in report and "| copy | dnc |" in report
  assert "| copy | +all_three |" in report and "| copy | sDNC (same weights) |" in report
  assert (out / "dnc_tasks" / "learning_curves.png").exists()
  assert "re-run as SDNCTransformer" in report
