"""The generic training loop: pure jitted step, data parallel, checkpoint and resume.

``train(task, cfg, workdir)`` trains any NNX model given

* ``task.init_model(rngs)`` -> the module (its ``nnx.Param`` leaves are trained; the
  counters of its random streams (``nnx.RngCount``, e.g. an ``nnx.Dropout``'s) advance with
  every step and are checkpointed, so each step draws fresh masks and a resumed run draws
  the same ones; any other state is held constant);
* ``task.loss_fn(model, batch)`` -> ``(scalar loss, dict of scalar metrics)``;
* ``task.train_iter``: an iterator of numpy batches with ``get_state``/``set_state``
  (e.g. :class:`jaxmem.data.RandomWindows`, :class:`jaxmem.data.KeyedBatches`; anything else,
  a plain generator included, is refused at start: :func:`check_train_iter`); in a multi-process
  run it yields this process's rows of each global batch and has a ``process_count`` attribute
  saying so;
* optionally ``task.evaluate(model, step)`` -> dict of host metrics (e.g. val bpb).

What the loop guarantees (each is a test in tests/train/):

* **Data × model parallel** over ``jax.devices()`` (every process's): a ``(data, model)`` mesh
  (:mod:`jaxmem.sharding`; ``cfg.model_axis`` sets the ``model`` size). Batches are split over
  ``data``; parameters and optimizer state are laid out by logical axes (heads and FFN hidden over
  ``model``, the rest replicated). The same code runs on one CPU or a TPU pod slice; on a
  ``(data=2, model=4)`` mesh of 8 fake CPU devices it matches the 1-device run.
* **Multi-process** (after :func:`jaxmem.distributed.initialize`): each process feeds its own
  devices' rows of the global batch; checkpoints are written and restored by all processes; only
  process 0 writes ``metrics.jsonl`` and shows progress; processes holding different train configs
  stop with a ValueError.
* **Float32 state**: parameters, gradients, optimizer state and the loss are float32 whatever
  the model computes in (``TransformerConfig.dtype="bfloat16"`` is the mixed-precision switch).
* **Automatic resume**: if ``workdir/checkpoints`` holds a checkpoint, the latest one
  restores parameters, optimizer state, step and the data-iterator position, so that
  training 2N steps in one run equals N steps, a restart, and N more.
* **Divergence stops cleanly**: a non-finite loss or gradient raises
  :class:`NonFiniteLossError` before that state is ever saved; the last good checkpoint
  is kept.
* Metrics go to ``workdir/metrics.jsonl`` (rows after the restored step are dropped on
  resume, so the file never holds two histories); a tqdm bar shows steps/s and ETA. Each
  training row also holds ``lr``, the rate of the update that produced its step (the schedule
  of :func:`make_schedule` at update ``step - 1``, evaluated on the host), and ``tokens_per_s``,
  the global batches' tokens (:func:`batch_tokens`) since the previous row over the wall time
  since then (a call's first row includes compilation). With ``cfg.tensorboard`` the rows'
  scalars also go to ``workdir/tb`` as TensorBoard events (``tensorboardX``).
* The loss sees the module in train mode (``.train()``: dropout on), ``task.evaluate`` and
  the returned model see a copy in eval mode (``.eval()``: dropout off).

The host reads step ``t``'s metrics only after dispatching step ``t + 1`` (except at
save / eval points), so on an accelerator the device never waits for the host.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import numbers
import os
import pathlib
import threading
import time
import warnings
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem import distributed, sharding
from jaxmem.train.checkpoint import Checkpointer
from jaxmem.train.config import TrainConfig


class NonFiniteLossError(FloatingPointError):
  """Training produced a NaN/Inf loss or gradient; the last good checkpoint is kept."""


@dataclasses.dataclass
class TrainTask:
  init_model: Callable[[nnx.Rngs], nnx.Module]
  loss_fn: Callable[[nnx.Module, dict], tuple]
  train_iter: Any
  evaluate: Optional[Callable[[nnx.Module, int], dict]] = None


@dataclasses.dataclass
class TrainResult:
  model: nnx.Module
  step: int
  resumed_from: Optional[int]
  history: list
  final_metrics: dict
  wall_s: float


def prepare_workdir(workdir: str | os.PathLike) -> pathlib.Path:
  """Creates ``workdir`` and proves it is writable, else a ValueError naming it."""
  path = pathlib.Path(workdir).expanduser().resolve()
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".jaxmem_write_probe.{jax.process_index()}.{os.getpid()}"
    probe.write_text("ok")
    probe.unlink()
  except OSError as e:
    raise ValueError(f"`workdir` {str(path)!r} is not writable: {e.strerror or e}.") from None
  return path


def make_mesh(devices: Optional[list] = None, model: int = 1) -> Mesh:
  """The ``(data, model)`` mesh of :func:`jaxmem.sharding.make_mesh`."""
  return sharding.make_mesh(model=model, devices=devices)


# the TrainConfig fields the optimizer is built from (and nothing else): runs that agree on them share one
# optimizer object, hence one compiled step
OPTIMIZER_FIELDS = ("lr", "warmup_steps", "n_steps", "min_lr_ratio", "grad_clip", "b1", "b2", "weight_decay")


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """AdamW with linear warmup, cosine decay to ``lr * min_lr_ratio``, global-norm clipping.

  The same object for every config with the same :data:`OPTIMIZER_FIELDS` (so seeds and resumed runs
  reuse one compiled train step)."""
  return _optimizer(*(getattr(cfg, f) for f in OPTIMIZER_FIELDS))


def make_schedule(cfg: TrainConfig) -> optax.Schedule:
  """The learning-rate schedule of :func:`make_optimizer`: optimizer update count -> lr (the update that
  produces step ``s`` uses ``schedule(s - 1)``). The very object the optimizer holds."""
  return _schedule(cfg.lr, cfg.warmup_steps, cfg.n_steps, cfg.min_lr_ratio)


@functools.lru_cache(maxsize=64)
def _schedule(lr, warmup_steps, n_steps, min_lr_ratio):
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=lr, warmup_steps=warmup_steps,
      decay_steps=n_steps, end_value=lr * min_lr_ratio,
  )


def _host_value(schedule: optax.Schedule, count: int) -> float:
  """``schedule(count)`` computed on this host's CPU (never queued behind a train step on an accelerator)."""
  try:
    device = jax.local_devices(backend="cpu")[0]
  except RuntimeError:   # a platform list without the CPU backend
    device = jax.local_devices()[0]
  with jax.default_device(device):
    return float(schedule(count))


