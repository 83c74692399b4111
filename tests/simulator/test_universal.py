"""The universal simulator U (Theorem 6 / Corollary 6.1): U(T, X) == T(X) for every T and n <= N, with
every sum, maximum and normaliser done by AHAT attention and only products, exp, reciprocal, ReLU and
fixed linear maps position-wise.

Three programs are compiled here (attention with 1 and 2 heads, the encoder); every other test reuses them.
"""

from types import SimpleNamespace
from typing import Callable, NamedTuple

import jax
import numpy as np
import pytest

from jaxmem.kernels import ahat as ahat_kernels
from jaxmem.machine import (
  AHATLayer,
  AttentionWeights,
  Layout,
  LinearLayer,
  LinearWeights,
  Program,
  UnaryLayer,
)
from jaxmem.simulator import (
  AttentionParams,
  EncoderParams,
  attention_layer,
  attention_layer_numpy,
  build_simulator,
  encoder_layer,
  encoder_layer_numpy,
  error_table,
  random_params,
  universal,
)
from tests.simulator.structure import assert_attention_does_the_work

MAX_LEN, D, DH, F = 4, 3, 2, 3   # every length 1..4; D odd and != D_h
DH1 = 3   # the one-head simulator's D_h: not a power of two, so a mean of D_h equal scores can round

# Tolerance, from float32 rounding (u = 2**-24 ≈ 6e-8 per operation). U computes the sums of T(X) in another
# order than attention_layer: each sum of c terms is an AHAT mean (c − 1 additions and a division by c) times c
# in W_O, each product and each exp / reciprocal rounds once (exp to a few ulp). Along the longest chain
# (x·w summed over D, q·k over D_h, the softmax over n, o·wo over H·D_h, the FFN over D and F) that is
# fewer than 40 roundings at these sizes, each relative to the sum of the |terms| it is part of; with
# random T the outputs are within a factor ~5 of those sums (little cancellation), so |U − T(X)| stays
# below ~40·5·u ≈ 1.2e-5 of the largest output in the worst case and far below it typically. float32
# attention_layer has errors of the same size as U's, so the bound holds against it and against the
# float64 equation alike.
REL_TOL = 1e-5


def snapshot(sim):
  """Every fixed number of U: the attention and linear matrices and the product / unary wiring."""
  out = {("w", layer, name): np.array(a) for layer, w in sim.weights.items() for name, a in w.items()}
  out |= {("wiring", layer, name): np.array(a) for layer, w in sim.wiring.items() for name, a in w.items()}
  return out


def assert_same_weights(before, sim):
  after = snapshot(sim)
  assert before.keys() == after.keys()
  for key, a in before.items():
    assert a.dtype == after[key].dtype and np.array_equal(a, after[key]), key


def rel_err(got, ref):
  ref = np.asarray(ref, np.float64)
  return np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max()


# -- the structure: attention does the work --------------------------------------------------------


@pytest.fixture(scope="module")
def sims():
  return {"H1": build_simulator(MAX_LEN, D, 1, DH1), "H2": build_simulator(MAX_LEN, D, 2, DH),
          "enc": build_simulator(MAX_LEN, D, 2, DH, ffn_dim=F)}


def test_u_is_attention_and_restricted_positionwise_layers_only(sims):
  for sim in sims.values():
    assert_attention_does_the_work(sim.program)
    assert {i.kind for i in sim.layers} == {"ahat", "linear", "product", "unary"}


