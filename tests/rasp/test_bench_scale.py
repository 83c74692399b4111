"""`jaxmem bench rasp`'s scale table (jaxmem/bench/rasp.py) at the smallest size: a compiled row holds the
model's own sizes and an exact check, a refused row the compiler's message, tracr's published point its note."""

from jaxmem import rasp
from jaxmem.bench import rasp as bench
from jaxmem.rasp import programs


def test_scale_rows_hold_the_compiled_sizes_and_refusals():
  rows = bench.scale_rows(("length", "reverse"), (5,), inputs={5: 6})
  assert [r[:2] for r in rows] == [["length", 5], ["reverse", 5]]
  for name, row in zip(("length", "reverse"), rows, strict=True):
    spec = programs.PROGRAMS[name]
    m = rasp.compile(spec.build(5), sorted(spec.vocab, key=repr), 5)
    assert row[2:6] == [m.num_layers, m.num_heads, m.residual_width, m.num_params]
    assert row[6] > 0 and row[7:] == [6, 0]
  (refused,) = bench.scale_rows(("reverse",), (80,), inputs={80: 1}, max_params=1000)
  assert refused[:2] == ["reverse", 80] and "more than max_params=1,000" in refused[2]
  text = bench.scale_table(rows + [refused, ["reverse", 80, 3, 1, 330, 430_812, 0.08, 300, 0]])
  assert f"| length | 5 | {rows[0][2]} | {rows[0][3]} | {rows[0][4]} | {rows[0][5]:,} |" in text
  assert "| reverse | 80 | — | — | — | — | — | — | refused after" in text
  assert "| reverse | 80 | 3 | 1 | 330 | 430,812 | 0.08 | 0 / 300 | tracr: 26.7M params, 372 s |" in text
