"""The language-model registry: ``body name -> (ConfigCls, ModuleCls)``, what ``jaxmem train`` / ``eval`` /
:func:`jaxmem.train.load_trained_lm` build from the ``model`` section of an LM config.

A body maps token ids ``[B, T]`` to float32 logits ``[B, T, vocab_size]``. Its config is a frozen dataclass
subclassing :class:`BodyConfig` with a tag field ``body`` (``dataclasses.field(default="<name>", init=False)``:
part of the dict form that config files and saved ``config.json`` hold, never an argument); a dict without
``body`` is a Transformer (every ``config.json`` written before the tag existed).

============ ============================================= ================================================
body         config                                        module
============ ============================================= ================================================
transformer  :class:`~jaxmem.models.TransformerConfig`     :class:`~jaxmem.models.TransformerLM`, every
                                                           mixer and ffn slot: the hybrid, the triple latent
unimatrix    :class:`~jaxmem.models.UniMatrixConfig`       :class:`~jaxmem.models.UniMatrixLM`
dnc          :class:`~jaxmem.models.DNCLMConfig`           :class:`~jaxmem.models.DNCLM`
============ ============================================= ================================================
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flax import nnx

REGISTRY: dict[str, tuple[type, type]] = {}
DEFAULT = "transformer"


class BodyConfig:
  """Mixin of every body config (a frozen dataclass with a ``body`` tag field): dispatch from a dict form."""

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "BodyConfig":
    """``{"body": "unimatrix", "d_model": 64, ...}`` -> ``UniMatrixConfig(d_model=64, ...)`` (no ``body``:
    a Transformer); unknown fields raise ``ValueError`` naming them and the valid ones."""
    if isinstance(values, BodyConfig):
      return values
    if not isinstance(values, Mapping):
      raise ValueError(f"a model config must be a mapping (with 'body', one of {names()}), got {values!r}.")
    values = dict(values)
    name = values.pop("body", DEFAULT)
    config_cls = lookup(name)[0]
    fields = {f.name for f in dataclasses.fields(config_cls) if f.init}
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"unknown config field(s) {unknown} in model (body {name!r}); valid: {sorted(fields)}.")
    return config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def register(name: str, config_cls: type, module_cls: type) -> None:
  """Adds a body; its config's ``body`` default must equal ``name``."""
  if name in REGISTRY:
    raise ValueError(f"body {name!r} registered twice.")
  if not (dataclasses.is_dataclass(config_cls) and issubclass(config_cls, BodyConfig)):
    raise ValueError(f"body {name!r}: the config class must be a dataclass subclassing BodyConfig, "
                     f"got {config_cls!r}.")
  if config_cls().body != name:
    raise ValueError(f"body {name!r}: {config_cls.__name__}.body is {config_cls().body!r}.")
  REGISTRY[name] = (config_cls, module_cls)


def names() -> list:
  return sorted(REGISTRY)


def lookup(name: str) -> tuple[type, type]:
  if name not in REGISTRY:
    raise ValueError(f"unknown model body {name!r}; registered: {names()}.")
  return REGISTRY[name]


def default_dict(name: str) -> dict:
  """The dict form of body ``name``'s default config (used to switch bodies from the CLI)."""
  cfg = lookup(name)[0]()
  return {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def _plain(x):
  if dataclasses.is_dataclass(x):
    return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  return x


def build(cfg: BodyConfig, *, rngs: nnx.Rngs) -> nnx.Module:
  """The language model for ``cfg`` (looked up by ``cfg.body``)."""
  if not isinstance(cfg, BodyConfig):
    raise ValueError(f"expected a model config (one of the bodies {names()}), got {cfg!r}.")
  return lookup(cfg.body)[1](cfg, rngs=rngs)


__all__ = ["BodyConfig", "build", "default_dict", "lookup", "names", "register"]