@functools.lru_cache(maxsize=64)
def _optimizer(lr, warmup_steps, n_steps, min_lr_ratio, grad_clip, b1, b2, weight_decay):
  schedule = _schedule(lr, warmup_steps, n_steps, min_lr_ratio)
  parts = []
  if grad_clip > 0:
    parts.append(optax.clip_by_global_norm(grad_clip))
  parts.append(optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay, mask=sharding.decay_mask))
  return optax.chain(*parts)


def make_train_step(graphdef, loss_fn, tx) -> Callable:
  """The pure step ``(state, batch, rest) -> (state, metrics)``; ``state = {step, params, opt_state}``, plus
  ``rngs`` (the model's ``nnx.RngCount`` counters, advanced by the loss's random draws) when it has any;
  ``graphdef`` and ``rest`` come from ``nnx.split(model, nnx.Param, nnx.RngCount, ...)`` (``rest``: the
  module's other state, held constant; an argument, not a constant baked into the program, so that one
  compiled step serves every model of the same structure). (A model with random streams split as
  ``nnx.split(model, nnx.Param, ...)`` would keep its counters in ``rest``, which the step cannot update:
  flax raises ``TraceContextError``.) The loss is taken in float32."""
  def step(state, batch, rest):
    def objective(params):
      # fresh Variables at this trace level (the counters are mutated by the loss's draws)
      counters = jax.tree.map(lambda x: x, state.get("rngs", nnx.State({})))
      model = nnx.merge(graphdef, params, counters, rest)
      loss, aux = loss_fn(model, batch)
      return loss.astype(jnp.float32), (aux, nnx.state(model, nnx.RngCount))

    (loss, (aux, rngs)), grads = jax.value_and_grad(objective, has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}
    new = {"step": state["step"] + 1, "params": params, "opt_state": opt_state}
    if "rngs" in state:
      new["rngs"] = rngs
    return new, metrics
  return step


