"""``jaxmem bench unimatrix`` at a tiny size: the equal-parameter match, the paper's Transformer row, the
tables' structure, and each ratio (against the equal-parameter and against the paper's Transformer) recomputed
from the tokens/s it divides."""

from __future__ import annotations

import math

import pytest
from flax import nnx

from jaxmem.bench import BENCHES
from jaxmem.bench.unimatrix import TABLE_HEAD, TARGETS, bench_unimatrix, matched_transformer
from jaxmem.models import TransformerLM, count_params
from jaxmem.models.unimatrix.baselines import paper_transformer_config
from tests.bench.tables import markdown_tables

pytestmark = pytest.mark.slow   # end-to-end benchmark run: `make test`, not `make test-fast`


def test_matched_transformer_is_closest_at_every_depth():
  target = 79_300  # UniMatrix-Core at the paper's sizes (max_len 128)
  cfg, n = matched_transformer(target, 128)
  assert (cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.max_len) == (259, 64, 4, 128)
  # one more or one less FFN unit per layer moves the count by n_layers · (2 · 64 + 1)
  assert abs(n - target) <= cfg.n_layers * 129 / 2
  for n_layers in (1, 2):
    _, n_l = matched_transformer(target, 128, layers=(n_layers,))
    assert abs(n - target) <= abs(n_l - target)
  # the closed-form count is the model's
  assert n == count_params(nnx.eval_shape(lambda: TransformerLM(cfg, rngs=nnx.Rngs(0))))


def test_bench_unimatrix_tiny_tables_have_positive_finite_ratios():
  assert BENCHES["unimatrix"] == "jaxmem.bench.unimatrix:bench_unimatrix"
  section = bench_unimatrix(quick=True, repeats=1, lengths=(16,), batch_tokens=32, models=("core_recurrent",))
  train, fwd = markdown_tables(section)
  for table in (train, fwd):
    assert table[0] == TABLE_HEAD and set(table[1][0]) == {"-"}
    rows = table[2:]
    assert [r[1].split(" ")[0] for r in rows] == ["Transformer", "Transformer,", "Core"]
    assert rows[1][1] == "Transformer, paper's (L=3, d_ff=256)"
    assert all(r[0] == "16" for r in rows)
    assert rows[0][4] == "1.00×" and rows[1][5] == "1.00×"
    base, paper = (float(rows[i][3].replace(",", "")) for i in (0, 1))
    for r in rows:
      assert int(r[2].replace(",", "")) > 0
      tps = float(r[3].replace(",", ""))
      assert tps > 0
      # each ratio is this row's tokens/s over its baseline's: the matched Transformer's (column 4; the paper's
      # Transformer is timed against it too) and the paper's (column 5); tokens/s printed to ±0.5, ratios ±0.005
      for col, den in ((4, base), (5, paper)):
        ratio = float(r[col].rstrip("×"))
        assert math.isfinite(ratio) and ratio > 0
        assert (tps - 0.5) / (den + 0.5) - 0.005 <= ratio <= (tps + 0.5) / (den - 0.5) + 0.005, (r, col, den)
  # equal parameters: the matched Transformer is within one FFN unit per layer of Core
  params = [int(r[2].replace(",", "")) for r in train[2:]]
  assert abs(params[0] - params[2]) <= 4 * 129
  # the paper's row is the paper's model: 3 layers, d_ff 256, at this vocabulary and T
  paper_cfg = paper_transformer_config(259, 16)
  assert params[1] == count_params(nnx.eval_shape(lambda: TransformerLM(paper_cfg, rngs=nnx.Rngs(0))))
  for T in TARGETS:
    assert f"T={T}: not run" in section
