"""The config files of assoc_capacity / assoc_drift / assoc_capacity_onehot / assoc_error_propagation:
variants, errors, and the settings dataclasses they become (with overrides)."""

import pytest

from jaxmem import config_files
from jaxmem.experiments import REGISTRY
from jaxmem.experiments.pavlovian import capacity, capacity_onehot, drift, error_propagation

EXPERIMENTS = {"assoc_capacity": capacity.CapacitySettings, "assoc_drift": drift.DriftSettings,
               "assoc_capacity_onehot": capacity_onehot.OneHotSettings,
               "assoc_error_propagation": error_propagation.PropagationSettings}


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_variants_and_settings(name):
  exp = REGISTRY[name]
  assert exp.settings is EXPERIMENTS[name] and exp.config == f"pavlovian_{name.removeprefix('assoc_')}"
  full, default, quick = (config_files.load_config(f"{exp.config}{v}") for v in (":full", "", ":quick"))
  assert full.to_dict() == default.to_dict() != quick.to_dict()
  with pytest.raises(ValueError, match="must be 'quick', 'full' or omitted"):
    config_files.load_config(f"{exp.config}:tiny")
  for q in (True, False):
    s = exp.load_config(q)
    assert isinstance(s, exp.settings)
    assert config_files.to_dict(s) == config_files.to_dict(
        config_files.to_dataclass(exp.settings, quick if q else full))
  changed = exp.load_config(True, ["seed=3"])
  assert changed.seed == 3 and changed != exp.load_config(True)
  with pytest.raises(ValueError, match="unknown config field"):
    exp.load_config(True, ["no_such_field=1"])


def test_nested_trained_section_overrides():
  s = REGISTRY["assoc_capacity_onehot"].load_config(True, ["trained.steps=20", "fmaps=('elu1',)"])
  assert isinstance(s.trained, capacity_onehot.TrainedSettings)
  assert s.trained.steps == 20 and s.fmaps == ("elu1",)
  assert all(isinstance(g, tuple) for g in s.trained.groups)
