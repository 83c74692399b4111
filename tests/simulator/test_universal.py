"""The universal simulator U (Theorem 6 / Corollary 6.1): U(T, X) == T(X) for every T and n <= N."""

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxmem.simulator import (
  AttentionParams,
  EncoderParams,
  attention_layer,
  attention_layer_numpy,
  build_simulator,
  encoder_layer,
  error_table,
  random_params,
  universal,
)
from jaxmem.simulator import machine as machine_mod

MAX_LEN, D = 4, 5   # every length 1..4, D odd and != D_h


def snapshot(sim):
  return {(layer, name): np.array(a) for layer, w in sim.weights.items() for name, a in w.items()}


def assert_same_weights(before, sim):
  after = snapshot(sim)
  assert before.keys() == after.keys()
  for key, a in before.items():
    assert a.dtype == after[key].dtype and np.array_equal(a, after[key]), key


def rel_err(got, ref):
  ref = np.asarray(ref, np.float64)
  return np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max()


@pytest.mark.parametrize("H,Dh", [(1, 3), (2, 4), (3, 4)])
@pytest.mark.slow
def test_simulates_every_attention_layer_at_every_length(H, Dh):
  sim = build_simulator(MAX_LEN, D, H, Dh)
  before = snapshot(sim)
  rng = np.random.default_rng(10 * H + Dh)
  for n in range(1, MAX_LEN + 1):
    for _ in range(2):  # a different T every call, same U
      params = random_params(rng, D, H, Dh)
      X = rng.standard_normal((n, D)).astype(np.float32)
      out = sim(params, X)
      assert out.shape == (n, D)
      ref = attention_layer(params, X)
      assert rel_err(out, ref) <= 1e-5, (n, rel_err(out, ref))
      assert rel_err(out, attention_layer_numpy(params, X)) <= 1e-5
  assert_same_weights(before, sim)


@pytest.mark.slow
def test_simulates_every_encoder_layer_at_every_length():
  H, Dh, F = 2, 3, 7
  sim = build_simulator(MAX_LEN, D, H, Dh, ffn_dim=F)
  before = snapshot(sim)
  rng = np.random.default_rng(1)
  for n in range(1, MAX_LEN + 1):
    params = random_params(rng, D, H, Dh, F)
    X = rng.standard_normal((n, D)).astype(np.float32)
    assert rel_err(sim(params, X), encoder_layer(params, X)) <= 1e-5
  assert_same_weights(before, sim)
  assert [i.name for i in sim.layers][-3:] == ["residual", "ffn_hidden", "ffn_out"]


def test_saturating_softmax_stays_accurate():
  """Scores of magnitude ~1e3: exp without max-subtraction would overflow float32 (exp(89) = inf)."""
  H, Dh = 2, 4
  sim = build_simulator(MAX_LEN, D, H, Dh)
  rng = np.random.default_rng(5)
  for n in (2, MAX_LEN):
    params = random_params(rng, D, H, Dh, scale=30.0)
    X = rng.standard_normal((n, D)).astype(np.float32)
    wq, wk = (np.asarray(w, np.float64) for w in params[:2])
    q = np.einsum("nd,hde->hne", X, wq)
    k = np.einsum("nd,hde->hne", X, wk)
    scores = np.einsum("hne,hme->hnm", q, k) / np.sqrt(Dh)
    assert np.abs(scores).max() > 100
    out = sim(params, X)
    assert np.all(np.isfinite(np.asarray(out)))
    assert rel_err(out, attention_layer(params, X)) <= 1e-5
    assert rel_err(out, attention_layer_numpy(params, X)) <= 1e-5


