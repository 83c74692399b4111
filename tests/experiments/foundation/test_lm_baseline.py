"""The lm_baseline experiment's settings are `jaxmem train`'s config file, at both sizes.

(Its end-to-end run is ``tests/test_cli.py::test_reproduce_writes_tables_and_figures``.)"""

import dataclasses

import pytest

from jaxmem import config_files
from jaxmem.experiments import REGISTRY
from jaxmem.experiments.foundation import lm_baseline as exp
from jaxmem.train import LMConfig
from jaxmem.train.lm import lm_config_from


def test_settings_are_the_train_config_file():
  entry = REGISTRY["lm_baseline"]
  assert entry.settings is LMConfig and entry.config == "lm_baseline"
  assert entry.load_config(True) == lm_config_from(config_files.load_config("lm_baseline:quick"))
  full = lm_config_from(config_files.load_config("lm_baseline"))   # what `jaxmem train --config` gets
  assert entry.load_config(False) == full == lm_config_from(config_files.load_config("lm_baseline:full"))
  assert full.model.n_layers == 6 and entry.load_config(True).model.n_layers == 3
  with pytest.raises(ValueError, match="'quick' or 'full'"):
    config_files.load_config("lm_baseline:huge")


def test_notes_name_the_config_and_what_differs_from_it():
  quick = REGISTRY["lm_baseline"].load_config(True)
  assert exp.config_source(quick, quick=True) == "`configs/lm_baseline.py:quick`"
  assert exp.config_source(REGISTRY["lm_baseline"].load_config(False), quick=False) == \
      "`configs/lm_baseline.py:full`"
  changed = dataclasses.replace(quick, train=dataclasses.replace(quick.train, n_steps=80, warmup_steps=5))
  assert exp.config_source(changed, quick=True) == \
      "`configs/lm_baseline.py:quick` with `train.n_steps=80`, `train.warmup_steps=5`"