_STEP_CACHE: collections.OrderedDict = collections.OrderedDict()
_STEP_CACHE_SIZE = 16


def compiled_train_step(graphdef, loss_fn, tx, state_sharding, data_sharding, replicated) -> Callable:
  """``jax.jit`` of :func:`make_train_step`, one per (model structure, loss, optimizer, layout).

  ``jax.jit`` caches compiled programs per function object; a fresh closure per :func:`train` call would
  trace and compile the same step again for every seed, resume or repeated run. Here the jitted step is
  kept (the last :data:`_STEP_CACHE_SIZE` of them) under a key of everything the program depends on: the
  graph definition (the model's structure and static config), ``loss_fn`` and ``tx`` (by identity:
  :func:`make_optimizer` returns one object per optimizer config; pass module-level or value-hashable
  losses) and the shardings. Array shapes and dtypes are jit's own key."""
  key = (graphdef, loss_fn, tx, jax.tree.structure(state_sharding), tuple(jax.tree.leaves(state_sharding)),
         data_sharding, replicated)
  jitted = _STEP_CACHE.get(key)
  if jitted is None:
    jitted = jax.jit(
        make_train_step(graphdef, loss_fn, tx),
        in_shardings=(state_sharding, data_sharding, replicated),   # rest: replicated
        out_shardings=(state_sharding, replicated),                  # metrics: replicated
        donate_argnums=(0,),
    )
    _STEP_CACHE[key] = jitted
    while len(_STEP_CACHE) > _STEP_CACHE_SIZE:
      _STEP_CACHE.popitem(last=False)
  else:
    _STEP_CACHE.move_to_end(key)
  return jitted


class _MetricsLog:
  """JSON-lines metrics; on resume, drops rows past the restored step. ``tb``: a TensorBoard writer that
  also gets each row's numbers (but its step and time) as scalars."""

  def __init__(self, path: pathlib.Path, resume_step: int, *, writes: bool = True, tb: Any = None):
    self.path, self.writes, self.tb = path, writes, tb
    # other processes never read the file process 0 is rewriting: their history starts empty
    rows = read_metrics(path) if writes and path.exists() else []
    kept = [r for r in rows if r.get("step", 0) <= resume_step]
    if writes:
      with open(path, "w") as f:
        for r in kept:
          f.write(json.dumps(r) + "\n")
    self.rows = kept

  def write(self, row: dict) -> None:
    self.rows.append(row)
    if not self.writes:  # processes other than 0 keep the history but write nothing
      return
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    if self.tb is not None:
      for k, v in row.items():
        if k not in ("step", "time_s") and isinstance(v, numbers.Real) and not isinstance(v, bool):
          self.tb.add_scalar(k, v, row["step"])


def _check_rows_are_this_process_block(data_sharding, rows: int, proc: int, n_proc: int) -> None:
  """The batch iterators give process ``p`` rows ``[p·L, (p+1)·L)`` of the global batch (``L = rows /
  n_proc``); the mesh must place exactly those rows on its devices."""
  idx = data_sharding.addressable_devices_indices_map((rows,))
  starts = sorted({(s[0].start or 0) for s in idx.values()})
  stops = sorted({(s[0].stop if s[0].stop is not None else rows) for s in idx.values()})
  local = rows // n_proc
  if starts[0] != proc * local or stops[-1] != (proc + 1) * local:
    raise ValueError(
        f"the mesh places rows [{starts[0]}, {stops[-1]}) of the batch on process {proc}'s devices, but "
        f"this process feeds rows [{proc * local}, {(proc + 1) * local}): build the mesh with "
        "jaxmem.sharding.make_mesh, which keeps each process's devices contiguous along `data`."
    )


def read_metrics(path: str | os.PathLike) -> list:
  rows = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line:
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError:  # a run killed mid-write leaves at most one torn line
          continue
  return rows