def test_the_structure_check_rejects_the_old_design(sims):
  """The old design summed inside free-form maps of a position (the old U's `mix`: a whole output projection
  at one position); the machine no longer has such a layer and refuses one. Mutants of U it can express:
  its attention-only equivalent, `mix` gathering each of the H·D_h products of X cell (i, d) with a head of
  its own and summing them in W_O (the old matmul's gather-then-`dot`), in place of the AHAT sum over
  heads; a linear map that sums a slot's coordinates; an AHAT value that sums coordinates. Each is a valid
  Program, and each fails the structure check."""
  prog = sims["H2"].program
  U = prog.layout
  H, Dh = 2, DH

  class FreeMap(NamedTuple):   # the old design's layer: any function of one position's residual
    name: str
    fn: Callable

  with pytest.raises(TypeError, match="not a layer"):
    Program(U, [FreeMap("mix", lambda r: {"att": r["a_att"] * H * Dh})], {})

  N = U["X.i"].size
  mix = AttentionWeights(U, H * Dh, N + D + 2, 1)
  for n, (h, e) in enumerate(np.ndindex(H, Dh)):   # head (h, e) selects A (i, d, h, e): score 4 there only
    mix.query(n, "X.i", np.eye(N))
    mix.query(n, "X.d", np.eye(D), key_start=N)
    mix.key(n, "A.i", np.eye(N))
    mix.key(n, "A.d", np.eye(D), key_start=N)
    for col, (tag, idx) in enumerate((("A.h", h), ("A.e", e)), N + D):
      mix.query(n, "one", [[1.0]], key_start=col)
      mix.key(n, tag, [[1.0]], key_start=col, slot_start=idx)
    mix.value(n, "a_att", [[1.0]])
    mix.output(n, "att", [[1.0]])   # att = Σ_h,e o wo: the sum is in W_O
  layers = [AHATLayer("mix", H * Dh, N + D + 2, 1, "att = Σ_h,e o wo") if layer.name == "sum_over_heads"
            else layer for layer in prog.layers]
  with pytest.raises(AssertionError, match="'mix': an output sums value coordinates"):
    assert_attention_does_the_work(Program(U, layers, _builders(prog) | {"mix": mix}))

  def tree_sum(n, one_slot):   # n heads gather one position's number each, then a tree of two-term linear sums
    L = Layout()
    L.add("v", 1, "a number", is_input=True)
    L.add("pos", n, "one-hot position", is_input=True)
    L.add("one", 1, "1", is_input=True)
    terms = [("g", k) for k in range(n)] if one_slot else [(f"g{k}", 0) for k in range(n)]
    for name in dict.fromkeys(t for t, _ in terms):
      L.add(name, n if one_slot else 1, "gathered terms")
    levels = [terms]
    while len(levels[-1]) > 1:   # one linear layer per level of the tree
      levels.append([(f"s{len(levels)}_{p}", 0) for p in range(0, len(levels[-1]), 2)])
      for name, _ in levels[-1]:
        L.add(name, 1, "a partial sum")
    gather = AttentionWeights(L, n, n, 1)
    for k, (slot, at) in enumerate(terms):
      gather.query(k, "one", np.eye(n)[k:k + 1])
      gather.key(k, "pos", np.eye(n))
      gather.value(k, "v", [[1.0]])
      gather.output(k, slot, [[1.0]], slot_start=at)
    layers, weights = [AHATLayer("gather", n, n, 1, "term k")], {"gather": gather}
    for depth in range(1, len(levels)):
      lw = LinearWeights(L)
      for p, (name, _) in enumerate(levels[depth]):
        for slot, at in levels[depth - 1][2 * p: 2 * p + 2]:
          lw.add_entries([L[slot].start + at], [L[name].start], [1.0])
      layers.append(LinearLayer(f"level{depth}", "pairwise sums"))
      weights[f"level{depth}"] = lw
    level = levels[-1]
    tree = Program(L, layers, weights)
    seq = tree.encode(n, {"v": np.arange(1.0, n + 1)[:, None], "pos": np.eye(n), "one": np.ones((n, 1))})
    assert np.all(np.asarray(tree.read(tree.run(seq), level[0][0])) == n * (n + 1) / 2)   # it does sum them
    return tree

  with pytest.raises(AssertionError, match="'level1': an output sums coordinates of one slot"):
    assert_attention_does_the_work(tree_sum(4, one_slot=True))
  with pytest.raises(AssertionError, match="'level3': an output sums more than four coords"):
    assert_attention_does_the_work(tree_sum(8, one_slot=False))
  with pytest.raises(AssertionError, match="may add to a coordinate twice"):
    assert_attention_does_the_work(Program(prog.layout, prog.layers, _builders(prog), single_assignment=False))

  L = Layout()
  L.add("v", 3, "input", is_input=True)
  L.add("s", 1, "a sum")
  lw = LinearWeights(L)   # its `add` refuses a reduction; a hand-written block does not
  lw.add_block("v", L["s"].start, np.ones((3, 1)))   # s = v_0 + v_1 + v_2: a reduction
  with pytest.raises(AssertionError, match="reads more than two coords"):
    assert_attention_does_the_work(Program(L, [LinearLayer("sum", "s = Σ v")], {"sum": lw}))
  aw = AttentionWeights(L, 1, 1, 1)
  aw.query(0, "v", [[1.0], [0.0], [0.0]])
  aw.value(0, "v", [[1.0], [1.0], [1.0]])
  aw.output(0, "s", [[1.0]])
  with pytest.raises(AssertionError, match="a value sums coordinates"):
    assert_attention_does_the_work(Program(L, [AHATLayer("att", 1, 1, 1, "")], {"att": aw}))


