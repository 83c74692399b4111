"""Data × model sharding: a ``(data, model)`` mesh, logical axis names, and the rules between them.

The layout is Megatron's (Shoeybi et al. 2019, arXiv:1909.08053) written as GSPMD shardings:

* **batches** are split over ``data``;
* **heads** are split over ``model``: every memory kernel works per head (the ``vmap`` axis of
  :mod:`jaxmem.kernels` is the head axis), so sharding it runs each head's recurrence on its own
  devices with no communication inside the kernel; the q / k / v projection's output columns and
  the output projection's input rows (both made of whole heads) follow;
* **the FFN hidden units** are split over ``model`` (``up`` by columns, ``down`` by rows);
* everything else (embeddings, norms, positions, per-channel gates) is replicated.

Parameters are named by *logical* axes (``"heads"``, ``"ffn"``, ``"embed"``, ...) through
:data:`PARAM_RULES`, a table of path patterns, and logical axes map to mesh axes through
:data:`LOGICAL_TO_MESH`. A dimension the mesh axis does not divide stays replicated (recorded in
:func:`layout_table`), so any model runs on any mesh. The optimizer state mirrors the parameter
tree and gets the same layout (Adam's ``mu`` / ``nu`` of a sharded matrix are sharded alike).

Activations: :func:`constrain` pins ``[B, T, H, D/H]`` head tensors to ``(data, ·, model, ·)``
inside the mixers when a mesh is set (``jax.set_mesh``), and :func:`map_heads` runs the softmax,
associative-memory and matrix-state kernels inside ``jax.shard_map`` on each device's own batch
rows and heads (GSPMD alone all-gathered heads inside the kernels' scans over time). Both are the
identity without a mesh, so the models run unchanged on one device. What communication is left
per layer is Megatron's: an all-reduce after the output projection and after the FFN, and one
all-gather where the fused q / k / v projection (columns laid out ``[3, H, K]``, so a split of
its 3·H·K columns is not head-aligned) is reshaped into heads.

Mesh axes are ``AxisType.Auto`` (passed explicitly): the GSPMD partitioner propagates the
parameter and batch shardings, and the constraints above fix the per-head layout. jaxmem's models
are not written for ``AxisType.Explicit`` (sharding in types), which ``make_mesh(axis_types=...)``
allows for user code that is.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA, MODEL = "data", "model"

# logical axis -> mesh axis (None: replicated)
LOGICAL_TO_MESH = {
    "batch": DATA,
    "heads": MODEL,   # any dimension made of whole heads: H, H·K or the fused 3·H·K of q, k, v
    "ffn": MODEL,
    "embed": None,
    "vocab": None,
    "length": None,
    "layers": None,
    "head_dim": None,
}

# (pattern on the parameter path "a/b/c", logical axes of its trailing dims). The first match wins;
# a leading axis beyond these (the layer axis of scanned blocks) is "layers". Paths of the
# optimizer state end in the parameter's path, so the same patterns lay it out.
PARAM_RULES: tuple = (
    (r"(attn|mixer)/(qkv|proj)/kernel$", ("embed", "heads")),
    (r"(attn|mixer)/(qkv|proj)/bias$", ("heads",)),
    (r"(attn|mixer)/out/kernel$", ("heads", "embed")),
    (r"(attn|mixer)/(beta|decay|rho)/kernel$", ("embed", "heads")),
    (r"(attn|mixer)/(beta|decay|rho)/bias$", ("heads",)),
    (r"(attn|mixer)/mix_logits$", ("heads", None)),
    (r"ffn/up/kernel$", ("embed", "ffn")),
    (r"ffn/up/bias$", ("ffn",)),
    (r"ffn/down/kernel$", ("ffn", "embed")),
)


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


def logical_axes(path: str, ndim: int, rules: tuple = PARAM_RULES) -> tuple:
  """The logical axis names of a parameter (``None`` per dim: replicated), from ``rules``."""
  for pattern, axes in rules:
    if re.search(pattern, path):
      if len(axes) > ndim:
        raise ValueError(f"rule {pattern!r} names {len(axes)} axes for {path!r} of rank {ndim}.")
      return ("layers",) * (ndim - len(axes)) + tuple(axes)
  return (None,) * ndim


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


def state_specs(tree: Any, mesh: Mesh, rules: tuple = PARAM_RULES) -> Any:
  """A PartitionSpec per leaf of a parameter / optimizer / train-state tree."""
  def one(path, x):
    shape = np.shape(x)
    return spec_for(shape, logical_axes(path_str(path), len(shape), rules), mesh)
  return jax.tree_util.tree_map_with_path(one, tree)


def state_shardings(tree: Any, mesh: Mesh, rules: tuple = PARAM_RULES) -> Any:
  return jax.tree.map(lambda s: NamedSharding(mesh, s), state_specs(tree, mesh, rules))


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


def layout_table(params: Any, mesh: Mesh, rules: tuple = PARAM_RULES) -> str:
  """A markdown table: each parameter's shape, logical axes, PartitionSpec and per-device shape."""
  sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
  rows = ["| parameter | shape | logical axes | spec | per device |", "|---|---|---|---|---|"]
  for path, x in jax.tree_util.tree_leaves_with_path(params):
    name, shape = path_str(path), tuple(np.shape(x))
    axes = logical_axes(name, len(shape), rules)
    spec = spec_for(shape, axes, mesh)
    local = tuple(d // (math.prod(sizes[a] for a in ((s,) if isinstance(s, str) else s)) if s else 1)
                  for d, s in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True))
    named = ", ".join("·" if a is None else a for a in axes)
    rows.append(f"| `{name}` | {shape} | {named} | `{spec}` | {local} |")
  return "\n".join(rows)
