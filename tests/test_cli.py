"""The jaxmem command: train / eval / reproduce / bench / compile, and its error messages.

The benches run at their smallest sizes (module-level quick sizes patched): their tables' numbers are
positive and finite, and a ratio or rate is recomputed from the printed numbers it is made of."""

import json
import math

import pytest

import jaxmem
from jaxmem.cli import main
from jaxmem.models import bodies
from jaxmem.train import load_trained_lm
from tests.conftest import TINY_OVERRIDES

# each body at a tiny size (its own fields); a body registered later runs at its defaults
TINY_BODY = {
    "transformer": [],
    "unimatrix": ["--config.model.d_model=16", "--config.model.n_heads=2", "--config.model.state_dim=4",
                  "--config.model.depth=1", "--config.model.max_len=16", "--config.model.vocab_size=256"],
    "dnc": ["--config.model.d_embed=8", "--config.model.memory_size=8", "--config.model.word_size=4",
            "--config.model.num_reads=1", "--config.model.hidden_size=16"],
}


@pytest.mark.slow
@pytest.mark.parametrize("body", sorted(bodies.names()))
def test_train_eval_any_body(body, synthetic_data_dir, tmp_path, capsys):
  """``jaxmem train`` trains every registered body; ``jaxmem eval`` reloads it (``load_trained_lm``) and scores
  the validation split exactly as the run's final evaluation did, so the reloaded model is the trained one."""
  wd = str(tmp_path / body)
  overrides = [o for o in TINY_OVERRIDES if not o.startswith("--config.model.")] if body != "transformer" \
      else TINY_OVERRIDES
  args = ["train", "--config", "configs/lm_baseline.py:quick", "--workdir", wd, "--no_progress",
          f"--config.model.body={body}", *TINY_BODY.get(body, []), *overrides]
  assert main(args) == 0
  trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert trained["step"] == 8 and math.isfinite(trained["val_bpb"])
  assert json.loads((tmp_path / body / "config.json").read_text())["model"]["body"] == body
  assert main(["eval", "--workdir", wd]) == 0
  ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert ev["step"] == 8 and ev["bpb"] == pytest.approx(trained["val_bpb"], rel=1e-6)
  model, cfg, _ = load_trained_lm(wd)
  assert type(model) is bodies.lookup(body)[1] and cfg.model.body == body
  # and samples from it (greedy: the printed bytes are the argmax continuation), or says why it cannot
  rc = main(["sample", "--workdir", wd, "--prompt", "To be", "-n", "7", "--temperature", "0"])
  out, err = capsys.readouterr()
  if hasattr(model, "init_state") and getattr(model, "decodes", lambda: True)():
    want = jaxmem.generate(model, [list(b"To be")], 7, temperature=0.0)[0, 5:]
    assert rc == 0 and out == "To be" + bytes(int(t) for t in want).decode("utf-8", "replace") + "\n"
    if getattr(model.cfg, "positions", None) == "learned":   # -n past the learned positions: capped, said so
      assert main(["sample", "--workdir", wd, "--prompt", "To be", "-n", "100", "--temperature", "0"]) == 0
      out, err = capsys.readouterr()
      limit = model.cfg.max_len
      assert f"learned positions end at {limit}: {limit - 5} new bytes" in err
      want = jaxmem.generate(model, [list(b"To be")], limit - 5, temperature=0.0)[0, 5:]
      assert out == "To be" + bytes(int(t) for t in want).decode("utf-8", "replace") + "\n"
  else:
    assert rc == 2 and ("cannot decode" in err or "no token-by-token decoding" in err), err