def _builders(prog):
  """A program's fixed weights back as builders (to assemble a mutant Program from them)."""
  out = {}
  for layer in prog.layers:
    w = {k: np.asarray(a) for k, a in prog.weights.get(layer.name, {}).items()}
    if isinstance(layer, AHATLayer):
      b = AttentionWeights(prog.layout, layer.num_heads, layer.key_dim, layer.value_dim)
      b.wq, b.wk, b.wv, b.wo = w["wq"], w["wk"], w["wv"], w["wo"]
      out[layer.name] = b
    elif isinstance(layer, LinearLayer):
      b = LinearWeights(prog.layout)
      b.add_entries(*prog.linear_entries(layer.name))
      out[layer.name] = b
  return out


def test_weights_depend_on_sizes_only(sims):
  sim = sims["H1"]
  fresh, _ = universal._build_program.__wrapped__(MAX_LEN, D, 1, DH1, None)  # an uncached second build
  assert fresh is not sim.program
  assert_same_weights(snapshot(sim), SimpleNamespace(weights=fresh.weights, wiring=fresh.wiring))
  # T's matrices enter only through the input sequence: one entry per W cell, X one entry per X cell
  rng = np.random.default_rng(0)
  params = random_params(rng, D, 1, DH1)
  n = 3
  X = rng.standard_normal((n, D)).astype(np.float32)
  seq = np.asarray(sim.encode(params, X))
  L = sim.layout
  assert seq.shape == (sim.sequence_length(n), sim.width) and L.width == sim.width
  slot = {s.name: s.start for s in L.slots}
  pos = sim.cell_positions(n)
  assert list(pos) == ["BOS", "W", "X", "A", "S"] and pos["S"].stop == len(seq)
  for f in ("wq", "wk", "wv", "wo"):
    name, cell, axes = L.params[f]
    want = getattr(params, f) if axes == "h d e" else np.swapaxes(getattr(params, f), 1, 2)
    np.testing.assert_array_equal(seq[pos[cell], slot[name]].reshape(1, D, DH1), want)
    assert np.count_nonzero(seq[:, slot[name]]) == np.count_nonzero(want)   # nowhere else
  np.testing.assert_array_equal(seq[pos["X"], slot["x"]].reshape(n, D), X)
  # tags: a one-hot per index at its own cells, zero elsewhere; A cell (i, d, h, e) in row-major order
  A = seq[pos["A"]]
  a_i = slice(slot["A.i"], slot["A.i"] + MAX_LEN)
  np.testing.assert_array_equal(A[:, a_i].argmax(1), np.repeat(np.arange(n), D * DH1))
  assert not seq[pos["S"], a_i].any()
  assert seq[:, slot["one"]].all() and seq[0, slot["is_bos"]] == 1 and seq[:, slot["is_bos"]].sum() == 1
  assert not seq[:, L.input_width:].any()  # computed slots start at zero
  out_seq = np.asarray(sim.run_sequence(seq))
  got = out_seq[pos["X"], slot[L.output_slot]].reshape(n, D)
  np.testing.assert_array_equal(got, np.asarray(sim(params, X)))


# -- U(T, X) == T(X) -------------------------------------------------------------------------------


@pytest.mark.parametrize("key,H,Dh", [("H1", 1, DH1), ("H2", 2, DH)])
def test_simulates_every_attention_layer_at_every_length(sims, key, H, Dh):
  sim = sims[key]
  before = snapshot(sim)
  rng = np.random.default_rng(10 * H)
  for n in range(1, MAX_LEN + 1):
    for _ in range(2):  # a different T every call, same U
      params = random_params(rng, D, H, Dh)
      X = rng.standard_normal((n, D)).astype(np.float32)
      out = sim(params, X)
      assert out.shape == (n, D)
      assert rel_err(out, attention_layer(params, X)) <= REL_TOL, n
      assert rel_err(out, attention_layer_numpy(params, X)) <= REL_TOL, n
  assert_same_weights(before, sim)


