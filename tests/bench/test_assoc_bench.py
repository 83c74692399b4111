"""``jaxmem bench assoc`` without its cost: fla-core's naive chunkwise form at a length that is not a multiple
of its chunk (padded; only with ``.[bench]``), a peer's failure kept to its row, and each table handed to
``emit`` as soon as it is computed (timers and kernels replaced by stubs)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxmem.bench import BENCHES, run_benches
from jaxmem.bench import assoc as assoc_bench
from jaxmem.bench.assoc import FLA_CHUNK, fla_naive_chunkwise, load_fla_naive, random_inputs


def _torch_layout(q, k, v, beta):
  import torch
  t = lambda x: torch.from_numpy(np.asarray(x).transpose(0, 2, 1, 3).copy())
  return t(q), t(k), t(v), torch.from_numpy(np.asarray(beta).transpose(0, 2, 1).copy())


def test_fla_naive_chunkwise_pads_a_length_off_the_chunk():
  naive = load_fla_naive()
  if naive is None:
    pytest.skip("fla-core / torch not installed (pip install -e '.[bench]')")
  import torch
  T = 100  # not a multiple of fla's chunk: its chunkwise form alone refuses it
  assert T % FLA_CHUNK
  q, k, v, beta = _torch_layout(*random_inputs(1, T, 2, 16))
  with torch.no_grad():
    o, S = fla_naive_chunkwise(naive, q, k, v, beta)
    o_ref, S_ref = naive.delta_rule_recurrence(q, k, v, beta)  # the unpadded step-by-step form
  assert o.shape == o_ref.shape == (1, 2, T, 16)
  np.testing.assert_allclose(o.numpy(), o_ref.numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(S.numpy(), S_ref.numpy(), rtol=1e-4, atol=1e-5)  # the padded steps wrote nothing
  leaves = [x.clone().requires_grad_(True) for x in (q, k, v, beta)]
  fla_naive_chunkwise(naive, *leaves)[0].sum().backward()
  assert all(x.grad.shape == x.shape and torch.isfinite(x.grad).all() for x in leaves)


def test_fla_naive_chunkwise_refuses_a_chunk_below_one():
  with pytest.raises(ValueError, match="chunk_size"):
    fla_naive_chunkwise(None, None, None, None, None, chunk_size=0)


@pytest.fixture
def stubbed(monkeypatch):
  """bench_assoc with a constant timer and an identity kernel: its tables in milliseconds, not minutes."""
  import jaxmem.kernels.assoc
  monkeypatch.setattr(assoc_bench, "time_call", lambda fn, *args, repeats=5: 1e-3)
  monkeypatch.setattr(assoc_bench, "_matmul_gflops", lambda repeats: 100.0)
  monkeypatch.setattr(assoc_bench, "_block_matmul_gflops", lambda repeats, blocks=1024: 50.0)
  monkeypatch.setattr(assoc_bench, "random_inputs", lambda B, T, H, D: random_inputs(B, T, 1, 4))
  monkeypatch.setattr(jaxmem.kernels.assoc, "associative_memory", lambda q, k, v, b, **kw: v)


def test_bench_assoc_emits_each_table_when_it_is_computed(stubbed, monkeypatch):
  emitted = []

  def versus(lengths, *args):
    # the two tables before the fla comparison are out before it starts
    assert [p.splitlines()[0] for p in emitted] == [
        "### assoc: delta rule, B=1, H=8, D_k=D_v=64, chunk 64, float32, cpu", "Chunk size at T=1000:"]
    assert lengths == (256, 1000)
    return "vs fla: stub\n"

  monkeypatch.setattr(assoc_bench, "_versus_fla", versus)
  section = assoc_bench.bench_assoc(quick=True, repeats=1, emit=emitted.append)
  assert len(emitted) == 3 and emitted[-1] == "vs fla: stub\n"
  assert "".join(emitted) == section
  assert "| 1000 |" in emitted[0] and "| 128 |" in emitted[1]


def _plain_bench(quick: bool = False, repeats: int = 5) -> str:
  return "### plain\n"


def test_run_benches_streams_sections_in_order_and_returns_them_joined(stubbed, monkeypatch):
  monkeypatch.setattr(assoc_bench, "_versus_fla", lambda *args: "vs fla: stub\n")
  monkeypatch.setitem(BENCHES, "plain", f"{__name__}:_plain_bench")
  emitted = []
  out = run_benches(["plain", "assoc", "plain"], quick=True, repeats=1, emit=emitted.append)
  assert "".join(emitted) == out
  assert emitted[:2] == ["### plain\n", "\n"] and emitted[-2:] == ["\n", "### plain\n"]
  assert emitted[2].startswith("### assoc:") and emitted[4] == "vs fla: stub\n"
  assert out == run_benches(["plain", "assoc", "plain"], quick=True, repeats=1)  # no emit: same text


def test_a_failing_peer_row_is_noted_and_the_other_rows_kept(stubbed, monkeypatch):
  pytest.importorskip("torch")
  import torch
  monkeypatch.setattr("jaxmem.bench.timing.time_host", lambda fn, repeats=5: (fn(), 2e-3)[1])

  class Naive:
    """A peer that works at T=256 and fails at T=1000, with a message that would break a table."""
    @staticmethod
    def delta_rule_chunkwise(q, k, v, beta, chunk_size):
      if q.shape[2] == 1024:
        raise RuntimeError("out of\nmemory | at T=1000")
      return torch.zeros_like(v) + v.sum() * 0, None

  monkeypatch.setattr(assoc_bench, "load_fla_naive", lambda: Naive)
  chk = lambda q, k, v, b: v
  text = assoc_bench._versus_fla((256, 1000), 1, 8, 64, chk, chk, 1)
  rows = [line for line in text.splitlines() if line.startswith("| 256 ") or line.startswith("| 1000 ")]
  assert len(rows) == 2
  assert rows[0].count("|") == rows[1].count("|") == 10
  assert "2.0" in rows[0] and "fla failed" not in rows[0]
  assert rows[1].endswith("| fla failed: RuntimeError: out of memory / at T=1000 |")
