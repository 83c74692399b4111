"""Loading config files: ml_collections ``ConfigDict`` files at the edge, frozen dataclasses inside.

A config file is a Python file with ``get_config(arg=None) -> ConfigDict``; ``arg`` picks
a variant (``configs/lm_baseline.py:quick``). The CLI's ``--config.a.b=value`` overrides
are applied here, parsed by the type of the field they replace; an unknown field is a
``ValueError`` that names it and lists the valid ones.

Token mixers and model bodies are tagged sections: ``model.mixer`` holds ``name`` plus that mixer's fields
(:mod:`jaxmem.models.mixers`), ``model`` holds ``body`` plus that body's fields (:mod:`jaxmem.models.bodies`).
Overriding ``--config.model.mixer.name=assoc`` swaps the section for the assoc mixer's defaults, so the next
overrides (``--config.model.mixer.rule=delta``) see its fields; ``--config.model.body=unimatrix`` swaps the
model section for UniMatrix's defaults the same way. A per-layer tuple of mixers is a list of such sections.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import pathlib
import typing
from typing import Any, Sequence

import ml_collections


def _configs_dir_candidates() -> list:
  here = pathlib.Path(__file__).resolve().parent
  return [here.parent / "configs", here / "configs"]


def resolve_config_path(spec: str) -> tuple[pathlib.Path, str | None]:
  """``'configs/x.py:quick'`` or ``'x:quick'`` -> (path to x.py, 'quick')."""
  path_part, _, arg = spec.partition(":")
  arg = arg or None
  p = pathlib.Path(path_part).expanduser()
  if p.suffix == ".py" and p.is_file():
    return p, arg
  name = p.stem if p.suffix == ".py" else path_part
  for folder in _configs_dir_candidates():
    cand = folder / f"{name}.py"
    if cand.is_file():
      return cand, arg
  raise ValueError(
      f"`--config` {spec!r}: no such file, and no config named {name!r} in "
      f"{[str(f) for f in _configs_dir_candidates()]}."
  )


def load_config(spec: str) -> ml_collections.ConfigDict:
  """Loads ``get_config(arg)`` from a config file spec (see :func:`resolve_config_path`)."""
  path, arg = resolve_config_path(spec)
  module_spec = importlib.util.spec_from_file_location(f"jaxmem_config_{path.stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path} has no get_config().")
  cfg = module.get_config(arg) if arg is not None else module.get_config()
  if not isinstance(cfg, ml_collections.ConfigDict):
    raise ValueError(f"{path}: get_config() must return a ConfigDict, got {type(cfg).__name__}.")
  return cfg


def _parse_value(raw: str, current: Any, field: str) -> Any:
  if isinstance(current, bool):
    low = raw.lower()
    if low in ("true", "1", "yes"):
      return True
    if low in ("false", "0", "no"):
      return False
    raise ValueError(f"`--config.{field}` expects a bool, got {raw!r}.")
  if isinstance(current, int):
    try:
      return int(raw)
    except ValueError:
      raise ValueError(f"`--config.{field}` expects an int, got {raw!r}.") from None
  if isinstance(current, float):
    try:
      return float(raw)
    except ValueError:
      raise ValueError(f"`--config.{field}` expects a float, got {raw!r}.") from None
  if isinstance(current, str):
    return raw
  words = {"true": True, "false": False, "none": None}
  if current is None and raw.lower() in words:  # an optional field (e.g. key_norm=None): bool or None
    return words[raw.lower()]
  try:  # None, tuples, lists: Python literal syntax
    return ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    return raw


def apply_overrides(cfg: ml_collections.ConfigDict, overrides: Sequence[str]) -> ml_collections.ConfigDict:
  """Applies ``a.b=value`` strings (an optional ``--config.`` prefix is stripped)."""
  cfg = ml_collections.ConfigDict(cfg.to_dict())  # never mutate the caller's config
  done = []   # (field, item) of the overrides applied so far
  for item in overrides:
    text = item[len("--config."):] if item.startswith("--config.") else item
    text = text[len("config."):] if text.startswith("config.") else text
    if "=" not in text:
      raise ValueError(f"config override {item!r} must look like --config.field=value.")
    field, raw = text.split("=", 1)
    parts = field.split(".")
    node = cfg
    for i, part in enumerate(parts):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        where = ".".join(parts[:i]) or "<top level>"
        valid = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        raise ValueError(
            f"unknown config field {field!r}: {where} has no field {part!r}; valid: {valid}."
        )
      if i < len(parts) - 1:
        node = node[part]
    value = _parse_value(raw, node[parts[-1]], field)
    registry = _tag_registry(node, parts[-1])
    if registry is not None and value != node[parts[-1]]:
      section = ".".join(parts[:-1]) + "."
      lost = [it for f, it in done if f.startswith(section) and f != field]
      if lost:
        raise ValueError(f"`--config.{field}={raw}` resets the whole {section[:-1]!r} section to that one's "
                         f"defaults, which discards the earlier {', '.join(lost)}; put it before them.")
      _retag(cfg, parts[:-1], registry, value, field)
    else:
      node[parts[-1]] = value
    done.append((field, item))
  return cfg


def _tag_registry(node, key: str):
  """The registry module (mixers or bodies) when ``node[key]`` is the tag of a whole section of one of its
  configs (``model.mixer.name``, ``model.body``), else None."""
  from jaxmem.models import bodies, mixers
  registry = {"name": mixers, "body": bodies}.get(key)
  if registry is None or node[key] not in registry.REGISTRY:
    return None
  return registry if set(node.keys()) == set(registry.default_dict(node[key])) else None


def _retag(cfg, path: Sequence[str], registry, name: str, field: str) -> None:
  """Replaces the section at ``path`` by the defaults of ``registry``'s config ``name``."""
  if name not in registry.REGISTRY:
    kind = "mixer" if registry.__name__.endswith("mixers") else "model body"
    raise ValueError(f"`--config.{field}`: unknown {kind} {name!r}; registered: {registry.names()}.")
  parent = cfg
  for part in path[:-1]:
    parent = parent[part]
  parent[path[-1]] = ml_collections.ConfigDict(registry.default_dict(name))