def test_simulates_every_encoder_layer_at_every_length(sims):
  sim = sims["enc"]
  before = snapshot(sim)
  rng = np.random.default_rng(1)
  for n in range(1, MAX_LEN + 1):
    for _ in range(2):
      params = random_params(rng, D, 2, DH, F)
      X = rng.standard_normal((n, D)).astype(np.float32)
      assert rel_err(sim(params, X), encoder_layer(params, X)) <= REL_TOL, n
      assert rel_err(sim(params, X), encoder_layer_numpy(params, X)) <= REL_TOL, n
  assert_same_weights(before, sim)
  assert [i.name for i in sim.layers][-3:] == ["ffn_out_products", "sum_ffn_out", "ffn_residual"]


def test_saturating_softmax_stays_accurate(sims):
  """Scores of magnitude ~1e3: exp without the row max subtracted would overflow float32 (exp(89) = inf).

  The scores' own rounding (|s|·u ≈ 1e-4 absolute) moves the softmax weights by at most p(1 − p)·δs, and
  saturated weights are near 0 or 1: the error stays at the scale of the unsaturated case."""
  H = 2
  sim = sims["H2"]
  rng = np.random.default_rng(5)
  for n in (2, MAX_LEN):
    params = random_params(rng, D, H, DH, scale=30.0)
    X = rng.standard_normal((n, D)).astype(np.float32)
    wq, wk = (np.asarray(w, np.float64) for w in params[:2])
    scores = np.einsum("hne,hme->hnm", np.einsum("nd,hde->hne", X, wq), np.einsum("nd,hde->hne", X, wk))
    assert np.abs(scores / np.sqrt(DH)).max() > 100
    out = sim(params, X)
    assert np.all(np.isfinite(np.asarray(out)))
    assert rel_err(out, attention_layer(params, X)) <= REL_TOL
    assert rel_err(out, attention_layer_numpy(params, X)) <= REL_TOL


@pytest.mark.parametrize("key,H,Dh", [("H1", 1, DH1), ("H2", 2, DH)])
def test_row_max_is_the_exact_maximum_and_ties_are_served(sims, key, H, Dh):
  """The `rowmax` slot at S cell (h, i, j, e) is bitwise the maximum of U's own scores over the row (h, i): an
  argmax of a data key, no tolerance (keyed on the e = 0 cells only: a mean of D_h = 3 equal copies would
  round). With repeated rows of X every score of a row ties (a mean of n equal values: the test then asks
  only for the right output)."""
  sim = sims[key]
  L = sim.program.layout
  rng = np.random.default_rng(3)
  params = random_params(rng, D, H, Dh)
  n = MAX_LEN
  cases = [(rng.standard_normal((n, D)).astype(np.float32), False) for _ in range(6)]   # 6·H·n rows
  for X, ties in cases + [(np.repeat(rng.standard_normal((1, D)).astype(np.float32), n, 0), True)]:
    out_seq = np.asarray(sim.run_sequence(sim.encode(params, X)))
    S = out_seq[sim.cell_positions(n)["S"]]
    score = S[:, L["score"].start].reshape(H, n, n, Dh)
    rowmax = S[:, L["rowmax"].start].reshape(H, n, n, Dh)
    assert np.isfinite(out_seq).all()
    if ties:
      assert rel_err(sim.decode(out_seq), attention_layer_numpy(params, X)) <= REL_TOL
      continue
    np.testing.assert_array_equal(rowmax, np.broadcast_to(score.max(axis=(2, 3), keepdims=True), rowmax.shape))
    assert rel_err(sim.decode(out_seq), attention_layer_numpy(params, X)) <= REL_TOL


def _scores_of_magnitude(target, rng, X):
  """Attention params whose scores are target·(Σ_d X_i)(Σ_d X_j)/D² (rank one: rows of X with one sum tie)."""
  H, Dh = 2, DH
  wq, wk = np.zeros((2, H, D, Dh), np.float32)
  wq[:, :, 0] = 1e18
  wk[:, :, 0] = np.float32(target * np.sqrt(Dh) / (D * D * 1e18))
  return AttentionParams(wq, wk, rng.standard_normal((H, D, Dh)).astype(np.float32),
                         rng.standard_normal((H, Dh, D)).astype(np.float32))


