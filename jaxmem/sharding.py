"""Data × model sharding: a ``(data, model)`` mesh, logical axis names, and the rules between them.

The layout is Megatron's (Shoeybi et al. 2019, arXiv:1909.08053) written as GSPMD shardings:

* **batches** are split over ``data``;
* **heads** are split over ``model``: every memory kernel works per head (the ``vmap`` axis of
  :mod:`jaxmem.kernels` is the head axis), so sharding it runs each head's recurrence on its own
  devices with no communication inside the kernel; the q / k / v projection's output columns and
  the output projection's input rows (both made of whole heads) follow;
* **the FFN hidden units** are split over ``model`` (``up`` by columns, ``down`` by rows);
* everything else (embeddings, norms, positions, per-channel gates) is replicated.

Parameters carry their *logical* axes (``"heads"``, ``"ffn"``, ``"embed"``, ...) as flax partitioning
metadata, attached where they are created (:func:`with_axes` on an initializer, :func:`param` on a value;
both are ``nnx.with_partitioning`` without flax's eager sharding); logical axes map to mesh axes through
:data:`LOGICAL_TO_MESH`. Nothing here knows a particular module's attribute names: a new mixer whose
parameters are annotated is laid out (and weight-decayed, :func:`decays`) with no edit to this file. A
dimension the mesh axis does not divide stays replicated (recorded in :func:`layout_table`), so any model runs
on any mesh; a leading dimension beyond the annotated ones (the layer axis of ``nnx.vmap``-stacked blocks) is
``"layers"``. The names are *logical*, stored in flax's ``out_sharding`` metadata: flax's own helpers
(``nnx.get_partition_spec``) would read them as mesh axis names, so lay models out with
:func:`state_shardings` (or give flax ``nnx.logical_axis_rules`` from :data:`LOGICAL_TO_MESH`). The
optimizer state mirrors the parameter tree, metadata included, and gets the same layout (Adam's ``mu`` /
``nu`` of a sharded matrix are sharded alike).

Activations: :func:`constrain` pins ``[B, T, H, D/H]`` head tensors to ``(data, ·, model, ·)``
inside the mixers when a mesh is set (``jax.set_mesh``), and :func:`map_heads` runs every mixer's
per-head kernel (the QKV mixers' from their base class, the matrix-state and SSD ones by their own call)
inside ``jax.shard_map`` on each device's own batch rows and heads (GSPMD alone all-gathered heads
inside the kernels' scans over time). Both are the identity without a mesh, so the models run unchanged
on one device. What communication is left per layer is Megatron's: an all-reduce after the output
projection and after the FFN, and one all-gather where the fused q / k / v projection (columns laid out
``[3, H, K]``, so a split of its 3·H·K columns is not head-aligned) is reshaped into heads.

Mesh axes are ``AxisType.Auto`` (passed explicitly): the GSPMD partitioner propagates the
parameter and batch shardings, and the constraints above fix the per-head layout. jaxmem's models
are not written for ``AxisType.Explicit`` (sharding in types), which ``make_mesh(axis_types=...)``
allows for user code that is.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA, MODEL = "data", "model"

# logical axis -> mesh axis (None: replicated). Every axis name a parameter may carry is a key here.
LOGICAL_TO_MESH = {
    "batch": DATA,
    "heads": MODEL,   # any dimension made of whole heads: H, H·K or the fused 3·H·K of q, k, v
    "ffn": MODEL,
    "embed": None,
    "vocab": None,
    "length": None,
    "layers": None,
    "head_dim": None,
    "conv": None,     # the taps of a short convolution
    "input": None,    # the features of a continuous (not token) input
    "state": None,    # a memory's own width shared by all heads (e.g. an SSM's state size N)
}

def with_axes(init: Callable, axes: Sequence[Optional[str]], *, decay: Optional[bool] = None) -> Callable:
  """``init`` whose parameter carries the logical ``axes`` (one name or ``None`` per dimension).

  ``nnx.Linear(d, 3 * d, kernel_init=with_axes(init, ("embed", "heads")), ...)``. The metadata is flax's
  (``nnx.with_partitioning``, read by :func:`axes_of`); the value is placed by :func:`state_shardings`
  when training on a mesh, never at creation (no eager sharding), so a module builds the same way with
  or without a mesh. ``decay`` overrides the weight-decay rule of :func:`decays` for this parameter."""
  extra = {} if decay is None else {"weight_decay": _check_decay(decay)}
  return nnx.with_partitioning(init, _check_axes(axes), eager_sharding=False, **extra)


def param(value: jax.Array, axes: Sequence[Optional[str]], *, decay: Optional[bool] = None) -> nnx.Param:
  """``nnx.Param(value)`` carrying the logical ``axes`` (and ``decay``; see :func:`with_axes`)."""
  axes = _check_axes(axes)
  if len(axes) != np.ndim(value):
    raise ValueError(f"{len(axes)} logical axes {axes} for a parameter of shape {np.shape(value)}.")
  extra = {} if decay is None else {"weight_decay": _check_decay(decay)}
  return nnx.Param(value, out_sharding=axes, eager_sharding=False, **extra)


def _check_decay(decay) -> bool:
  if not isinstance(decay, bool):
    raise ValueError(f"`decay` must be None, True or False, got {decay!r}.")
  return decay


def _check_axes(axes) -> tuple:
  axes = tuple(axes)
  bad = [a for a in axes if a is not None and a not in LOGICAL_TO_MESH]
  if bad:
    raise ValueError(f"unknown logical axis name(s) {bad}; known: {sorted(LOGICAL_TO_MESH)} (or None).")
  return axes


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def axes_of(variable) -> Optional[tuple]:
  """The logical axes of a parameter (an ``nnx.Variable``), full rank (``"layers"`` for leading stacked
  dimensions), or ``None`` when it carries none."""
  if not _is_variable(variable):
    return None
  axes = variable.get_metadata().get("out_sharding")
  if axes is None:
    return None
  ndim = len(_shape(variable))
  if len(axes) > ndim:
    raise ValueError(f"a parameter of rank {ndim} carries {len(axes)} logical axes {tuple(axes)}.")
  return ("layers",) * (ndim - len(axes)) + tuple(axes)


def decays(variable) -> bool:
  """Whether weight decay applies to a parameter (an ``nnx.Variable`` with logical axes): its ``decay``
  override if it has one (:func:`with_axes`), else whether it is a matrix, i.e. has two or more dimensions
  besides ``"layers"`` (stacked blocks) and no ``"length"`` axis (positions): projections, embeddings,
  convolution taps × channels, yes; norms, biases, per-head gates' biases and scalars, positions, no.
  Parameters without logical axes are never decayed."""
  axes = axes_of(variable)
  if axes is None:
    return False
  override = variable.get_metadata().get("weight_decay")
  if override is not None:
    return bool(override)
  return "length" not in axes and sum(a != "layers" for a in axes) >= 2


def param_axes(tree: Any) -> Any:
  """The tree with each ``nnx.Variable`` replaced by its logical axes (:func:`axes_of`; ``None`` when it
  carries none) and every other leaf by ``None``: a prefix of the parameter / optimizer state tree."""
  return jax.tree.map(axes_of, tree, is_leaf=_is_variable)


def decay_mask(params: Any) -> Any:
  """The AdamW mask (a prefix of ``params``): :func:`decays` of each parameter."""
  return jax.tree.map(decays, params, is_leaf=_is_variable)


def unannotated(params: Any) -> list:
  """Paths of the parameters that carry no logical axes (laid out replicated, never decayed)."""
  out = []
  for path, v in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_variable):
    if _is_variable(v) and axes_of(v) is None:
      out.append(path_str(path))
  return out


def make_mesh(data: Optional[int] = None, model: int = 1, *, devices: Optional[Sequence] = None,
              axis_types: Optional[tuple] = None) -> Mesh:
  """A ``(data, model)`` mesh over ``devices`` (default: all, every process's).

  ``data`` defaults to ``len(devices) // model``. With several processes the mesh is built per process
  (``create_hybrid_device_mesh``): each process's devices are whole rows of ``data`` and ``model`` stays
  inside a process; otherwise ``jax.make_mesh`` orders the devices (on TPU by the physical topology).
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  if not n or len(set(devices)) != n:
    raise ValueError(f"`devices` must be a non-empty list of distinct devices, got {devices!r}.")
  if isinstance(model, bool) or not isinstance(model, int) or model < 1:
    raise ValueError(f"`model` (the model-parallel mesh axis size) must be a positive int, got {model!r}.")
  if n % model:
    raise ValueError(f"`model`={model} does not divide the {n} devices.")
  data = n // model if data is None else data
  if isinstance(data, bool) or not isinstance(data, int) or data < 1 or data * model != n:
    raise ValueError(f"`data`={data!r} × `model`={model} must equal the {n} devices.")
  axis_types = (AxisType.Auto, AxisType.Auto) if axis_types is None else tuple(axis_types)
  n_proc = len({d.process_index for d in devices})
  if n_proc > 1 and data % n_proc == 0:
    # several processes: each process's devices form whole rows of `data` (so each feeds its own
    # rows of the batch), and `model` stays inside a process (its all-reduces never cross hosts)
    from jax.experimental import mesh_utils
    grid = mesh_utils.create_hybrid_device_mesh((data // n_proc, model), (n_proc, 1), devices,
                                                process_is_granule=True)
    return Mesh(grid, (DATA, MODEL), axis_types=axis_types)
  return jax.make_mesh((data, model), (DATA, MODEL), axis_types=axis_types, devices=devices)


def path_str(path) -> str:
  """``"blocks/attn/qkv/kernel"`` from a pytree key path (nnx's ``.value`` / ``[...]`` dropped)."""
  parts = []
  for k in path:
    name = getattr(k, "key", getattr(k, "name", getattr(k, "idx", None)))
    name = str(k) if name is None else str(name)
    if name not in ("value", "raw_value"):
      parts.append(name)
  return "/".join(parts)


def _mesh_axes(shape, axes, sizes: dict, *, strict: bool = False) -> Optional[list]:
  """The mesh axis (or None) per dimension of an array with logical ``axes``, on a mesh of axis
  ``sizes``. A dimension its mesh axis does not divide, or a mesh axis used twice, stays replicated;
  with ``strict`` a dimension that does not divide gives ``None`` for the whole array instead."""
  out, used = [], set()
  for dim, name in zip(shape, axes, strict=True):
    m = LOGICAL_TO_MESH.get(name) if name is not None else None
    if m is None or sizes.get(m, 1) == 1 or m in used:
      out.append(None)
    elif dim % sizes[m]:
      if strict:
        return None
      out.append(None)
    else:
      out.append(m)
      used.add(m)
  return out


def spec_for(shape: Sequence[int], axes: Sequence[Optional[str]], mesh: Mesh) -> P:
  """The PartitionSpec of an array with these logical ``axes`` on ``mesh``; a dimension the mesh axis
  does not divide (or a mesh axis used twice) stays replicated."""
  out = _mesh_axes(shape, axes, dict(zip(mesh.axis_names, mesh.devices.shape, strict=True)))
  while out and out[-1] is None:
    out.pop()
  return P(*out)


def _shape(x) -> tuple:
  x = x.get_value() if _is_variable(x) else x
  return tuple(getattr(x, "shape", np.shape(x)))


def state_specs(tree: Any, mesh: Mesh) -> Any:
  """A PartitionSpec per leaf of a parameter / optimizer / train-state tree (same structure), from the
  logical axes of the parameter (``nnx.Variable``) holding it (:func:`axes_of`); ``P()`` (replicated) for
  leaves outside one or of a parameter without axes."""
  def one(x):
    axes = axes_of(x)
    spec = P() if axes is None else spec_for(_shape(x), axes, mesh)
    return jax.tree.map(lambda _: spec, x)
  return jax.tree.map(one, tree, is_leaf=_is_variable)


def state_shardings(tree: Any, mesh: Mesh) -> Any:
  """:func:`state_specs` as ``NamedSharding`` objects on ``mesh``."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), state_specs(tree, mesh))


def put_global(tree: Any, shardings: Any) -> Any:
  """Host values identical on every process -> global ``jax.Array``s with ``shardings``.

  Each process fills only its own devices' shards (``jax.make_array_from_callback``), which is
  what multi-process JAX requires of an array spanning other processes' devices.
  """
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)

  def one(x, s):
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):  # typed PRNG keys
      impl = jax.random.key_impl(x)
      return jax.random.wrap_key_data(one(jax.random.key_data(x), s), impl=impl)
    host = np.asarray(jax.device_get(x))
    return jax.make_array_from_callback(host.shape, s, lambda idx: host[idx])
  return jax.tree.map(one, tree, shardings)


def constrain(x: jax.Array, *axes: Optional[str]) -> jax.Array:
  """``x`` pinned to the layout of its logical ``axes`` on the current mesh (``jax.set_mesh``);
  the identity when no mesh is set, so kernels and models run unchanged on one device."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or (MODEL not in mesh.axis_names and DATA not in mesh.axis_names):
    return x
  if len(axes) != x.ndim:
    raise ValueError(f"constrain: {len(axes)} axis names for an array of rank {x.ndim}.")
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
  return jax.lax.with_sharding_constraint(x, P(*_mesh_axes(x.shape, axes, sizes)))


def constrain_heads(*xs: jax.Array):
  """``[B, T, H, K]`` tensors pinned to batch over ``data``, heads over ``model``."""
  out = tuple(constrain(x, "batch", "length", "heads", "head_dim") for x in xs)
  return out if len(out) > 1 else out[0]


def _mesh_spec(axes: Optional[Sequence[Optional[str]]], shape, sizes: dict):
  """PartitionSpec of logical ``axes`` for ``shard_map``, or ``False`` if a dimension does not divide."""
  if axes is None:
    return P()
  out = _mesh_axes(shape, axes, sizes, strict=True)
  return False if out is None else P(*out)


def map_heads(fn, args: Sequence, axes: Sequence, out_axes):
  """``fn(*args)``, run per device on its own batch rows and heads when a mesh is set.

  The memory kernels are independent across batch rows and heads, so under a mesh with ``data`` /
  ``model`` axes (``jax.set_mesh``) ``fn`` runs inside ``jax.shard_map``: each device computes its
  local block with no communication (GSPMD alone would all-gather heads inside the kernels' scans
  over time). ``axes`` gives each argument's logical axes (``None``: replicated, e.g. a scalar);
  ``out_axes`` mirrors ``fn``'s output pytree with logical-axes tuples. Without a mesh, or when a
  sharded dimension does not divide its mesh axis, this is just ``fn(*args)``.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not (set(mesh.axis_names) & {DATA, MODEL}):
    return fn(*args)
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
  if all(sizes.get(a, 1) == 1 for a in (DATA, MODEL)):
    return fn(*args)
  in_specs = [P() if x is None else _mesh_spec(ax, np.shape(x), sizes)
              for x, ax in zip(args, axes, strict=True)]
  out_shapes = jax.eval_shape(fn, *args)
  is_axes = lambda t: t is None or (isinstance(t, tuple) and all(a is None or isinstance(a, str) for a in t))
  out_specs = jax.tree.map(lambda ax, o: _mesh_spec(ax, o.shape, sizes), out_axes, out_shapes, is_leaf=is_axes)
  out_leaves = jax.tree.leaves(out_specs, is_leaf=lambda t: t is False or isinstance(t, P))
  if any(s is False for s in in_specs) or any(s is False for s in out_leaves):
    return fn(*args)
  return jax.shard_map(fn, in_specs=tuple(in_specs), out_specs=out_specs, check_vma=False)(*args)


HEADS_BTHK = ("batch", "length", "heads", "head_dim")
HEADS_BTH = ("batch", "length", "heads")
STATE_BHKV = ("batch", "heads", "head_dim", "head_dim")


def layout_table(params: Any, mesh: Mesh) -> str:
  """A markdown table: each parameter's shape, logical axes, PartitionSpec, per-device shape and whether it
  is weight-decayed."""
  sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
  rows = ["| parameter | shape | logical axes | spec | per device | decay |", "|---|---|---|---|---|---|"]
  for path, v in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_variable):
    name = path_str(path)
    shape = _shape(v)
    axes = axes_of(v) or (None,) * len(shape)
    spec = spec_for(shape, axes, mesh)
    local = tuple(d // (math.prod(sizes[a] for a in ((s,) if isinstance(s, str) else s)) if s else 1)
                  for d, s in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True))
    named = ", ".join("·" if a is None else a for a in axes) if axes_of(v) else "(none)"
    rows.append(f"| `{name}` | {shape} | {named} | `{spec}` | {local} | {'yes' if decays(v) else ''} |")
  return "\n".join(rows)