def test_weights_depend_on_sizes_only():
  a = build_simulator(MAX_LEN, D, 1, 3)   # the simulator of test_simulates_every_attention_layer[1-3]
  fresh, _ = universal._build_program.__wrapped__(MAX_LEN, D, 1, 3, None)  # an uncached second build
  assert fresh is not a.program
  assert_same_weights(snapshot(a), SimpleNamespace(weights=fresh.weights))
  # T's matrices enter only through the input sequence: position 0's T.* slots
  rng = np.random.default_rng(0)
  params = random_params(rng, D, 1, 3)
  n = 3
  X = rng.standard_normal((n, D)).astype(np.float32)
  seq = np.asarray(a.encode(params, X))
  L = a.layout
  assert seq.shape == (1 + n, a.width) and L.width == a.width
  slot = {s.name: slice(s.start, s.start + s.size) for s in L.slots}
  for f in ("wq", "wk", "wv", "wo"):
    name, shape = L.params[f]
    np.testing.assert_array_equal(seq[0, slot[name]].reshape(shape), getattr(params, f))
    assert not seq[1:, slot[name]].any()
  np.testing.assert_array_equal(seq[1:, slot["x"]], X)
  np.testing.assert_array_equal(seq[1:, slot["index"]], np.eye(MAX_LEN)[:n])
  assert seq[0, slot["is_param"]].item() == 1 and not seq[1:, slot["is_param"]].any()
  assert not seq[:, L.input_width:].any()  # computed slots start at zero
  out_seq = np.asarray(a.run_sequence(seq))
  np.testing.assert_array_equal(out_seq[1:, slot[L.output_slot]], np.asarray(a(params, X)))


def test_padded_and_unpadded_runs_agree():
  sim = build_simulator(MAX_LEN, D, 2, 4)   # padded: the program the tests above compiled
  rng = np.random.default_rng(2)
  params = random_params(rng, D, 2, 4)
  seq = sim.encode(params, rng.standard_normal((2, D)).astype(np.float32))
  np.testing.assert_allclose(sim.run_sequence(seq, pad=False), sim.run_sequence(seq), rtol=1e-6, atol=1e-6)


def test_runs_under_jit():
  sim = build_simulator(MAX_LEN, D, 2, 4)
  rng = np.random.default_rng(4)
  params = random_params(rng, D, 2, 4)
  X = rng.standard_normal((3, D)).astype(np.float32)
  out = jax.jit(lambda p, x: sim(p, x))(params, X)   # one call: one compilation of U inside a user jit
  np.testing.assert_allclose(out, sim(params, X), rtol=1e-6, atol=1e-6)


def test_layers_heads_and_sizes():
  N, Dm, H, Dh = 6, 5, 3, 4
  sim = build_simulator(N, Dm, H, Dh)
  kinds = [(i.name, i.kind, i.num_heads) for i in sim.layers]
  assert kinds[:3] == [("copy_params", "ahat", 1), ("project", "positionwise", 0), ("gather", "ahat", N)]
  assert all(k == "positionwise" for _, k, _ in kinds[3:])
  assert sim.num_heads == 1 + N and sim.heads_per_layer == (1, 0, N, 0, 0, 0, 0)
  assert set(sim.weights) == {"copy_params", "gather"}
  Pn = 4 * H * Dm * Dh
  width = 2 + N + Dm + 2 * Pn + 3 * H * Dh + N * (2 * H * Dh + 1) + 3 * H * N + Dm
  assert sim.width == width
  assert sim.num_params == 2 * width + 2 * width * Pn + 2 * width * N + 2 * width * N * (2 * H * Dh + 1)
  assert sim.num_nonzero == 3 + 2 * Pn + N * (4 * H * Dh + 6)
  F = 7
  enc = build_simulator(N, Dm, H, Dh, ffn_dim=F)
  assert enc.width == width + 2 * (2 * Dm * F + F + Dm) + 2 * Dm + F
  assert sim.layers[2].reads == ("is_param", "is_row", "index", "k", "v")
  assert sim.layers[2].writes == ("keys", "values", "present")


def test_every_attention_step_is_the_ahat_kernel(monkeypatch):
  calls = []
  real = machine_mod.ahat_attention

  def spy(q, k, v, **kw):
    calls.append((q.shape, v.shape))
    return real(q, k, v, **kw)

  monkeypatch.setattr(machine_mod, "ahat_attention", spy)
  monkeypatch.setattr(universal, "_build_program", universal._build_program.__wrapped__)  # uncached
  sim = build_simulator(3, 2, 1, 2)  # a fresh program, traced with the spy
  rng = np.random.default_rng(0)
  params, X = random_params(rng, 2, 1, 2), rng.standard_normal((2, 2)).astype(np.float32)
  jax.make_jaxpr(lambda p, x: sim(p, x))(params, X)   # tracing is what calls the kernel: no compile
  P = 4  # padded to 1 + max_len
  Pn = 4 * 1 * 2 * 2  # wq, wk, wv, wo of T: 4·H·D·Dh numbers, one value vector of the copy head
  assert calls == [((1, P, 1, 1), (1, P, 1, Pn)), ((1, P, 3, 1), (1, P, 3, 2 * 2 + 1))]