@pytest.mark.parametrize("target", [-2.5e37, -8e37, 1e38])
def test_huge_tied_scores_stay_finite(sims, target):
  """Scores up to 1e38 in magnitude, tied across the sequence and within rows (repeated rows of X): U's argmax
  heads `global_min` and `row_max` average tied values, which the kernel sums before dividing by their count;
  64 tied minima of −2.5e37 overflowed float32 and U returned NaN (review of issue 37). The values now enter
  scaled by 1/c, c a power of two at least the most ties, and W_O multiplies the mean back: finite for every
  score above −2**126 (−8e37 is just above it) and exact as before (the row max within an ulp of U's own
  maximum: a mean of k ≥ 3 equal values rounds once)."""
  sim = sims["H2"]
  L = sim.program.layout
  rng = np.random.default_rng(8)
  for X in (np.ones((MAX_LEN, D), np.float32), np.array([[1] * D, [1] * D, [.5] * D, [1] * D], np.float32)):
    params = _scores_of_magnitude(target, rng, X)
    out_seq = np.asarray(sim.run_sequence(sim.encode(params, X)))
    assert np.isfinite(out_seq).all()
    assert rel_err(sim.decode(out_seq), attention_layer_numpy(params, X)) <= REL_TOL
    S = out_seq[sim.cell_positions(MAX_LEN)["S"]]
    score = S[:, L["score"].start].reshape(2, MAX_LEN, MAX_LEN, DH)
    rowmax = S[:, L["rowmax"].start].reshape(2, MAX_LEN, MAX_LEN, DH)
    assert np.abs(score).max() >= abs(target) / 4
    top = np.broadcast_to(score.max(axis=(2, 3), keepdims=True), rowmax.shape)
    np.testing.assert_array_max_ulp(rowmax, top, maxulp=1)


def test_scores_at_or_below_minus_2_to_126_are_refused(sims):
  """U's row max bounds every score by low = 2·min(score) − 1, which must be a finite float32: lower scores are
  out of U's range, and refused at the boundary rather than returning NaN."""
  X = np.ones((2, D), np.float32)
  params = _scores_of_magnitude(-9e37, np.random.default_rng(0), X)
  with pytest.raises(ValueError, match=r"`params` and `X` give an attention score of -9e\+37, at or below"):
    sims["H2"](params, X)
  with pytest.raises(ValueError, match="at or below"):
    sims["enc"](EncoderParams(params, *random_params(np.random.default_rng(1), D, 2, DH, F)[1:]), X)


def test_queries_outside_a_selection_read_the_bos(sims):
  """Every AHAT layer selects by tags among one cell type; a query of another type matches no key and must
  get the BOS's value (the default key, score K − ½), never the mean of the whole sequence."""
  sim = sims["enc"]
  L = sim.program.layout
  rng = np.random.default_rng(7)
  n = 2
  out_seq = np.asarray(sim.run_sequence(sim.encode(random_params(rng, D, 2, DH, F),
                                                    rng.standard_normal((n, D)).astype(np.float32))))
  pos = sim.cell_positions(n)
  active = {"a_": "A", "s_": "S", "score": "S", "rowmax": "S", "f_": "F", "hd_": "Hd", "x_b2": "X", "att": "X",
            "ffn": "X"}
  written = [s for i in sim.layers if i.kind == "ahat" for s in i.writes if s != "gmin"]   # gmin: global
  assert len(written) == 21
  for slot in written:
    cell = next(c for p, c in active.items() if slot.startswith(p))
    col = out_seq[:, L[slot].start]
    others = np.ones(len(out_seq), bool)
    others[pos[cell]] = False
    np.testing.assert_array_equal(col[others], col[0], err_msg=slot)   # position 0 is the BOS
  assert np.isfinite(out_seq).all()
  assert out_seq[0, L["ez"].start] == 1 and out_seq[pos["X"], L["a_den"].start].min() == 1   # neutral values


