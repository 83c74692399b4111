"""rasp_compile: every jaxmem.rasp.lib program compiled at several N; size, compile time and
exactness against the interpreter, beside tracr's sizes (docs/papers/simulator.md;
jaxmem/experiments/simulator/rasp_compile.py).

Quick (2 CPU cores, minutes): jaxmem reproduce --quick --only rasp_compile --out reports/quick
Full:                         jaxmem reproduce --only rasp_compile --out reports/full
Override a field:             --config.rasp_compile.max_seq_lens=5,10
Expected: 0 wrong outputs at every N.
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict(dict(
      programs=(),                        # empty: every program in jaxmem.rasp.programs.PROGRAMS
      max_seq_lens=(5, 10, 20, 40, 80),
      exhaustive_len=4,                   # every input of length <= 4 is checked
      n_random=2000,                      # plus random inputs of lengths up to N
      max_params=50_000_000,              # larger models are refused and listed as not compiled
      seed=0,
  ))
  if arg == "quick":
    c.update(max_seq_lens=(5, 10, 20), n_random=300)
  elif arg not in (None, "full"):
    raise ValueError(f"simulator_rasp_compile config variant must be 'quick', 'full' or omitted, got {arg!r}.")
  return c
