"""assoc_drift: a drifting key→value map written into Hebb / delta / Oja / decay memories
(docs/papers/pavlovian.md, result 3; jaxmem/experiments/pavlovian/drift.py).

Quick (2 CPU cores, < 30 s): jaxmem reproduce --quick --only assoc_drift --out reports/quick
Full:                        jaxmem reproduce --only assoc_drift --out reports/full
Override a field:            --config.assoc_drift.n_periods=4
Expected (quick): 4/4 drift expectations hold (‖S‖_F ∝ t^α: Hebb α = 0.52, Oja α = 0.13;
pre-switch error delta 0.0209 vs Hebb 353).
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict(dict(
      d_k=32,             # key (= value) width
      m=16,               # number of keys (fixed); their values are redrawn every period
      period=200,         # P: steps between redraws of the key→value map
      n_periods=8,
      trials=32,
      record_every=10,    # must divide period
      beta_erase=0.5,     # β for delta and oja
      gamma=0.98,         # γ for decay; its β is 1 − γ^m
      seed=0,
  ))
  if arg == "quick":
    c.update(n_periods=5, trials=8)
  elif arg not in (None, "full"):
    raise ValueError(f"pavlovian_drift config variant must be 'quick', 'full' or omitted, got {arg!r}.")
  return c