def test_padded_and_unpadded_runs_agree(sims):
  sim = sims["H2"]
  rng = np.random.default_rng(2)
  params = random_params(rng, D, 2, DH)
  seq = sim.encode(params, rng.standard_normal((2, D)).astype(np.float32))
  padded = np.asarray(sim.run_sequence(seq))
  np.testing.assert_allclose(sim.run_sequence(seq, pad=False), padded, rtol=1e-6, atol=1e-6)
  assert np.isfinite(padded).all()


def test_runs_under_jit(sims):
  sim = sims["H2"]
  rng = np.random.default_rng(4)
  params = random_params(rng, D, 2, DH)
  X = rng.standard_normal((3, D)).astype(np.float32)
  out = jax.jit(lambda p, x: sim(p, x))(params, X)   # one call: one compilation of U inside a user jit
  np.testing.assert_allclose(out, sim(params, X), rtol=1e-6, atol=1e-6)


def test_layers_heads_and_sizes(sims):
  for key, H, ffn in (("H1", 1, None), ("H2", 2, None), ("enc", 2, F)):
    sim, N = sims[key], MAX_LEN
    G = H * N   # one coordinate per softmax row (h, i)
    kinds = [i.kind for i in sim.layers]
    assert kinds[:17] == ["ahat", "product", "ahat", "product", "ahat", "ahat", "linear", "product", "ahat",
                          "linear", "unary", "product", "ahat", "unary", "product", "product", "ahat"]
    n_attention = 9 if ffn is None else 16
    assert sim.num_heads == n_attention and max(sim.heads_per_layer) == (2 if ffn is None else 5)
    Dh = DH1 if key == "H1" else DH
    width = 33 + 3 * H + 3 * D + 3 * Dh + 4 * N + 5 * G
    if ffn is not None:
      width += 3 * D + 4 * ffn + 2 * N + 19
    assert sim.width == width
    for n in range(1, N + 1):
      P = 1 + H * D * Dh + n * D + n * D * H * Dh + H * n * n * Dh
      if ffn is not None:
        P += D * ffn + ffn + D + n * ffn + n * D * ffn
      assert sim.sequence_length(n) == P
    fixed = sum(2 * sim.width * i.num_heads * (i.key_dim + i.value_dim) for i in sim.layers if i.kind == "ahat")
    # the linear layers store their non-zero terms only: lower_bound 2 + 2G (nonrow = 1 − S.hi0), shift 2; the
    # encoder adds residual 2, ffn_bias 4, ffn_residual 2
    fixed += 2 * G + 4 + (8 if ffn is not None else 0)
    assert sim.num_params == fixed
  info = {i.name: i for i in sims["H2"].layers}
  assert info["row_max"].reads == ("one", "is_bos", "is_S", "S.hi", "score", "mk_in", "mk_out")
  assert info["sum_over_j"].writes == ("a_num", "a_den")
  assert (info["exp"].op, info["reciprocal"].op) == ("exp", "reciprocal")


def test_every_attention_step_is_the_ahat_kernel(sims, monkeypatch):
  calls = []
  real = ahat_kernels.ahat_attention   # machine.Program's AHAT layers call it through ahat_sublayer

  def spy(q, k, v, **kw):
    calls.append((q.shape, k.shape, v.shape, kw["tol"]))
    return real(q, k, v, **kw)

  monkeypatch.setattr(ahat_kernels, "ahat_attention", spy)
  monkeypatch.setattr(universal, "_build_program", universal._build_program.__wrapped__)  # uncached
  sim = build_simulator(MAX_LEN, D, 2, DH)  # a fresh program, traced with the spy
  rng = np.random.default_rng(0)
  params, X = random_params(rng, D, 2, DH), rng.standard_normal((2, D)).astype(np.float32)
  jax.make_jaxpr(lambda p, x: sim(p, x))(params, X)   # tracing is what calls the kernel: no compile
  P = sim.sequence_length()   # padded to n = max_len
  declared = [((1, P, i.num_heads, i.key_dim),) * 2 + ((1, P, i.num_heads, i.value_dim), 0.0)
              for i in sims["H2"].layers if i.kind == "ahat"]
  assert calls == declared and len(calls) == 7