@functools.partial(jax.jit, static_argnums=(0, 1))
def _apply(graphdef, fn, state, *args):
  return fn(nnx.merge(graphdef, state), *args)


def apply_model(fn: Callable, model: nnx.Module, *args):
  """``fn(model, *args)``, jitted and compiled once per (model structure, ``fn``, argument shapes).

  For evaluation helpers that run a model over many batches or are called once per run: a ``jax.jit``
  closure built inside the helper would be a new function on every call and compile again. ``fn`` is part
  of the compilation key, so it must be a stable, hashable callable (a module-level function, not a lambda
  made per call). The model's state is read, not updated (eval-mode models: no random draws)."""
  graphdef, state = nnx.split(model)
  return _apply(graphdef, fn, state, *args)


def _to_host(metrics: dict) -> dict:
  return {k: float(v) for k, v in jax.device_get(metrics).items()}


def check_train_iter(train_iter: Any) -> None:
  """Raises a ValueError unless ``train_iter`` has what :func:`train` uses: ``next()`` for batches,
  ``get_state()`` to checkpoint its position and ``set_state()`` to restore it on resume."""
  missing = [m for m in ("__next__", "get_state", "set_state") if not callable(getattr(train_iter, m, None))]
  if missing:
    raise ValueError(
        f"`task.train_iter` ({type(train_iter).__name__}) lacks {', '.join(missing)}: train() draws each batch "
        "with next(), saves the iterator's position with get_state() in every checkpoint and restores it with "
        "set_state() on resume. Use jaxmem.data.RandomWindows (random windows of a token stream) or "
        "jaxmem.data.KeyedBatches (a pure fn(key, **kwargs) -> NamedTuple of arrays), or give your iterator "
        "__next__, get_state() -> dict and set_state(dict).")


def batch_tokens(batch: dict) -> int:
  """The tokens in a batch: rows × time of its sequence array (``inputs``, else ``observations``, else
  ``mask``, ``[B, T, ...]``); one per row when none has a time axis."""
  for key in ("inputs", "observations", "mask"):
    x = batch.get(key)
    if x is not None and np.ndim(x) >= 2:
      return int(np.shape(x)[0]) * int(np.shape(x)[1])
  x = next((v for v in batch.values() if np.ndim(v) >= 1), None)
  return int(np.shape(x)[0]) if x is not None else 1


def _tensorboard_writer_class() -> Any:
  try:
    from tensorboardX import SummaryWriter
  except ImportError:
    raise ValueError(
        "TrainConfig.tensorboard=True needs the tensorboardX package, which is not installed: "
        "pip install 'jaxmem[tensorboard]' (or set tensorboard=False)."
    ) from None
  return SummaryWriter


def _pause(step: int, ckpt: Checkpointer) -> None:
  """``JAXMEM_TEST_PAUSE_AT_STEP``: commits the checkpoints, says so on stdout and blocks until killed."""
  ckpt.wait()
  print(f"jaxmem: paused at step {step} (JAXMEM_TEST_PAUSE_AT_STEP)", flush=True)
  threading.Event().wait()


