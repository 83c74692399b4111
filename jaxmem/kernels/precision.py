"""Matmul precision for the kernels, and a CPU emulation of reduced-precision matmuls.

A float32 matmul is not computed in float32 everywhere. At ``jax.lax.Precision.DEFAULT``
a TPU runs one bfloat16 pass (8-bit significand operands, float32 accumulation) and a
recent NVIDIA GPU may use TensorFloat-32 (11-bit significands); ``HIGH`` is bfloat16×3 on
TPU (≈ 16-bit operands) and TF32 on GPU; ``HIGHEST`` is full float32 on both. CPUs
compute float32 at every setting, so a suite that only runs on CPU never sees the
difference. Recurrences (the associative-memory state, the chunked form's triangular
inverse) amplify operand rounding, so jaxmem's memory kernels take an explicit
``precision`` and default to ``"highest"``.

Accepted values (:data:`PRECISIONS`): ``"highest"`` / ``"float32"`` (float32 operands),
``"high"`` / ``"tensorfloat32"`` (see above), ``"default"`` / ``"bfloat16"`` (the
platform's fastest: bf16 on TPU, TF32 or float32 on GPU), a :class:`jax.lax.Precision`,
or ``None`` (whatever ``jax.default_matmul_precision`` says, else the platform default).
The names are JAX's own (``jax.lax.Precision("tensorfloat32") is Precision.HIGH``).

:func:`emulate_matmul_precision` makes the kernels behave on CPU as they would on a
platform whose default matmul precision is bfloat16 (TPU) or TF32 (GPU): it also enters
``jax.default_matmul_precision`` and, while active, rounds the operands of every kernel
matmul to the significand width that platform would use for the matmul's precision
(``lax.reduce_precision``; accumulation stays float32), in the forward pass and in the
gradient's matmuls (the cotangent and the saved operands are rounded, the products are
not, as on the hardware). Tests use it to measure what each precision costs in accuracy
(``jaxmem bench precision`` prints the table) and to check that ``"highest"`` keeps float32
accuracy on every platform. It is read when a kernel is called and passed to the compiled
kernel as a static argument. A user's own ``jax.jit`` around a kernel is not reused across
the context's boundary either: the context sets ``jax_default_matmul_precision``, which is
part of JAX's compilation cache key, so a function traced outside it is traced again inside
it and the reverse (no cache is cleared, so everything compiled elsewhere stays compiled).
The one trace it cannot tell apart is one made under a plain
``jax.default_matmul_precision(platform_default)`` with the same value and no emulation:
such a trace would be reused without the operand rounding. It is a test and measurement
tool, not for production loops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Any, Iterator, Optional

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

PRECISIONS = ("highest", "float32", "high", "tensorfloat32", "default", "bfloat16")
EMULATED_PLATFORMS = ("bfloat16", "tensorfloat32")

# float32 has a 23-bit stored significand; the emulated operand roundings keep:
_BITS = {"bfloat16": 7, "tensorfloat32": 10, "bfloat16_3x": 16}

_state = threading.local()


def check_precision(precision: Any) -> Optional[jax.lax.Precision]:
  """Canonical :class:`jax.lax.Precision` (None stays None); ``ValueError`` names the argument."""
  if precision is None or isinstance(precision, jax.lax.Precision):
    return precision
  if isinstance(precision, str) and precision.lower() in PRECISIONS:
    return jax.lax.Precision(precision.lower())
  raise ValueError(
      f"`precision` must be one of {list(PRECISIONS)}, a jax.lax.Precision or None, got {precision!r}.")


def _emulated() -> Optional[str]:
  stack = getattr(_state, "stack", None)
  return stack[-1] if stack else None


@contextlib.contextmanager
def emulate_matmul_precision(platform_default: str) -> Iterator[None]:
  """Run kernel matmuls on CPU as on a platform whose default precision is ``platform_default``.

  ``"bfloat16"`` models a TPU (DEFAULT: bf16 operands, HIGH: bf16×3 ≈ 16-bit operands),
  ``"tensorfloat32"`` an Ampere+ GPU (DEFAULT and HIGH: TF32). HIGHEST is exact in both.
  Also enters ``jax.default_matmul_precision(platform_default)``.
  """
  if platform_default not in EMULATED_PLATFORMS:
    raise ValueError(f"`platform_default` must be one of {list(EMULATED_PLATFORMS)}, got {platform_default!r}.")
  stack = getattr(_state, "stack", None)
  if stack is None:
    stack = _state.stack = []
  stack.append(platform_default)
  try:
    # part of jit's cache key: no trace made outside the context is reused inside it, nor the reverse
    with jax.default_matmul_precision(platform_default):
      yield
  finally:
    stack.pop()


@dataclasses.dataclass(frozen=True)
class Matmul:
  """A matmul at a fixed precision (hashable: a static argument of jitted kernels).

  ``operand_bits`` (set only under :func:`emulate_matmul_precision`) rounds both operands
  to that many stored significand bits before the float32 product.
  """

  precision: Optional[jax.lax.Precision] = jax.lax.Precision.HIGHEST
  operand_bits: Optional[int] = None

  def _apply(self, fn, *operands):
    if self.operand_bits is None:
      return fn(*operands)
    return _rounded_operands(fn, self.operand_bits)(*operands)

  def __call__(self, a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` (``jnp.matmul`` broadcasting)."""
    return self._apply(functools.partial(jnp.matmul, precision=self.precision), a, b)

  def einsum(self, spec: str, *operands: jax.Array, **kwargs) -> jax.Array:
    return self._apply(functools.partial(jnp.einsum, spec, precision=self.precision, **kwargs), *operands)