def test_an_experiments_config_passed_to_train_names_reproduce(tmp_path, capsys):
  assert main(["train", "--config", "configs/unimatrix_lm.py", "--workdir", str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert "settings of the experiment unimatrix_lm" in err and "jaxmem reproduce --only unimatrix_lm" in err


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


def test_stray_arguments_are_rejected(tmp_path, capsys):
  with pytest.raises(SystemExit):
    main(["eval", "--workdir", str(tmp_path), "--config.train.lr=1"])   # eval takes no config overrides
  with pytest.raises(SystemExit):
    main(["reproduce", "--bogus"])
  # reproduce takes --config.<experiment>.<field>=v; one without an experiment being run is an error
  assert main(["reproduce", "--only", "lm_baseline", "--out", str(tmp_path / "r"), "--config.train.lr=1"]) == 2
  assert "--config.<experiment>.<field>=value" in capsys.readouterr().err
  assert not (tmp_path / "r").exists()


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


def table_rows(text: str, first_cell: str) -> list:
  """The cells of the Markdown table rows of ``text`` whose first cell is ``first_cell``."""
  rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
          if line.startswith("|")]
  return [r for r in rows if r[0] == first_cell]


def positive_finite(cell: str) -> float:
  x = float(cell.rstrip("×").replace(",", ""))
  assert math.isfinite(x) and x > 0, cell
  return x


def test_bench_prints_ratios(capsys, monkeypatch):
  import jaxmem.bench.attention as bench
  monkeypatch.setattr(bench, "_torch_sdpa_timer", lambda *a: None)
  monkeypatch.setattr(bench, "QUICK_LENGTHS", (16,))   # the smallest run: one short length
  assert main(["bench", "attention", "--quick", "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  assert "jax.nn fwd / ours" in out and "×" in out
  (row,) = table_rows(out, "16")
  assert all(positive_finite(c) for c in row[1:5]) and row[5].startswith("n/a")
  assert main(["bench", "nope"]) == 2


def test_reproduce_writes_tables_and_figures(synthetic_data_dir, tmp_path):
  # the tiny LM of `jaxmem train` above, as overrides of the lm_baseline experiment's config
  overrides = ["--config.lm_baseline." + o[len("--config."):] for o in TINY_OVERRIDES]
  out = tmp_path / "report"
  assert main(["reproduce", "--quick", "--only", "lm_baseline", "--out", str(out),
               "--no_progress", *overrides]) == 0
  report = (out / "REPORT.md").read_text()
  assert "| lm_baseline | ok |" in report and "### Bits per byte on Tiny Shakespeare" in report
  assert "Transformer (1L d16, 8 steps)" in report   # the overrides reached the run
  assert "`configs/lm_baseline.py:quick` with `model.d_model=16`" in report
  assert "| bigram (add-0.1) |" in report
  assert (out / "lm_baseline" / "learning_curve.png").stat().st_size > 1000
  assert "![learning_curve](lm_baseline/learning_curve.png)" in report


@pytest.mark.slow
def test_bench_dnc_quick_prints_ratio_and_memory(capsys, monkeypatch):
  import jaxmem.bench.dnc as bench_dnc
  monkeypatch.setattr(bench_dnc, "_torch_step_timer", lambda *a: None)
  monkeypatch.setattr(bench_dnc, "QUICK_SIZES", dict(N=4, W=4, B=2, T=8))   # a small run
  assert main(["bench", "dnc", "--quick", "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  assert "jaxmem DNC (jit, remat)" in out and "XLA temp buffers, jax.checkpoint on the step" in out
  (ours,) = table_rows(out, "jaxmem DNC (jit, remat)")
  ms, per_s = positive_finite(ours[1]), positive_finite(ours[2])
  # sequences / s is B = 2 over the step's time (both printed to ±0.05)
  assert ours[3] == "1.00×" and 2e3 / (ms + 0.05) - 0.05 <= per_s <= 2e3 / max(ms - 0.05, 1e-9) + 0.05
  assert table_rows(out, "PyTorch `dnc`")[0][3] == "install: pip install -e '.[bench]'"
  # the link matrix's bytes are B·N²·4 (one step) and T times that; XLA reports both programs' temp buffers
  assert table_rows(out, "link matrix, one step (B·N²·4)")[0][1] == f"{2 * 4 * 4 * 4:,}"
  assert table_rows(out, "link matrix, all T steps if stored")[0][1] == f"{2 * 4 * 4 * 4 * 8:,}"
  for label in ("XLA temp buffers, jax.checkpoint on the step", "XLA temp buffers, no checkpoint"):
    positive_finite(table_rows(out, label)[0][1])


@pytest.mark.slow
def test_compile_prints_sizes_checks_and_exports(tmp_path, capsys):
  from jaxmem import rasp
  out = tmp_path / "w.npz"
  assert main(["compile", "lib:reverse", "--max-seq-len", "8", "--vocab", "abc", "--check", "40",
               "--out", str(out)]) == 0
  text = capsys.readouterr().out
  assert "residual width" in text and "params" in text and "compile" in text
  assert "check: 40/40 random inputs agree" in text
  assert rasp.load(out).apply(list("abc")) == list("cba")
  assert main(["compile", "lib:frac_prevs", "--max_seq_len", "6", "--check", "10"]) == 0
  assert "10/10" in capsys.readouterr().out


def test_compile_user_program_and_errors(tmp_path, capsys, monkeypatch):
  (tmp_path / "my_prog.py").write_text(
      "from jaxmem import rasp\n"
      "def program(n):\n"
      "  return rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.EQ))\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert main(["compile", "my_prog:program", "--max-seq-len", "5", "--vocab", "1,2,x", "--check", "20"]) == 0
  assert "20/20" in capsys.readouterr().out
  assert main(["compile", "lib:nope", "--max-seq-len", "5"]) == 2
  assert "unknown library program" in capsys.readouterr().err
  assert main(["compile", "my_prog:program", "--max-seq-len", "5"]) == 2
  assert "--vocab is required" in capsys.readouterr().err
  assert main(["compile", "lib:reverse", "--max-seq-len", "0"]) == 2
  assert "max_seq_len" in capsys.readouterr().err


def test_bench_rasp_quick_prints_ratio(capsys, monkeypatch):
  import jaxmem.bench.rasp as bench_rasp
  # the smallest run: two programs (a select-aggregate one and a numerical one) at one short length
  monkeypatch.setattr(bench_rasp, "PROGRAMS", ("reverse", "frac_prevs"))
  monkeypatch.setattr(bench_rasp, "QUICK_NS", (6,))
  monkeypatch.setattr(bench_rasp, "QUICK_BATCH", 8)
  assert main(["bench", "rasp", "--quick", "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  assert "compiled / interpreter" in out and out.count("×") == 2
  assert "tracr compiles `reverse` at N = 80 in 372 s (published)" in out and "batch of 8" in out
  for name in ("reverse", "frac_prevs"):
    (row,) = table_rows(out, name)
    assert row[1] == "6" and all(positive_finite(c) for c in row[2:8])
    # the ratio is compiled seq/s over interpreter seq/s (each printed to ±0.5, the ratio to ±0.05; at this
    # tiny size the compiled model's call overhead can make it print as 0.0×)
    c, i, ratio = positive_finite(row[6]), positive_finite(row[7]), float(row[8].rstrip("×"))
    assert (c - 0.5) / (i + 0.5) - 0.05 <= ratio <= (c + 0.5) / max(i - 0.5, 1e-9) + 0.05, row


@pytest.mark.slow
def test_bench_decode_prints_times_state_sizes_and_ratios(capsys, monkeypatch):
  """The table's arithmetic, from a timer that runs each timed program once (so every program is compiled and
  run) and returns fixed times: prefill 10 ms, then n decode steps of 3 ms (softmax) or 1.5 ms (gated delta)."""
  import jaxmem.bench.decode as bench_decode
  n = 2
  monkeypatch.setattr(bench_decode, "QUICK", dict(contexts=(8, 24), batches=(2,), n=n, d_model=16, n_layers=1,
                                                  n_heads=2))
  calls = []

  def fixed_time(fn, repeats=5, warmup=1):
    fn()
    calls.append(fn)
    i = len(calls) - 1   # per context and batch: softmax (prefill, decode), then gated delta (same)
    step = 0.003 if (i // 2) % 2 == 0 else 0.0015
    return 0.010 if i % 2 == 0 else n * step

  def fixed_interleaved(fns, repeats=5, warmup=1):   # the mixed lengths: [24, 24] in 20 ms, [24, 8] in 25 ms
    assert list(fns) == [(24, 24), (24, 8)], list(fns)
    for fn in fns.values():
      fn()
      calls.append(fn)
    return {(24, 24): 0.020, (24, 8): 0.025}

  monkeypatch.setattr(bench_decode, "time_host", fixed_time)
  monkeypatch.setattr(bench_decode, "time_interleaved", fixed_interleaved)
  assert main(["bench", "decode", "--quick", "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  kv = {int(r[1]): r for r in table_rows(out, "softmax (KV cache)")}
  mem = {int(r[1]): r for r in table_rows(out, "gated delta (state)")}
  assert set(kv) == set(mem) == {8, 24} and len(calls) == 12
  # mixed prompt lengths at the largest context: each model's [24, 8] against its [24, 24]
  equal, mixed = table_rows(out, "[24, 24]"), table_rows(out, "[24, 8]")
  assert [r[1] for r in equal] == [r[1] for r in mixed] == ["softmax (KV cache)", "gated delta (state)"]
  assert all(float(r[2]) == 20.0 and r[3] == "1.00×" for r in equal), equal
  assert all(float(r[2]) == 25.0 and r[3] == "1.25×" for r in mixed), mixed
  for C in (8, 24):
    assert float(kv[C][3]) == 3.0 and float(mem[C][3]) == 1.5
    assert positive_finite(kv[C][4]) == pytest.approx(2 / 0.003, abs=0.5)           # batch / seconds per token
    assert positive_finite(kv[C][5]) == pytest.approx(2 * C / 0.010, abs=0.5)       # prefill tokens / s
    (ratio,) = [r for r in table_rows(out, str(C)) if len(r) == 3]
    assert ratio[2] == "2.00×"
  # state bytes: the KV cache grows with the context (2 · (C + n) · d_model floats and lengths), the memory not
  models = bench_decode._models(16, 1, 2)
  kv_bytes = lambda C: bench_decode._state_bytes(models["softmax (KV cache)"], C, n)
  mem_bytes = lambda C: bench_decode._state_bytes(models["gated delta (state)"], C, n)
  assert kv_bytes(24) - kv_bytes(8) == 2 * 16 * 16 * 4 and mem_bytes(24) == mem_bytes(8)
  assert "faster from context 8" in out


def test_sample_takes_any_int_seed(monkeypatch, capsys):
  """``jaxmem sample --seed`` takes any int (2**64 + 7 here; ``jax.random.key`` refuses 2**63 and more): it
  prints the prompt and the bytes ``generate`` samples with that seed."""
  from flax import nnx

  from jaxmem.models import DNCLM, DNCLMConfig
  cfg = DNCLMConfig(d_embed=8, memory_size=6, word_size=4, num_reads=1, hidden_size=10)
  model = DNCLM(cfg, rngs=nnx.Rngs(0))
  monkeypatch.setattr("jaxmem.train.load_trained_lm", lambda workdir, step=None: (model, None, 0))
  seed = 2 ** 64 + 7
  assert main(["sample", "--workdir", "unused", "--prompt", "ab", "-n", "4", "--seed", str(seed)]) == 0
  want = jaxmem.generate(model, [list(b"ab")], 4, seed=seed)[0, 2:]
  assert capsys.readouterr().out == "ab" + bytes(int(t) for t in want).decode("utf-8", "replace") + "\n"
