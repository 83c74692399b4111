"""jaxmem: the Transformer as a memory system, in JAX/Flax."""

__version__ = "0.1.0"


def __getattr__(name):
  # `jaxmem.generate` without importing JAX and the models at `import jaxmem` (the CLI's start-up stays fast)
  if name == "generate":
    from jaxmem.decode import generate
    return generate
  raise AttributeError(f"module 'jaxmem' has no attribute {name!r}")