def test_error_table_rows(sims):
  rows = error_table(MAX_LEN, D, [2, 2], DH, [1, 4], 2, 0)  # the H2 simulator (no new compilation)
  assert [(r.heads, r.n) for r in rows] == [(2, 1), (2, 4), (2, 1), (2, 4)]
  for r in rows:
    assert r.max_abs_out > 0 and r.rel_err == pytest.approx(r.max_abs_err / r.max_abs_out)
    assert r.rel_err <= REL_TOL
  rows64 = error_table(MAX_LEN, D, [2], DH, [3], 1, 0, reference="float64")
  assert rows64[0].rel_err <= REL_TOL


def test_bad_inputs(sims):
  sim = sims["H2"]
  rng = np.random.default_rng(0)
  p = random_params(rng, D, 2, DH)
  X = np.zeros((2, D), np.float32)
  with pytest.raises(ValueError, match="wider than d_model"):
    sim(p, np.zeros((2, D + 1)))
  with pytest.raises(ValueError, match=f"d_model={D} columns"):
    sim(p, np.zeros((2, D - 1)))
  with pytest.raises(ValueError, match="longer than max_len"):
    sim(p, np.zeros((MAX_LEN + 1, D)))
  with pytest.raises(ValueError, match="`X` must have rank 2"):
    sim(p, np.zeros(D))
  with pytest.raises(ValueError, match="`X` must not be empty"):
    sim(p, np.zeros((0, D)))
  with pytest.raises(ValueError, match=rf"`params.wq` must have shape \(2, {D}, {DH}\)"):
    sim(p._replace(wq=np.zeros((2, D, DH + 1))), X)
  with pytest.raises(ValueError, match=r"`params.wo` must have shape"):
    sim(p._replace(wo=np.zeros((1, DH, D))), X)
  with pytest.raises(ValueError, match="`X` holds non-finite"):
    sim(p, np.array([[0, np.inf, 0], [0, 0, 0]], np.float32))
  with pytest.raises(ValueError, match="`params.wk` holds non-finite"):
    sim(p._replace(wk=np.full((2, D, DH), np.nan, np.float32)), X)
  with pytest.raises(ValueError, match="EncoderParams"):
    sim(random_params(rng, D, 2, DH, 4), X)
  with pytest.raises(ValueError, match="AttentionParams"):
    sim((p.wq, p.wk, p.wv, p.wo), X)
  enc = sims["enc"]
  with pytest.raises(ValueError, match=f"built with ffn_dim={F}"):
    enc(p, X)
  with pytest.raises(ValueError, match=rf"`params.b1` must have shape \({F},\)"):
    ep = random_params(rng, D, 2, DH, F)
    enc(ep._replace(b1=np.zeros(F + 1, np.float32)), X)
  with pytest.raises(ValueError, match="`params.w1` must have shape"):
    enc(random_params(rng, D, 2, DH, F + 1), X)
  P = sim.sequence_length(2)
  with pytest.raises(ValueError, match="`seq` must have shape"):
    sim.run_sequence(np.zeros((P + 1, sim.width)))
  with pytest.raises(ValueError, match="`seq` must have shape"):
    sim.run_sequence(np.zeros((P, sim.width + 1)))
  with pytest.raises(ValueError, match="`seq` holds non-finite"):
    sim.run_sequence(np.full((P, sim.width), np.nan))
  with pytest.raises(ValueError, match="`out_seq` must have"):
    sim.decode(np.zeros((P - 1, sim.width)))
  for bad in (0, MAX_LEN + 1, 1.0):
    with pytest.raises(ValueError, match="`n` must be an integer"):
      sim.sequence_length(bad)
    with pytest.raises(ValueError, match="`n` must be an integer"):
      sim.cell_positions(bad)
  for name, args in (("max_len", (0, 3, 2, 2)), ("d_model", (4, 0, 2, 2)), ("num_heads", (4, 3, 1.5, 2)),
                     ("head_dim", (4, 3, 2, -1))):
    with pytest.raises(ValueError, match=f"`{name}` must be a positive integer"):
      build_simulator(*args)
  with pytest.raises(ValueError, match="`ffn_dim` must be a positive integer"):
    build_simulator(4, 3, 2, 2, ffn_dim=0)
  with pytest.raises(ValueError, match="`op` must be one of"):
    UnaryLayer("bad", "sin", (), "")
  assert isinstance(p, AttentionParams) and not isinstance(p, EncoderParams)
