"""assoc_error_propagation: multi-hop recall through L stacked Hebbian circuits with H redundant
heads vs r* ∝ L·(n/d_k)^H (docs/papers/pavlovian.md, result 2;
jaxmem/experiments/pavlovian/error_propagation.py).

Quick (2 CPU cores, < 40 s): jaxmem reproduce --quick --only assoc_error_propagation --out reports/quick
Full:                        jaxmem reproduce --only assoc_error_propagation --out reports/full
Override a field:            --config.assoc_error_propagation.depth=8
Expected (quick): 4/5 shape expectations hold: error grows with depth (20/20), linear where
unsaturated (5/5), falls with heads (18/18); the fifth, a base of n/d_k, fails by construction
(the measured per-head factor is set by d_k/n).
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict(dict(
      d_k=64,                         # key (= value) width
      ratios=(0.5, 1.0, 2.0, 4.0, 8.0),  # n / d_k
      heads=(1, 2, 4),
      depth=6,                        # L_max; every L = 1..depth is measured
      trials=32,
      seed=0,
  ))
  if arg == "quick":
    c.update(d_k=32, trials=16)
  elif arg not in (None, "full"):
    raise ValueError(
        f"pavlovian_error_propagation config variant must be 'quick', 'full' or omitted, got {arg!r}.")
  return c