def to_dataclass(cls: type, values: Any, where: str = ""):
  """Builds a (nested) frozen dataclass from a dict / ConfigDict, rejecting unknown fields."""
  if isinstance(values, ml_collections.ConfigDict):
    values = values.to_dict()
  if dataclasses.is_dataclass(values):
    return values
  if not isinstance(values, dict):
    raise ValueError(f"config section {where or cls.__name__} must be a mapping, got {values!r}.")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ValueError(
        f"unknown config field(s) {unknown} in {where or cls.__name__}; valid: {sorted(fields)}."
    )
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name, value in values.items():
    if not fields[name].init:  # a tag (a mixer's name, a body's body): fixed by the class
      if value != fields[name].default:
        raise ValueError(f"config field {where + '.' if where else ''}{name} of {cls.__name__} is "
                         f"{fields[name].default!r}, got {value!r}.")
      continue
    hint = hints.get(name)
    tagged = getattr(fields[name].default, "from_dict", None)  # a tagged section (a mixer): dispatch on name
    if tagged is not None and not dataclasses.is_dataclass(value):
      if isinstance(value, (list, tuple)):
        value = tuple(v if dataclasses.is_dataclass(v) else tagged(_plain(v)) for v in value)
      else:
        value = tagged(_plain(value))
    elif dataclasses.is_dataclass(hint):
      value = to_dataclass(hint, value, f"{where}.{name}" if where else name)
    elif isinstance(value, list):
      value = tuple(value)
    kwargs[name] = value
  return cls(**kwargs)


def _plain(values: Any) -> Any:
  return values.to_dict() if isinstance(values, ml_collections.ConfigDict) else values


def to_dict(obj: Any) -> Any:
  """A dataclass config back to plain JSON-able dicts."""
  if dataclasses.is_dataclass(obj):
    return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
  if isinstance(obj, (list, tuple)):
    return [to_dict(x) for x in obj]
  return obj
