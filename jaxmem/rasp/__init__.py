"""RASP: a language for transformer programs, its interpreter, and a compiler to exact
average-hard-attention transformers.

``from jaxmem import rasp`` gives tracr's API (``rasp.tokens``, ``rasp.Map``, ``rasp.Select``,
``rasp.Aggregate``, ``rasp.numerical``, …; see :mod:`jaxmem.rasp.rasp`), the reference
interpreter ``rasp.evaluate(program, inputs)``, and ``rasp.compile(program, vocab,
max_seq_len)`` (see :mod:`jaxmem.rasp.compiler`); tracr's ``compile_rasp_to_model`` (see
:mod:`jaxmem.rasp.compiling`). Programs live in :mod:`jaxmem.rasp.lib`.
"""

from jaxmem.rasp.rasp import *  # noqa: F401,F403
from jaxmem.rasp.rasp import __all__ as _dsl_all

__all__ = list(_dsl_all)

from jaxmem.rasp.compiler import compile  # noqa: E402,A001
from jaxmem.rasp.model import CompiledModel, load  # noqa: E402

__all__ += ["CompiledModel", "compile", "load"]
from jaxmem.rasp import compiling, conformance, lib  # noqa: E402
from jaxmem.rasp.compiling import compile_rasp_to_model  # noqa: E402

__all__ += ["compile_rasp_to_model", "compiling", "conformance", "lib"]
