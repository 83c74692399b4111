"""Rematerialisation policies (``jax.checkpoint``), chosen by name in a model config.

With ``remat=True`` each block (Transformer) or depth step (UniMatrix) is recomputed in the backward
pass, and ``remat_policy`` says what it may keep instead of recomputing:

============================ ===============================================================
``remat_policy``             saved from the forward pass
============================ ===============================================================
``"full"``                   nothing but each block's input (``nothing_saveable``): least
                             memory, one extra forward pass of every block
``"dots"``                   also the matmul outputs without batch dimensions, i.e. the
                             projections and the FFN (``dots_with_no_batch_dims_saveable``);
                             the memory kernels' scans are recomputed
============================ ===============================================================

(A policy that kept a memory kernel's read would not spare its recomputation: the kernel's backward
needs its own internal residuals, so it is rerun either way. That would need named residuals inside
each kernel, which the kernels do not expose.)
"""

from __future__ import annotations

import jax

_cp = jax.checkpoint_policies
REMAT_POLICIES = {
    "full": _cp.nothing_saveable,
    "dots": _cp.dots_with_no_batch_dims_saveable,
}


def check_remat_policy(owner: str, value) -> None:
  if value not in REMAT_POLICIES:
    raise ValueError(f"{owner}.remat_policy must be one of {sorted(REMAT_POLICIES)}, got {value!r}.")


def policy(name: str):
  return REMAT_POLICIES[name]
