"""Rematerialisation policies (``jax.checkpoint``), chosen by name in a model config.

With ``remat=True`` each block (Transformer) or depth step (UniMatrix) is recomputed in the backward
pass, and ``remat_policy`` says what it may keep instead of recomputing:

============================ ===============================================================
``remat_policy``             saved from the forward pass
============================ ===============================================================
``"full"``                   nothing (``nothing_saveable``): least memory, one extra forward
``"dots"``                   matmul outputs without batch dimensions, i.e. the projections
                             (``dots_with_no_batch_dims_saveable``, MaxText's ``"minimal"``)
``"mixer"``                  each mixer's output (named ``"mixer_out"``): the memory read, the
                             sequential part that is costly to redo at long T, is kept; norms,
                             projections and the FFN are recomputed
``"mixer_and_dots"``         both of the above
============================ ===============================================================
"""

from __future__ import annotations

import jax
from jax.ad_checkpoint import checkpoint_name

MIXER_OUT = "mixer_out"

_cp = jax.checkpoint_policies
REMAT_POLICIES = {
    "full": _cp.nothing_saveable,
    "dots": _cp.dots_with_no_batch_dims_saveable,
    "mixer": _cp.save_only_these_names(MIXER_OUT),
    "mixer_and_dots": _cp.save_from_both_policies(_cp.dots_with_no_batch_dims_saveable,
                                                  _cp.save_only_these_names(MIXER_OUT)),
}


def check_remat_policy(owner: str, value) -> None:
  if value not in REMAT_POLICIES:
    raise ValueError(f"{owner}.remat_policy must be one of {sorted(REMAT_POLICIES)}, got {value!r}.")


def policy(name: str):
  return REMAT_POLICIES[name]


def name_mixer_output(y: jax.Array) -> jax.Array:
  """Tags a mixer's output so the ``"mixer"`` policies can keep it (the identity otherwise)."""
  return checkpoint_name(y, MIXER_OUT)
