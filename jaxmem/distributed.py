"""Multi-process runs with JAX's own runtime (``jax.distributed``): start-up, who logs, agreement.

Every process of a run (one per TPU host, or several on one machine) runs the same command. With
``JAXMEM_DISTRIBUTED=1`` (set by ``tpu_scripts/launch.sh``) or ``jaxmem train --distributed``,
:func:`initialize` calls ``jax.distributed.initialize()``:

* on TPU VMs / pod slices (and SLURM, ...) with no arguments: JAX finds the coordinator itself;
* elsewhere from ``JAXMEM_COORDINATOR`` (``host:port``), ``JAXMEM_NUM_PROCESSES`` and
  ``JAXMEM_PROCESS_ID``; on CPU the collectives between processes go through gloo. This is how the
  test suite runs two processes × four CPU devices on one machine, exactly as two hosts would.

After that ``jax.devices()`` lists every process's devices, a mesh over them spans the processes,
and each process feeds only its own devices' rows of a batch
(``jax.make_array_from_process_local_data``). Only process 0 writes logs, metrics and reports
(:func:`is_main`); orbax checkpoints are written and restored by all processes together.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import jax
import numpy as np

ENV_FLAG = "JAXMEM_DISTRIBUTED"


def requested() -> bool:
  value = os.environ.get(ENV_FLAG, "")
  if value not in ("", "0", "1"):
    raise ValueError(f"{ENV_FLAG} must be 1 (multi-process) or 0 / unset, got {value!r}.")
  return value == "1"


def _env_int(name: str, lo: int) -> int:
  value = os.environ.get(name)
  try:
    out = int(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be an integer, got {value!r}.") from None
  if out < lo:
    raise ValueError(f"{name} must be at least {lo}, got {out}.")
  return out


def initialize(force: bool = False) -> bool:
  """Calls ``jax.distributed.initialize`` if asked (``force`` or ``$JAXMEM_DISTRIBUTED=1``).

  Returns whether it did. Idempotent. Bad ``JAXMEM_*`` variables raise a ValueError naming them.
  """
  if not (force or requested()):
    return False
  if jax.distributed.is_initialized():
    return True
  kwargs: dict = {}
  coordinator = os.environ.get("JAXMEM_COORDINATOR")
  if coordinator:
    n = _env_int("JAXMEM_NUM_PROCESSES", 1)
    pid = _env_int("JAXMEM_PROCESS_ID", 0)
    if pid >= n:
      raise ValueError(f"JAXMEM_PROCESS_ID={pid} must lie in [0, JAXMEM_NUM_PROCESSES={n}).")
    kwargs = dict(coordinator_address=coordinator, num_processes=n, process_id=pid)
    if os.environ.get("JAXMEM_LOCAL_DEVICES"):
      kwargs["local_device_ids"] = list(range(_env_int("JAXMEM_LOCAL_DEVICES", 1)))
    if os.environ.get("JAXMEM_INIT_TIMEOUT_S"):
      kwargs["initialization_timeout"] = _env_int("JAXMEM_INIT_TIMEOUT_S", 1)
  # CPU devices of different processes talk through gloo (no effect on TPU / GPU collectives)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs)
  return True


def is_main() -> bool:
  """Process 0: the one that logs, writes metrics and reports."""
  return jax.process_index() == 0


def fingerprint(obj: Any) -> str:
  """A stable hash of a JSON-able config (dict keys sorted)."""
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def check_same_config(obj: Any, what: str = "config") -> None:
  """Raises a ValueError on every process unless all processes hold the same ``obj``.

  A no-op in a single-process run. (Processes that train different configs would otherwise
  deadlock in a collective or silently average different models.)
  """
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils
  digest = np.frombuffer(bytes.fromhex(fingerprint(obj)), np.uint8).astype(np.int32)
  everyone = np.asarray(multihost_utils.process_allgather(digest))  # [processes, 32]
  differ = [p for p in range(everyone.shape[0]) if not np.array_equal(everyone[p], everyone[0])]
  if differ:
    raise ValueError(
        f"the processes disagree on the {what}: processes {differ} differ from process 0 "
        f"(this process, {jax.process_index()}, has fingerprint {fingerprint(obj)[:12]}). Launch every "
        "process with the same command and config overrides."
    )


def barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
