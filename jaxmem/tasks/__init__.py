"""Synthetic tasks: pure, jit-able generators keyed by a PRNG key."""
