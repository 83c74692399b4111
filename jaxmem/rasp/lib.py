"""A library of RASP programs; the compiler's conformance table is :data:`jaxmem.rasp.programs.PROGRAMS`
(its references in :mod:`jaxmem.rasp.references`, its samplers in :mod:`jaxmem.rasp.samplers`).

The factories carry tracr's names and signatures (``tracr.compiler.lib``) so tracr code
ports by changing the import; the programs themselves are written for this package's
compiler (exact average-hard-attention transformers), which means:

* every intermediate node has a ``.named(...)`` name, unique within a program (the names
  label the compiled model's residual dimensions);
* a categorical ``Aggregate`` only ever selects positions that all hold the same value
  (almost always exactly one position), or none (then it yields its ``default``);
* a numerical ``Aggregate`` averages a numerical SOp with ``default=0``;
* constants are ``Full``; no ``ConstantSOp`` / ``ConstantSelector`` (they do not compile).

Programs in :data:`PROGRAMS` (``n`` is the input length, ``x`` the tokens; in brackets
tracr's published compiled size at ``max_seq_len=5``: layers, heads per layer, residual
width, parameters):

* ``length`` — ``n`` at every position. Vocab ``{a, b, c}``. (tracr: 1, 1, 19, 912)
* ``reverse`` — ``x[::-1]``. Vocab ``{a, b, c}``. (4, 1, 43, 18.6k)
* ``hist`` — at ``i``, how many positions hold ``x[i]``. Vocab ``{a, b, c}``. (1, 1, 19, 912)
* ``sort_unique`` — ``sorted(x)``, tokens distinct. Vocab ``{1..5}``, so ``n <= 5``.
  (2, 1, 25, 2.6k)
* ``sort`` — ``sorted(x)`` with repeats, via the key ``x[i] + i/N`` (``min_key=1``).
  Vocab ``{1, 2, 3}``. (3, 1, 50, 23.7k)
* ``sort_freq`` — the tokens by descending frequency, equally frequent ones in input
  order. Vocab ``{a, b, c}``. (5, 1, 66, 62k)
* ``frac_prevs`` — numerical: the fraction of ``x[:i+1]`` equal to ``"x"``. Vocab
  ``{x, y}``. (2, 1, 14, 840)
* ``pair_balance`` — numerical: (#``(`` − #``)`` in ``x[:i+1]``) / (i + 1). Vocab
  ``{(, ), x}``. (2, 2, 15, 1.9k)
* ``shuffle_dyck1`` — 1 everywhere iff the parentheses are balanced, else 0. Vocab
  ``{(, )}``. (tracr: not published)
* ``shuffle_dyck2`` — 1 everywhere iff ``()`` and ``{}`` are each balanced (interleaving
  freely), else 0. Vocab ``{(, ), {, }}``. (8, 4, 55, 243k)
* ``kparity`` — the XOR of the bits at positions 0, 2, 3 (0 past the end), one
  single-position select per bit and an XOR chain. Vocab ``{0, 1}``.
* ``kparity_count`` — the same XOR from a numerical mean of those bits. Vocab ``{0, 1}``.
* ``match2`` — 1 at ``i`` iff some ``j`` (``i`` itself allowed) has ``(x[i] + x[j]) % 5
  == 0`` (Sanford, Hsu & Telgarsky 2023). Vocab ``{0..4}``.
* ``running_sum`` — numerical: the prefix sums ``x[0] + … + x[i]``. Vocab ``{0..3}``.
* ``transpose`` — a row-major 2×3 matrix to its 3×2 transpose, row-major; inputs of
  length exactly 6. Vocab ``{a, b, c}``.

Each :class:`ProgramSpec` in :data:`PROGRAMS` pairs a program (``build(max_seq_len)``) with
its vocabulary, its input domain (``min_len`` / ``max_len`` / ``valid``), a random-input
sampler and an independent plain-Python ``reference`` of the same function: the
interpreter is tested against the references (``tests/rasp/test_lib.py``), and a compiled
model must agree with ``rasp.evaluate`` on every accepted input — the compiler's conformance
suite. Numerical outputs agree to 1e-9; ``None`` (an Aggregate that selected nothing, with
``default=None``) only ever equals ``None``. No accepted input produces a ``None``.

Beyond the table, tracr's remaining helpers are here too (``make_count``,
``make_count_less_freq``, ``shift_by``, ``detect_pattern``, ``make_nary_sequencemap``).

Differences from tracr's versions, all deliberate: intermediate names are unique within a
program (tracr reuses e.g. ``bools_open`` per pair in ``shuffle_dyck``); ``make_reverse``
computes ``n − 1 − i`` in one SequenceMap (tracr: two MLPs); ``make_shuffle_dyck`` returns
ints 1/0 (tracr's docstring says 1/0, its code returns bools), takes each pair's balance
from one numerical mean of a ±1/0 step (tracr: ``make_pair_balance``, two means and their
difference), counts negative prefixes with an exact LinearSequenceMap and ends in a
numerical × categorical SequenceMap, so it needs fewer layers, heads and MLP units;
``make_kparity_count`` scales its mean by the count of positions inside the input (read
from ``length``), so it is exact on inputs shorter than ``max(positions) + 1`` too.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, List, Optional, Sequence

from jaxmem.checks import check_positive_int
from jaxmem.rasp import rasp

__all__ = [
    "detect_pattern", "make_count", "make_count_less_freq",
    "make_frac_prevs", "make_hist", "make_kparity", "make_kparity_count", "make_length",
    "make_match2", "make_nary_sequencemap", "make_pair_balance", "make_reverse",
    "make_running_sum", "make_shuffle_dyck", "make_shuffle_dyck2", "make_sort",
    "make_sort_freq", "make_sort_unique", "make_transpose", "shift_by",
]


def _check_positions(positions: Sequence[int]) -> tuple:
  try:
    pos = tuple(positions)
  except TypeError as e:
    raise ValueError(f"`positions` must be a sequence of ints, got {positions!r}.") from e
  if not pos:
    raise ValueError("`positions` must name at least one position.")
  for p in pos:
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
      raise ValueError(f"`positions` must be non-negative ints, got {p!r} in {pos!r}.")
  if len(set(pos)) != len(pos):
    raise ValueError(f"`positions` must be distinct, got {pos!r}.")
  return pos


# ----------------------------------------------------------------------------- tracr's programs


def make_length() -> rasp.SOp:
  """``n`` at every position: the width of the all-true selector.

  ``make_length()("abcd") == [4, 4, 4, 4]``."""
  everything = rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.TRUE)
  return rasp.SelectorWidth(everything.named("all_true_selector")).named("length")


def make_reverse(sop: rasp.SOp) -> rasp.SOp:
  """``sop`` read backwards: position ``i`` takes ``sop[n − 1 − i]``.

  ``make_reverse(rasp.tokens)("abc") == ["c", "b", "a"]``."""
  n = make_length()
  mirror = rasp.SequenceMap(lambda size, i: size - 1 - i, n, rasp.indices).named("opp_index")
  flip = rasp.Select(rasp.indices, mirror, rasp.Comparison.EQ).named("reverse_selector")
  return rasp.Aggregate(flip, sop).named("reverse")


def make_hist() -> rasp.SOp:
  """At each position, how many positions hold the same token.

  ``make_hist()("abac") == [2, 1, 2, 1]``."""
  same = rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.EQ).named("same_tok")
  return rasp.SelectorWidth(same).named("hist")


def make_sort_unique(vals: rasp.SOp, keys: rasp.SOp) -> rasp.SOp:
  """``vals`` ordered by ascending ``keys``; the keys must be distinct.

  A position's target is the number of keys smaller than its own; output position ``i``
  reads the value whose target is ``i`` (exactly one, as the keys are distinct).
  ``make_sort_unique(rasp.tokens, rasp.tokens)([2, 4, 3, 1]) == [1, 2, 3, 4]``."""
  smaller = rasp.Select(keys, keys, rasp.Comparison.LT).named("smaller")
  target = rasp.SelectorWidth(smaller).named("target_pos")
  gather = rasp.Select(target, rasp.indices, rasp.Comparison.EQ).named("sort_selector")
  return rasp.Aggregate(gather, vals).named("sort")


def make_sort(vals: rasp.SOp, keys: rasp.SOp, *, max_seq_len: int,
              min_key: float) -> rasp.SOp:
  """``vals`` stably ordered by ascending numerical ``keys``, which may repeat.

  The keys are made distinct as ``key + min_key · i / max_seq_len`` (position ``i``), then
  sorted by :func:`make_sort_unique`; equal keys keep their input order. Correct for
  inputs of length ``<= max_seq_len`` whose distinct keys differ by at least ``min_key``
  (tracr's name; for integer keys use 1). ``make_sort(t, t, max_seq_len=5,
  min_key=1)([2, 4, 1, 2]) == [1, 2, 2, 4]``."""
  check_positive_int("max_seq_len", max_seq_len)
  if isinstance(min_key, bool) or not isinstance(min_key, numbers.Real) or not min_key > 0:
    raise ValueError(f"`min_key` must be a positive number, got {min_key!r}.")
  spread = min_key / max_seq_len
  unique_keys = rasp.SequenceMap(lambda k, i: k + spread * i, keys, rasp.indices)
  return make_sort_unique(vals, unique_keys.named("sort_keys"))


def make_sort_freq(max_seq_len: int) -> rasp.SOp:
  """The tokens ordered by descending frequency; equally frequent tokens keep their input
  order. ``make_sort_freq(5)([2, 4, 2, 1]) == [2, 2, 4, 1]``."""
  neg_hist = rasp.Map(lambda h: -h, make_hist()).named("neg_hist")
  return make_sort(rasp.tokens, neg_hist, max_seq_len=max_seq_len,
                   min_key=1).named("sort_freq")


def make_frac_prevs(bools: rasp.SOp) -> rasp.SOp:
  """Numerical: at position ``i``, the fraction of ``bools[0..i]`` that are true.

  ``make_frac_prevs(rasp.tokens == "l")("hello") == [0, 0, 1/3, 1/2, 2/5]``."""
  bools = rasp.numerical(bools)
  prefix = rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.LEQ)
  prefix = prefix.named(f"prevs[{bools.label}]")
  return rasp.numerical(rasp.Aggregate(prefix, bools, default=0)).named("frac_prevs")


def make_pair_balance(sop: rasp.SOp, open_token: Any, close_token: Any) -> rasp.SOp:
  """Numerical: at ``i``, (#``open_token`` − #``close_token`` in ``sop[0..i]``) / (i + 1).

  Never negative and 0 at the end iff the brackets are balanced.
  ``make_pair_balance(rasp.tokens, "(", ")")("a()b(c))") == [0, 1/2, 0, 0, 1/5, 1/6, 0,
  -1/8]``."""
  tag = f"{open_token}{close_token}"
  is_open = rasp.numerical(sop == open_token).named(f"bools_open[{tag}]")
  is_close = rasp.numerical(sop == close_token).named(f"bools_close[{tag}]")
  opens = rasp.numerical(make_frac_prevs(is_open)).named(f"opens[{tag}]")
  closes = rasp.numerical(make_frac_prevs(is_close)).named(f"closes[{tag}]")
  balance = rasp.LinearSequenceMap(opens, closes, 1, -1)
  return rasp.numerical(balance).named("pair_balance")


def make_shuffle_dyck(pairs: List[str]) -> rasp.SOp:
  """True at every position iff, for each two-character pair ``"oc"`` in ``pairs``, the ``o``/``c``
  brackets are balanced on their own (other tokens are ignored), else False (bools, as tracr's).

  Balanced means: no prefix has more ``c`` than ``o``, and the whole input has as many of
  each: per pair, a prefix balance (one numerical Aggregate); the number of pairs whose
  balance is negative, averaged over all positions (0 iff never negative); whether every
  balance is 0 at the last position. ``make_shuffle_dyck(["()", "{}"])("({)}") == [True] * 4``."""
  pairs = list(pairs)
  if not pairs:
    raise ValueError("`pairs` must name at least one bracket pair.")
  for p in pairs:
    if not isinstance(p, str) or len(p) != 2 or p[0] == p[1]:
      raise ValueError(f"each pair must be a 2-character string of distinct brackets, got {p!r}.")
  if len(set("".join(pairs))) != 2 * len(pairs):
    raise ValueError(f"the pairs {pairs!r} share a bracket.")

  # A pair's balance (#open − #close in the prefix, over its length) as ONE numerical mean of
  # a ±1/0 step — the same sign and zeros as make_pair_balance's difference of two means, but
  # one head per pair, and the compiler's inferred value set (every j/w) is far smaller than
  # that of a difference of two means (every a/w − b/w'), so the MLPs reading it are too.
  prefix = rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.LEQ).named("select_prefix")
  negative: Optional[rasp.SOp] = None  # numerical: how many pairs have a negative prefix here
  closed: Optional[rasp.SOp] = None    # categorical: every pair's balance is 0 here
  for j, pair in enumerate(pairs):
    step = rasp.Map(lambda x, o=pair[0], c=pair[1]: 1 if x == o else (-1 if x == c else 0),
                    rasp.tokens)
    step = rasp.numerical(step).named(f"step[{pair}]")
    balance = rasp.numerical(rasp.Aggregate(prefix, step, default=0)).named(f"balance[{pair}]")
    neg = rasp.numerical(rasp.Map(lambda b: 1 if b < 0 else 0, balance)).named(f"negative[{pair}]")
    zero = rasp.Map(lambda b: b == 0, balance).named(f"zero[{pair}]")
    if negative is None:
      negative, closed = neg, zero
    else:
      so_far = "".join(pairs[:j + 1])
      negative = rasp.numerical(rasp.LinearSequenceMap(negative, neg, 1, 1))
      negative = negative.named(f"negative[{so_far}]")
      closed = rasp.SequenceMap(lambda a, b: bool(a and b), closed, zero).named(f"zero[{so_far}]")

  everywhere = rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.TRUE).named("select_all")
  ever_negative = rasp.numerical(rasp.Aggregate(everywhere, negative, default=0))
  ever_negative = ever_negative.named("has_neg")  # 0 iff no prefix is negative for any pair
  last = rasp.Map(lambda size: size - 1, make_length()).named("last_index")
  at_last = rasp.Select(rasp.indices, last, rasp.Comparison.EQ).named("select_last")
  closed_at_end = rasp.Aggregate(at_last, closed).named("last_zero")
  verdict = rasp.SequenceMap(lambda z, neg: bool(z) and neg == 0, closed_at_end, ever_negative)
  return verdict.named("shuffle_dyck")


def make_shuffle_dyck2() -> rasp.SOp:
  """:func:`make_shuffle_dyck` for ``()`` and ``{}``."""
  return make_shuffle_dyck(pairs=["()", "{}"]).named("shuffle_dyck2")


def make_count(sop: rasp.SOp, token: Any) -> rasp.SOp:
  """How many positions of ``sop`` equal ``token``, at every position.

  ``make_count(rasp.tokens, "a")("aaabbc") == [3] * 6``."""
  hits = rasp.Select(sop, sop, lambda k, q: k == token).named(f"select_{token}")
  return rasp.SelectorWidth(hits).named(f"count_{token}")


def make_count_less_freq(n: int) -> rasp.SOp:
  """How many positions hold a token that occurs at most ``n`` times, at every position.

  (tracr's function; its docstring says "fewer than n", its code — and this — counts
  tokens occurring ``<= n`` times.) ``make_count_less_freq(2)("aaabbc") == [3] * 6``."""
  hist = make_hist()
  rare = rasp.Select(hist, hist, lambda k, q: k <= n).named("select_less")
  return rasp.SelectorWidth(rare).named("count_less_freq")


def shift_by(offset: int, /, sop: rasp.SOp) -> rasp.SOp:
  """``sop`` moved ``offset`` positions right: position ``i`` reads ``sop[i − offset]``,
  ``None`` where that is outside the input."""
  if isinstance(offset, bool) or not isinstance(offset, int):
    raise ValueError(f"`offset` must be an int, got {offset!r}.")
  behind = rasp.Select(rasp.indices, rasp.indices, lambda k, q: q == k + offset)
  behind = behind.named(f"select_shift_by({offset})[{sop.label}]")
  return rasp.Aggregate(behind, sop, default=None).named(f"shift_by({offset})[{sop.label}]")


def detect_pattern(sop: rasp.SOp, pattern: Sequence[Any]) -> rasp.SOp:
  """True at ``i`` iff ``sop[i − L + 1 .. i]`` equals ``pattern`` (length ``L``); the first
  ``L − 1`` positions are ``None``.

  ``detect_pattern(rasp.tokens, "abc")("abcabc") == [None, None, True, False, False, True]``."""
  pattern = list(pattern)
  if not pattern:
    raise ValueError(f"`pattern` must have at least one element, got {pattern!r}.")
  L = len(pattern)
  found: Optional[rasp.SOp] = None
  for j, element in enumerate(pattern):
    hit = rasp.Map(lambda x, e=element: x == e, sop).named(f"pattern_hit[{j}]")
    if j != L - 1:
      hit = shift_by(L - 1 - j, hit)
    found = hit if found is None else rasp.SequenceMap(
        lambda a, b: bool(a and b), found, hit).named(f"pattern_upto[{j}]")
  return found.named(f"detect_pattern({pattern})")


def make_nary_sequencemap(f: Callable[..., Any], *sops: rasp.SOp) -> rasp.SOp:
  """``f(sops[0][i], sops[1][i], …)`` at every position, from binary SequenceMaps that
  build the argument tuple and one Map that applies ``f`` (tuple value sets grow as the
  product of the inputs', so compiled models grow too)."""
  if not sops:
    raise ValueError("make_nary_sequencemap needs at least one SOp.")
  args = rasp.Map(lambda x: (x,), sops[0], simplify=False).named("nary_args[0]")
  for j, s in enumerate(sops[1:], start=1):
    args = rasp.SequenceMap(lambda t, y: t + (y,), args, s).named(f"nary_args[{j}]")
  return rasp.Map(lambda t: f(*t), args, simplify=False).named("nary_sequencemap")


# ----------------------------------------------------------------------------- beyond tracr


def make_kparity(positions: Sequence[int]) -> rasp.SOp:
  """At every position, the XOR of the bits (tokens 0/1) at the fixed ``positions``; a
  position ``>= n`` counts as bit 0.

  One single-position Aggregate per bit (categorical, ``default=0`` where the position is
  past the end) and a chain of XOR SequenceMaps.
  ``make_kparity((0, 2, 3))([1, 0, 1, 0]) == [0, 0, 0, 0]``."""
  pos = _check_positions(positions)
  bits = []
  for p in pos:
    at_p = rasp.Select(rasp.indices, rasp.indices, lambda k, q, p=p: k == p).named(f"select_bit[{p}]")
    bits.append(rasp.Aggregate(at_p, rasp.tokens, default=0).named(f"bit[{p}]"))
  out = bits[0]
  for j in range(1, len(bits)):
    out = rasp.SequenceMap(lambda a, b: a ^ b, out, bits[j]).named(f"xor{list(pos[:j + 1])}")
  return out.named("kparity")


def make_kparity_count(positions: Sequence[int]) -> rasp.SOp:
  """:func:`make_kparity` by counting: the numerical mean of the bits at ``positions``
  (one Aggregate), times the number ``m`` of those positions inside the input, is the
  number of ones; its parity is the output.

  ``m`` is ``len(positions)`` once ``n > max(positions)``, fewer on shorter inputs, so the
  rounding SequenceMap reads ``length`` (numerical mean × categorical length).
  ``make_kparity_count((0, 2, 3))([1, 0, 1, 1]) == [1, 1, 1, 1]``."""
  pos = _check_positions(positions)
  members = frozenset(pos)
  chosen = rasp.Select(rasp.indices, rasp.indices, lambda k, q: k in members)
  chosen = chosen.named("select_parity_positions")
  ones = rasp.numerical(rasp.Map(lambda x: 1 if x == 1 else 0, rasp.tokens)).named("bits")
  mean = rasp.numerical(rasp.Aggregate(chosen, ones, default=0)).named("bit_mean")

  def parity(frac, size):
    inside = sum(1 for p in pos if p < size)
    return round(frac * inside) % 2

  return rasp.SequenceMap(parity, mean, make_length()).named("kparity_count")


def make_match2(M: int) -> rasp.SOp:
  """Match2 (Sanford, Hsu & Telgarsky 2023): 1 at ``i`` iff some ``j`` (``j = i`` allowed)
  has ``(x[i] + x[j]) % M == 0``, else 0; tokens in ``range(M)``.

  ``make_match2(5)([1, 2, 4]) == [1, 0, 1]``."""
  check_positive_int("M", M)
  partner = rasp.Select(rasp.tokens, rasp.tokens, lambda k, q: (k + q) % M == 0)
  partners = rasp.SelectorWidth(partner.named("match2_selector")).named("match2_partners")
  return rasp.Map(lambda w: 1 if w > 0 else 0, partners).named("match2")


def make_running_sum(sop: rasp.SOp, values: Sequence[int] = (1, 2, 3)) -> rasp.SOp:
  """Numerical prefix sums ``sop[0] + … + sop[i]`` of tokens from ``{0} ∪ values``.

  For each non-zero value ``v``, the count of ``v`` in the prefix is the width of the
  conjunction ``sop[k] == v  and  k <= i`` (one head, the selector ``And`` tracr lacks);
  the counts are combined exactly by LinearSequenceMaps: ``Σ_v v · count_v``. No value set
  grows with the sums, so the model stays small at any N.
  ``make_running_sum(rasp.tokens)([1, 0, 2, 3]) == [1, 1, 3, 6]``."""
  values = [v for v in values if v != 0]
  if not values:
    raise ValueError("`values` must contain a non-zero value.")
  prefix = rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.LEQ).named("running_sum_prefix")
  counts = []
  for v in values:
    is_v = rasp.Select(sop, sop, lambda k, q, v=v: k == v).named(f"running_is_{v}")
    both = rasp.And(is_v, prefix).named(f"running_sel_{v}")
    counts.append((v, rasp.numerical(rasp.SelectorWidth(both)).named(
        f"running_count_{v}")))
  if len(counts) == 1:
    v, c = counts[0]
    return rasp.numerical(rasp.Map(lambda x, v=v: v * x, c)).named("running_sum")
  (v0, c0), (v1, c1) = counts[:2]
  total = rasp.numerical(rasp.LinearSequenceMap(c0, c1, v0, v1)).named("running_sum_2")
  for i, (v, c) in enumerate(counts[2:]):
    total = rasp.numerical(rasp.LinearSequenceMap(total, c, 1, v)).named(f"running_sum_{i + 3}")
  return total.named("running_sum")


def make_transpose(rows: int, cols: int) -> rasp.SOp:
  """A ``rows × cols`` matrix of tokens in row-major order → its ``cols × rows`` transpose
  in row-major order: output position ``i = c·rows + r`` reads input ``r·cols + c``.

  Defined on every length: an output position whose source ``r·cols + c`` is ``>= n``, or
  that is itself ``>= rows·cols``, selects nothing and is ``None``.
  ``make_transpose(2, 3)("abcdef") == list("adbecf")``."""
  check_positive_int("rows", rows)
  check_positive_int("cols", cols)
  size = rows * cols

  def source(i):
    return (i % rows) * cols + i // rows if i < size else -1

  src = rasp.Map(source, rasp.indices).named("transpose_source")
  gather = rasp.Select(rasp.indices, src, rasp.Comparison.EQ).named("transpose_selector")
  return rasp.Aggregate(gather, rasp.tokens).named("transpose")