def _round(x: jax.Array, bits: int) -> jax.Array:
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return x
  return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=bits)


def _rounded_operands(fn, bits: int):
  """``fn`` (a multilinear matmul) on operands rounded to ``bits``.

  Its JVP is ``Σ_i round(fn(..., tangent_i, ...))`` with the other operands rounded; since
  ``reduce_precision`` transposes to itself, the VJP is then ``fnᵀ(round(cotangent))`` with
  the rounded operands: the transposed matmuls see rounded inputs and accumulate in full
  precision, as the hardware's do (rounding the operands alone would round their outputs).
  """

  @jax.custom_jvp
  def f(*operands):
    return fn(*(_round(x, bits) for x in operands))

  @f.defjvp
  def f_jvp(primals, tangents):
    rounded = [_round(x, bits) for x in primals]
    out = fn(*rounded)
    tangent = None
    for i, t in enumerate(tangents):
      ops = list(rounded)
      ops[i] = t
      term = _round(fn(*ops), bits)
      tangent = term if tangent is None else tangent + term
    return out, tangent

  return f


def matmul_for(precision: Any = "highest") -> Matmul:
  """The :class:`Matmul` a kernel called now with ``precision`` should use (reads the emulation)."""
  p = check_precision(precision)
  platform = _emulated()
  bits = None
  if platform is not None and p != jax.lax.Precision.HIGHEST:
    if p == jax.lax.Precision.HIGH:
      bits = _BITS["bfloat16_3x" if platform == "bfloat16" else "tensorfloat32"]
    else:  # DEFAULT or None: the platform's default
      bits = _BITS[platform]
  return Matmul(p, bits)


def jaxpr_eqns(jaxpr: Any) -> Iterator[Any]:
  """Every equation of a (closed) jaxpr, those of its sub-jaxprs (scan bodies, jit, custom rules) included."""
  for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
    yield eqn
    for sub in jex_core.jaxprs_in_params(eqn.params):
      yield from jaxpr_eqns(sub)


def dot_general_precisions(jaxpr: Any) -> list:
  """The ``precision`` of every ``dot_general`` in a (closed) jaxpr, sub-jaxprs included.

  A test tool: ``jax.make_jaxpr(f)(...)`` of a kernel (or of its gradient) shows whether
  every matmul carries the requested precision.
  """
  return [e.params.get("precision") for e in jaxpr_eqns(jaxpr) if e.primitive.name == "dot_general"]


__all__ = [
    "EMULATED_PLATFORMS", "Matmul", "PRECISIONS", "check_precision", "dot_general_precisions",
    "emulate_matmul_precision", "jaxpr_eqns", "matmul_for",
]