def train(
    task: TrainTask,
    cfg: TrainConfig,
    workdir: str | os.PathLike,
    *,
    stop_after: Optional[int] = None,
    progress: bool = True,
    devices: Optional[list] = None,
) -> TrainResult:
  """Trains ``task`` for ``cfg.n_steps`` steps in ``workdir``, resuming if it can.

  Args:
    stop_after: stop after this many steps *of this call* (simulates preemption; the
      schedule still spans ``cfg.n_steps``). A final checkpoint is written.
    progress: show a tqdm progress bar.
    devices: the mesh's devices (default: all, every process's); ``cfg.model_axis`` of them form
      the ``model`` axis, the rest the ``data`` axis.
  """
  t0 = time.perf_counter()
  check_train_iter(task.train_iter)
  tb_writer = _tensorboard_writer_class() if cfg.tensorboard else None
  distributed.check_same_config(dataclasses.asdict(cfg), "train config")
  workdir = prepare_workdir(workdir)
  mesh = make_mesh(devices, cfg.model_axis)
  n_data = mesh.shape[sharding.DATA]
  if n_data % jax.process_count():
    raise ValueError(
        f"the mesh's data axis ({n_data}) must be a multiple of the {jax.process_count()} processes, so that "
        f"each process feeds whole rows of the batch: lower `model_axis` ({cfg.model_axis}).")
  if jax.process_count() > 1 and (getattr(task.train_iter, "process_count", 1) != jax.process_count()
                                  or getattr(task.train_iter, "process_index", None) != jax.process_index()):
    raise ValueError(
        f"`task.train_iter` must give each of the {jax.process_count()} processes its own rows of the global "
        "batch and say so with `process_count` and `process_index` attributes (e.g. jaxmem.data.RandomWindows("
        "..., process_index=jax.process_index(), process_count=jax.process_count())); otherwise processes "
        "would feed the same rows.")
  main = distributed.is_main()
  replicated = NamedSharding(mesh, P())
  data_sharding = NamedSharding(mesh, P(sharding.DATA))

  model = task.init_model(nnx.Rngs(cfg.seed))
  model.train()   # the loss runs in train mode (dropout on), whatever mode init_model left
  graphdef, params, rngs, rest = nnx.split(model, nnx.Param, nnx.RngCount, ...)
  bare = sharding.unannotated(params)
  if bare and (cfg.weight_decay > 0 or cfg.model_axis > 1):
    warnings.warn(f"{len(bare)} parameter(s) carry no logical axes ({', '.join(bare[:4])}"
                  f"{', ...' if len(bare) > 4 else ''}): they get no weight decay and are replicated on the "
                  "mesh. Build them with jaxmem.models.layers or jaxmem.sharding.param / with_axes.",
                  stacklevel=2)
  tx = make_optimizer(cfg)
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
  if jax.tree.leaves(rngs):  # only models that draw random numbers (dropout) carry counters
    state["rngs"] = rngs
  state_sharding = sharding.state_shardings(state, mesh)
  state = sharding.put_global(state, state_sharding)
  rest = sharding.put_global(rest, jax.tree.map(lambda _: replicated, rest))

  ckpt = Checkpointer(workdir / "checkpoints", keep=cfg.keep_checkpoints)
  resumed_from = ckpt.latest_step()
  if resumed_from is not None:
    state, meta = ckpt.restore(resumed_from, state)
    task.train_iter.set_state(meta["data"])
  start = int(jax.device_get(state["step"]))
  tb = None
  if tb_writer is not None and main:
    # a resumed run drops the events after its restored step, as the metrics file drops the rows
    tb = tb_writer(str(workdir / "tb"), **({"purge_step": start + 1} if start else {}))
  log = _MetricsLog(workdir / "metrics.jsonl", start, writes=main, tb=tb)
  schedule = make_schedule(cfg)

  jitted = compiled_train_step(graphdef, task.loss_fn, tx, state_sharding, data_sharding, replicated)

  def step_fn(state, batch):
    with jax.set_mesh(mesh):  # the mixers' activation constraints (jaxmem.sharding.constrain) see it
      return jitted(state, batch, rest)

  n_proc, proc = jax.process_count(), jax.process_index()
  checked_rows: set = set()   # global batch sizes whose row placement was checked

  def put_batch(batch: dict) -> dict:
    """This process's rows of the global batch -> a global array sharded over ``data``."""
    out = {}
    for k, v in batch.items():
      v = np.asarray(v)
      rows = v.shape[0] * n_proc
      if rows % n_data:
        raise ValueError(
            f"batch size {rows} (batch[{k!r}]) is not divisible by the {n_data} devices of the mesh's "
            f"data axis."
        )
      if n_proc > 1 and rows not in checked_rows:
        _check_rows_are_this_process_block(data_sharding, rows, proc, n_proc)
        checked_rows.add(rows)
      out[k] = jax.make_array_from_process_local_data(data_sharding, v, (rows,) + v.shape[1:])
    return out

  def current_model() -> nnx.Module:
    """A copy of the module at the current parameters, in eval mode (dropout off)."""
    model = nnx.merge(graphdef, state["params"], state.get("rngs", rngs), rest, copy=True)
    model.eval()
    return model

  end = cfg.n_steps if stop_after is None else min(cfg.n_steps, start + stop_after)
  # test hook: stop dead after this step, its metrics logged and every checkpoint committed, until killed
  # (the tests SIGKILL a run at a known point instead of slowing every step and racing it)
  pause_at = int(os.environ.get("JAXMEM_TEST_PAUSE_AT_STEP", "0") or 0)
  bar = None
  if progress and main:
    from tqdm.auto import tqdm
    bar = tqdm(total=cfg.n_steps, initial=start, unit="step", dynamic_ncols=True,
               desc=pathlib.Path(workdir).name)

  last: dict = {}
  since_log = {"tokens": 0, "t": 0.0}   # tokens fed since the last metrics row, and its time

  def consume(step_done: int, metrics: Any, tokens: int) -> None:
    """Checks and logs the metrics of the update that produced step ``step_done`` (on ``tokens`` tokens)."""
    host = _to_host(metrics)
    if not (math.isfinite(host["loss"]) and math.isfinite(host["grad_norm"])):
      ckpt.wait()
      good = ckpt.latest_step()
      if bar is not None:
        bar.close()
      kept = (f"no checkpoint exists yet in {ckpt.directory}, so a rerun starts from scratch" if good is None
              else f"the last good checkpoint is step {good} in {ckpt.directory}, which a rerun resumes from")
      raise NonFiniteLossError(
          f"non-finite training metrics at step {step_done}: loss={host['loss']}, "
          f"grad_norm={host['grad_norm']}. Stopped without saving this state; {kept}. "
          "Try a lower lr, a longer warmup or grad_clip > 0, and check the inputs (e.g. token ids within "
          "the model's vocab_size, no NaN in the batches)."
      )
    last.update(host)
    since_log["tokens"] += tokens
    if step_done % cfg.log_every == 0 or step_done == end:
      now = time.perf_counter()
      log.write({"step": step_done, **host, "lr": _host_value(schedule, step_done - 1),
                 "tokens_per_s": since_log["tokens"] / max(now - since_log["t"], 1e-9),
                 "time_s": round(now - t0, 3)})
      since_log.update(tokens=0, t=now)
    if bar is not None:
      bar.update(1)
      if step_done % cfg.log_every == 0:
        bar.set_postfix(loss=f"{host['loss']:.4f}", refresh=False)

  pending = None
  _host_value(schedule, start)   # its first evaluation compiles small CPU ops: not inside a timed interval
  since_log["t"] = time.perf_counter()
  try:
    for s in range(start, end):
      host_batch = next(task.train_iter)
      tokens = batch_tokens(host_batch) * n_proc   # the global batch's
      batch = put_batch(host_batch)
      state, metrics = step_fn(state, batch)
      if pending is not None:
        consume(*pending)
        pending = None
      done = s + 1
      do_eval = task.evaluate is not None and (
          (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.n_steps)
      do_save = done % cfg.ckpt_every == 0 or done == end
      if do_eval or do_save:
        consume(done, metrics, tokens)  # synchronous: never save or report an unchecked state
        if do_eval:
          row = {"step": done, **task.evaluate(current_model(), done)}
          log.write(row)
          last.update({k: v for k, v in row.items() if k != "step"})
          if bar is not None:
            bar.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row.items()))
        if do_save:
          ckpt.save(done, state, {"data": task.train_iter.get_state(), "step": done})
      else:
        pending = (done, metrics, tokens)
      if done == pause_at:
        if pending is not None:
          consume(*pending)
          pending = None
        _pause(done, ckpt)
    if pending is not None:
      consume(*pending)
  finally:
    ckpt.close()
    if bar is not None:
      bar.close()
    if tb is not None:
      tb.close()

  final_step = int(jax.device_get(state["step"]))
  return TrainResult(
      model=current_model(), step=final_step, resumed_from=resumed_from, history=log.rows,
      final_metrics=dict(last), wall_s=time.perf_counter() - t0,
  )
