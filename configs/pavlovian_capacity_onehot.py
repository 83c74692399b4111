"""assoc_capacity_onehot: Schlag et al. 2021's one-hot-value capacity test, with random keys
through elu1 / dpfp1 / dpfp2 and with trained keys (their protocol), measured vs published
(docs/papers/pavlovian.md#schlag-et-al-2021; jaxmem/experiments/pavlovian/capacity_onehot.py).

Quick (2 CPU cores, < 4 min):  jaxmem reproduce --quick --only assoc_capacity_onehot --out reports/quick
Full:                          jaxmem reproduce --only assoc_capacity_onehot --out reports/full
Override a field:              --config.assoc_capacity_onehot.trained.steps=400
Expected (quick): 6/6 shape checks hold; at Schlag et al.'s published points our loss (random
keys, sum norm, best g) minus theirs: +0.312 to +0.474; trained keys: ours minus theirs +0.000
to +0.027; 2/3 trained-key checks hold (README, Results).
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict(dict(
      d_key=64,                       # raw key width (before φ)
      fmaps=("elu1", "dpfp1", "dpfp2"),
      trials=32,
      seg=20,                         # (a) distinct keys: probe every seg stored pairs
      n_max=400,                      # (a): pairs stored at most (= number of distinct values)
      ms=tuple(range(20, 201, 20)),   # (b) overwriting: unique keys in the pool
      writes_per_key=4,               # (b): stream length = writes_per_key · m
      overwrite_rules=("hebb", "delta"),
      eps=0.01,                       # "≈ 0" for the capacity table
      seed=0,
      trained=dict(                   # trained keys, Schlag et al. 2021's protocol
          d_key=64,                   # key width before φ (the paper's d = 64)
          # (setting, rule, φ, S values, batch): the runs of a group (one per S) train together
          groups=(
              ("distinct", "hebb", "elu1", (20, 40, 60, 80, 100), 32),
              ("distinct", "hebb", "dpfp2", (80, 160, 240), 8),
              ("overwrite", "hebb", "dpfp1", (20, 40), 32),
              ("overwrite", "hebb", "dpfp2", (20, 40), 32),
              ("overwrite", "delta", "dpfp1", (20, 60, 100), 8),
              ("overwrite", "delta", "dpfp2", (20, 100, 200), 8),
          ),
          steps=1000,
          lr=1e-2,                    # Adam
          steps_per_call=50,          # training steps per jitted lax.scan call
          eval_seqs=64,               # fresh sequences for the final loss, every key queried
          seed=0,
      ),
  ))
  if arg == "quick":  # trained keys only at the published S, 200 steps
    c.update(trials=4, n_max=320)
    c.trained.update(steps=200, groups=(
        ("distinct", "hebb", "elu1", (40, 60, 80), 32),
        ("distinct", "hebb", "dpfp2", (240,), 8),
        ("overwrite", "hebb", "dpfp1", (20,), 32),
        ("overwrite", "hebb", "dpfp2", (20,), 32),
        ("overwrite", "delta", "dpfp1", (100,), 8),
        ("overwrite", "delta", "dpfp2", (200,), 8),
    ))
  elif arg not in (None, "full"):
    raise ValueError(
        f"pavlovian_capacity_onehot config variant must be 'quick', 'full' or omitted, got {arg!r}.")
  return c
