"""assoc_capacity: recall error and threshold capacity of Hebb / delta memories vs n and d_k
(docs/papers/pavlovian.md, result 1; jaxmem/experiments/pavlovian/capacity.py).

Quick (2 CPU cores, < 60 s): jaxmem reproduce --quick --only assoc_capacity --out reports/quick
Full:                        jaxmem reproduce --only assoc_capacity --out reports/full
Override a field:            --config.assoc_capacity.trials=16
Expected (quick): log-log slopes of n* vs d_k (average/worst) — hebb: fidelity 1.11/0.79,
accuracy 1.92/1.60; delta: fidelity 1.07/0.50, accuracy 1.38/1.24 (theory: 1 / 0.5).
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict(dict(
      d_ks=(16, 32, 64, 128, 256),  # key (= value) widths
      rules=("hebb", "delta"),
      trials=32,
      n_max_ratio=2,                # store up to n_max = ratio · d_k pairs
      points_per_dk=32,             # probe every max(1, d_k // points_per_dk) pairs
      seed=0,
  ))
  if arg == "quick":
    c.update(d_ks=(16, 32, 64), trials=8)
  elif arg not in (None, "full"):
    raise ValueError(f"pavlovian_capacity config variant must be 'quick', 'full' or omitted, got {arg!r}.")
  return c
