"""Experiments of the simulator paper (``docs/papers/simulator.md``): ``rasp_compile`` (the
RASP compiler's sizes, compile times and exactness against tracr) and ``simulator_u`` (the
universal simulator U against direct computation)."""
