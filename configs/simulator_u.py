"""simulator_u: the universal simulator U(T, X) against T(X) computed directly, for random
single-layer attention and encoder layers T; the exact constructions against jnp
(docs/papers/simulator.md; jaxmem/experiments/simulator/simulator_u.py).

Quick (2 CPU cores, ~1 min):  jaxmem reproduce --quick --only simulator_u --out reports/quick
Full (2 CPU cores, ~20 min): jaxmem reproduce --only simulator_u --out reports/full
Override a field:             --config.simulator_u.trials=3
Expected: rel error ≤ 1e-5, and with saturating scores (logits of order 10³) within a small multiple of
float32 attention's own error against float64 (see jaxmem/simulator/README.md, "Measured error").
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict(dict(
      max_len=16,
      d_model=8,
      heads=(1, 2, 4),
      head_dim=4,
      n_values=(1, 2, 4, 8, 16),
      trials=10,
      ffn_dim=16,
      saturating_scale=30.0,
      seed=0,
  ))
  if arg == "quick":
    c.update(max_len=8, d_model=5, heads=(1, 2), n_values=(1, 2, 4, 8), trials=3, ffn_dim=7)
  elif arg not in (None, "full"):
    raise ValueError(f"simulator_u config variant must be 'quick', 'full' or omitted, got {arg!r}.")
  return c
