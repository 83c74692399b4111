"""``jaxmem bench ops`` without its cost: the bench's two forms of each op agree (the premise of its wrapper
table), each table is handed to ``emit`` as soon as it is computed, a peer's agreement decides whether it is
timed, a peer's failure (forward, backward, import) stays in its row or the closing note, and every installed
peer computes what its row says (skipped for the peers not installed: the main environment has none)."""

from __future__ import annotations

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.bench import BENCHES
from jaxmem.bench import ops as ops_bench
from jaxmem.bench.ops import PEERS, QUICK_OPS, Peer, kernel_forward, op_forward, random_inputs
from tests.bench.tables import markdown_tables


def test_ops_bench_is_registered():
  assert BENCHES["ops"] == "jaxmem.bench.ops:bench_ops"


@pytest.mark.parametrize("name", ["fused_recurrent_gated_delta_rule", "fused_recurrent_linear_attn"])
def test_the_op_and_its_kernel_form_compute_the_same(name):
  # the recurrent forms: cheap to compile, and the same scale, gates and state layouts as the chunked ones
  x = random_inputs(1, 8, 1, 4)
  args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"])
  (o, S), (o_k, S_k) = jax.jit(op_forward(name))(*args), jax.jit(kernel_forward(name))(*args)
  assert o.shape == (1, 8, 1, 4) and S.shape == (1, 1, 4, 4)
  np.testing.assert_allclose(o, o_k, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(S, S_k, rtol=1e-6, atol=1e-6)


def test_bad_sizes_and_names_are_refused():
  with pytest.raises(ValueError, match="T must be a positive integer"):
    random_inputs(1, 0, 1, 4)
  with pytest.raises(ValueError, match="unknown op"):
    op_forward("chunk_gla")
  with pytest.raises(ValueError, match="unknown op"):
    kernel_forward("chunk_gla")
  with pytest.raises(ValueError, match="repeats"):
    ops_bench._alternate([lambda: None], repeats=0)


def test_calls_are_timed_in_turns_and_slow_rounds_cut():
  order = []
  a, b = (lambda: order.append("a")), (lambda: order.append("b"))
  assert len(ops_bench._alternate([a, b], repeats=3)) == 2
  assert order == ["a", "b"] * 4  # one untimed run each, then three rounds in turns
  order.clear()
  ops_bench._alternate([a, b], repeats=3, budget_s=0.0, warmup=False)  # a round over budget: one round only
  assert order == ["a", "b"]


def _fake_forward(q, k, v, g, beta, h0):
  """A stand-in for an op and its kernel form: cheap to compile, differentiable in every argument."""
  return v * jnp.exp(g)[..., None] + q * beta[..., None], h0 * 2.0


@jax.custom_vjp
def _no_backward(v):
  return v


def _refuse(res, dv):
  raise ValueError("no backward")


_no_backward.defvjp(lambda v: (v, None), _refuse)


def _peer(function, forward, **kw):
  return Peer(dist="fakepeer", module="fakepeer", function=function, op="chunk_gated_delta_rule",
              make=lambda m: forward, K=4, install="`pip install fakepeer`", **kw)


def _failing(*args):
  raise RuntimeError("out of\nmemory | at T=16")


FAKE_PEERS = (
    _peer("agrees", _fake_forward, note="same as the op"),
    _peer("disagrees", lambda q, k, v, g, beta, h0: (v, h0)),
    _peer("fails", _failing),
    _peer("no backward", lambda *a: (_no_backward(_fake_forward(*a)[0]), _fake_forward(*a)[1])),
    _peer("too long", _fake_forward, max_T=8),
    _peer("full run only", _fake_forward, quick=False),
    Peer(dist="jaxmem-no-such-peer", module="jaxmem_no_such_peer", function="f", op="chunk_delta_rule",
         make=lambda m: _fake_forward, K=4, install="`pip install jaxmem-no-such-peer`"),
)


_GRADS = {}
_real_fwd_bwd = ops_bench.fwd_bwd


def _fwd_bwd_once(forward, gates):
  """The bench's fwd_bwd, compiled once per forward and gates for all the tests here."""
  if (forward, gates) not in _GRADS:
    _GRADS[forward, gates] = _real_fwd_bwd(forward, gates)
  return _GRADS[forward, gates]


def _timer(calls, repeats, **kw):
  """Runs each call once and says the first took 2 ms, the second 1 ms."""
  for call in calls:
    call()
  return [2e-3 / (i + 1) for i in range(len(calls))]


@pytest.fixture
def stubbed(monkeypatch):
  """bench_ops at T = 16, K = 4 with a constant timer, cheap forwards and fake peers: milliseconds, not
  minutes."""
  monkeypatch.setattr(ops_bench, "lengths", lambda quick: (16,))
  monkeypatch.setattr(ops_bench, "peer_lengths", lambda quick: (16,))
  monkeypatch.setattr(ops_bench, "varlen_batches", lambda quick: (("skewed", (2, 2, 12)), ("uniform", (8, 8))))
  monkeypatch.setattr(ops_bench, "_varlen_functions",
                      lambda cu, states: (_fake_forward, lambda *a: _fake_forward(*a[:6])))
  monkeypatch.setattr(ops_bench, "K", 4)
  monkeypatch.setattr(ops_bench, "op_forward", lambda name: _fake_forward)
  monkeypatch.setattr(ops_bench, "kernel_forward", lambda name: _fake_forward)
  monkeypatch.setattr(ops_bench, "_alternate", _timer)
  monkeypatch.setattr(ops_bench, "fwd_bwd", _fwd_bwd_once)
  monkeypatch.setattr(ops_bench, "PEERS", FAKE_PEERS)
  monkeypatch.setitem(sys.modules, "fakepeer", types.ModuleType("fakepeer"))


def test_bench_ops_emits_each_table_as_it_is_computed(stubbed):
  emitted = []
  section = ops_bench.bench_ops(quick=True, repeats=1, emit=emitted.append)
  assert len(emitted) == 4 and "".join(emitted) == section
  assert emitted[0].startswith("### ops: fla-named ops (`jaxmem.ops`), B=1, H=4, K=V=4, float32")
  wrapper, = markdown_tables(emitted[0])
  assert wrapper[0] == ops_bench.WRAPPER_HEAD
  assert [row[0] for row in wrapper[2:]] == [f"`{name}`" for name in QUICK_OPS]
  for row in wrapper[2:]:  # op timed first in each pair: 2 ms against the kernel's 1 ms
    assert row[1:] == ["16", "2.00", "1.00", "2.00", "2.00", "1.00", "2.00", "0.0e+00"]
  varlen, = markdown_tables(emitted[1])
  assert varlen[0] == ops_bench.VARLEN_HEAD
  assert varlen[2] == ["skewed: 2 × 2 + 1 × 12", "3", "16", "2.00", "1.00", "0.50", "2.00", "1.00", "0.50"]
  assert varlen[3][:3] == ["uniform: 2 × 8", "2", "16"]
  assert emitted[3].startswith("Wrapper cost over 5 rows: op / kernel forward 2.00–2.00 (geometric mean 2.00)")


def test_peer_rows_keep_their_failures_and_time_only_what_agrees(stubbed):
  section = ops_bench.bench_ops(quick=True, repeats=1)
  _, _, peers = markdown_tables(section)
  assert peers[0] == ops_bench.PEER_HEAD
  rows = {row[1]: row for row in peers[2:]}
  assert list(rows) == ["agrees", "disagrees", "fails", "no backward", "too long"]  # quick: one row left out
  assert all(len(row) == len(ops_bench.PEER_HEAD) for row in rows.values())
  assert rows["agrees"][5:12] == ["0.0e+00 (0e+00)", "2.00", "1.00", "2.00×", "2.00", "1.00", "2.00×"]
  assert rows["agrees"][12] == "same as the op"
  assert rows["disagrees"][6:] == ["—"] * 6 + ["outputs disagree: not timed"]
  assert rows["fails"][5:] == ["—"] * 7 + ["peer failed: RuntimeError: out of"]
  assert rows["no backward"][6:9] == ["2.00", "1.00", "2.00×"] and rows["no backward"][9:12] == ["—"] * 3
  assert rows["no backward"][12].startswith("fwd+bwd failed: ValueError: no backward")
  assert rows["too long"][5:] == ["—"] * 7 + ["not run at T > 8 (too slow for this bench)"]
  assert "1 more rows run without `--quick`." in section
  assert "- fakepeer agrees vs `chunk_gated_delta_rule`: T=16 2.00×; 2.00×" in section
  assert "- fakepeer no backward vs `chunk_gated_delta_rule`: T=16 2.00×; —" in section
  assert "- jaxmem-no-such-peer: not installed (`pip install jaxmem-no-such-peer`)" in section
  assert "- tokamax: " in section  # the candidates that cannot run here, with the reason


@pytest.mark.parametrize("peer", PEERS, ids=lambda p: f"{p.dist}:{p.function}")
def test_an_installed_peer_computes_its_op(peer):
  module, why = ops_bench._import_peer(peer)
  if module is None:
    pytest.skip(f"{peer.dist}: {why}")
  T = 256  # a multiple of every peer's chunk
  x = random_inputs(1, T, 1, peer.K)
  args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"])
  ours = op_forward(peer.op)(*args)
  with jax.numpy_rank_promotion("allow"):  # as the bench runs them: some peers rely on NumPy's rank promotion
    theirs, _, _ = ops_bench._peer_calls(peer, peer.make(module), x)
  assert ops_bench._max_diff(theirs, ours) <= ops_bench.AGREE_REL * ops_bench._max_abs(ours)
