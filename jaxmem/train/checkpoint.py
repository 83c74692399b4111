"""Orbax checkpointing: the train state plus JSON metadata (data-iterator position)."""

from __future__ import annotations

import pathlib
from typing import Any, Optional

import orbax.checkpoint as ocp


class Checkpointer:
  """Saves ``{state, meta}`` at chosen steps, keeps the last ``keep``; restores the latest.

  Saving is asynchronous (the device-to-host copy happens before ``save`` returns, the
  disk write after); a run killed mid-write leaves only a temporary folder, which Orbax
  ignores, so the previous complete checkpoint is what a restart resumes from.
  """

  def __init__(self, directory: str | pathlib.Path, *, keep: int):
    self.directory = pathlib.Path(directory).resolve()
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, meta: dict) -> None:
    self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        force=True,
    )

  def restore(self, step: int, target: Any) -> tuple[Any, dict]:
    """Restores into the structure, dtypes and shardings of ``target``."""
    out = self._manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
        ),
    )
    return out["state"], dict(out["meta"])

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
