"""rasp_fuzz: random RASP programs over the whole DSL compiled and compared with the interpreter, the
simulator's machine and tracr's interpreter (jaxmem/rasp/fuzz.py; jaxmem/experiments/simulator/rasp_fuzz.py).

Quick (2 CPU cores, ~3 minutes): jaxmem reproduce --quick --only rasp_fuzz --out reports/quick
Full (2 CPU cores, ~25 minutes): jaxmem reproduce --only rasp_fuzz --out reports/full
Override a field:                --config.rasp_fuzz.programs=1000 --config.rasp_fuzz.seed=1
Expected: 0 wrong, 0 crashes; every refusal well under 1 s.
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict(dict(
      seed=0,
      programs=5000,          # programs start .. start + programs - 1 of the seed
      start=0,
      workers=0,              # processes; 0: one per CPU core
      timeout_s=20.0,         # a compile past this is a crash ("hang")
      max_exhaustive=128,     # every input of the lengths 1..L whose count stays <= this
      n_random=24,            # plus random inputs up to max_seq_len
      machine_every=1,        # the simulator's machine on every k-th program (0: never)
      tracr=True,             # tracr's interpreter too, when tracr-pypi is installed
      shrink=12,              # failure classes reduced to a minimal reproducer (0: none)
      fast_xla=True,          # workers' XLA set for compile time (jaxmem.rasp.fuzz.FAST_XLA_FLAGS)
  ))
  if arg == "quick":
    c.update(programs=300, shrink=6)
  elif arg not in (None, "full"):
    raise ValueError(f"simulator_rasp_fuzz config variant must be 'quick', 'full' or omitted, got {arg!r}.")
  return c