def test_error_table_rows():
  rows = error_table(MAX_LEN, D, [2, 3], 4, [1, 4], 2, 0)  # the simulators of the tests above
  assert [(r.heads, r.n) for r in rows] == [(2, 1), (2, 4), (3, 1), (3, 4)]
  for r in rows:
    assert r.max_abs_out > 0 and r.rel_err == pytest.approx(r.max_abs_err / r.max_abs_out)
    assert r.rel_err <= 1e-5
  rows64 = error_table(MAX_LEN, D, [2], 4, [3], 1, 0, reference="float64")
  assert rows64[0].rel_err <= 1e-5


def test_bad_inputs():
  sim = build_simulator(4, 3, 2, 2)
  rng = np.random.default_rng(0)
  p = random_params(rng, 3, 2, 2)
  X = np.zeros((2, 3), np.float32)
  with pytest.raises(ValueError, match="wider than d_model"):
    sim(p, np.zeros((2, 4)))
  with pytest.raises(ValueError, match="d_model=3 columns"):
    sim(p, np.zeros((2, 2)))
  with pytest.raises(ValueError, match="longer than max_len"):
    sim(p, np.zeros((5, 3)))
  with pytest.raises(ValueError, match="`X` must have rank 2"):
    sim(p, np.zeros(3))
  with pytest.raises(ValueError, match="`X` must not be empty"):
    sim(p, np.zeros((0, 3)))
  with pytest.raises(ValueError, match=r"`params.wq` must have shape \(2, 3, 2\)"):
    sim(p._replace(wq=np.zeros((2, 3, 3))), X)
  with pytest.raises(ValueError, match=r"`params.wo` must have shape"):
    sim(p._replace(wo=np.zeros((1, 2, 3))), X)
  with pytest.raises(ValueError, match="`X` holds non-finite"):
    sim(p, np.array([[0, np.inf, 0], [0, 0, 0]], np.float32))
  with pytest.raises(ValueError, match="`params.wk` holds non-finite"):
    sim(p._replace(wk=np.full((2, 3, 2), np.nan, np.float32)), X)
  with pytest.raises(ValueError, match="EncoderParams"):
    sim(random_params(rng, 3, 2, 2, 4), X)
  with pytest.raises(ValueError, match="AttentionParams"):
    sim((p.wq, p.wk, p.wv, p.wo), X)
  enc = build_simulator(4, 3, 2, 2, ffn_dim=4)
  with pytest.raises(ValueError, match="built with ffn_dim=4"):
    enc(p, X)
  with pytest.raises(ValueError, match=r"`params.b1` must have shape \(4,\)"):
    ep = random_params(rng, 3, 2, 2, 4)
    enc(ep._replace(b1=np.zeros(5, np.float32)), X)
  with pytest.raises(ValueError, match="`params.w1` must have shape"):
    enc(random_params(rng, 3, 2, 2, 5), X)
  with pytest.raises(ValueError, match="`seq` must have shape"):
    sim.run_sequence(np.zeros((6, sim.width)))
  with pytest.raises(ValueError, match="`seq` must have shape"):
    sim.run_sequence(np.zeros((3, sim.width + 1)))
  with pytest.raises(ValueError, match="`seq` holds non-finite"):
    sim.run_sequence(np.full((3, sim.width), np.nan))
  for name, args in (("max_len", (0, 3, 2, 2)), ("d_model", (4, 0, 2, 2)), ("num_heads", (4, 3, 1.5, 2)),
                     ("head_dim", (4, 3, 2, -1))):
    with pytest.raises(ValueError, match=f"`{name}` must be a positive integer"):
      build_simulator(*args)
  with pytest.raises(ValueError, match="`ffn_dim` must be a positive integer"):
    build_simulator(4, 3, 2, 2, ffn_dim=0)
  assert isinstance(p, AttentionParams) and not isinstance(p, EncoderParams)
