"""Experiments of the sDNC paper (``docs/papers/sdnc.md``): DNC vs Transformer vs hybrids."""
