"""jaxmem: the Transformer as a memory system, in JAX/Flax."""

__version__ = "0.1.0"
