"""Config files, --config.field=value overrides, and typed dataclass validation."""

import json

import ml_collections
import pytest

from jaxmem import config_files
from jaxmem.models import AssocConfig, SoftmaxConfig, TransformerConfig
from jaxmem.train import LMConfig, TrainConfig
from jaxmem.train.lm import lm_config_from


def test_quick_variant_loads_and_converts():
  cfg = lm_config_from(config_files.load_config("configs/lm_baseline.py:quick"))
  assert isinstance(cfg, LMConfig) and cfg.model.d_model == 128 and cfg.train.n_steps == 600
  assert lm_config_from(config_files.load_config("lm_baseline")).model.n_layers == 6


def test_overrides_are_parsed_by_field_type():
  cfg = config_files.apply_overrides(
      config_files.load_config("lm_baseline:quick"),
      ["--config.train.lr=0.5", "--config.model.n_layers=2", "--config.model.remat=true",
       "--config.data.corpus=wikitext2", "--config.data.path=/tmp/x"],
  )
  assert cfg.train.lr == 0.5 and cfg.model.n_layers == 2 and cfg.model.remat is True
  assert cfg.data.corpus == "wikitext2" and cfg.data.path == "/tmp/x"


def test_optional_bool_fields_take_true_false_none():
  # the assoc mixer's key_norm defaults to None (resolved by the rule); the README's override must work
  base = config_files.apply_overrides(config_files.load_config("lm_baseline:quick"),
                                      ["--config.model.mixer.name=assoc"])
  assert base.model.mixer.key_norm is None
  for raw, want in (("true", True), ("False", False), ("none", None)):
    cfg = config_files.apply_overrides(base, [f"--config.model.mixer.key_norm={raw}"])
    assert cfg.model.mixer.key_norm is want
    assert lm_config_from(cfg).model.mixer.key_norm is want


def test_switching_the_mixer_by_name_takes_that_mixers_fields():
  base = config_files.load_config("lm_baseline:quick")
  assert base.model.mixer.name == "softmax"
  cfg = config_files.apply_overrides(base, ["--config.model.mixer.name=assoc",
                                            "--config.model.mixer.rule=delta",
                                            "--config.model.mixer.chunk_size=8"])
  model = lm_config_from(cfg).model
  assert model.mixer == AssocConfig(rule="delta", chunk_size=8)
  # a field of another mixer, and an unknown mixer, are named errors
  with pytest.raises(ValueError, match=r"mixer has no field 'rule'"):
    config_files.apply_overrides(base, ["--config.model.mixer.rule=delta"])
  with pytest.raises(ValueError, match=r"unknown mixer 'lstm'"):
    config_files.apply_overrides(base, ["--config.model.mixer.name=lstm"])
  with pytest.raises(ValueError, match=r"unknown field\(s\) \['rule'\] for mixer 'softmax'"):
    lm_config_from({"model": {"mixer": {"name": "softmax", "rule": "delta"}}})


def test_a_per_layer_mixer_tuple_round_trips_through_dicts():
  mixer = (SoftmaxConfig(), AssocConfig(rule="gated_delta", key_norm=True), SoftmaxConfig(short_conv=2))
  cfg = LMConfig(model=TransformerConfig(n_layers=3, mixer=mixer))
  as_dict = config_files.to_dict(cfg)
  assert as_dict["model"]["mixer"][1] == {**AssocConfig().to_dict(), "rule": "gated_delta", "key_norm": True}
  back = lm_config_from(ml_collections.ConfigDict(as_dict))
  assert back == cfg and back.model.mixer == mixer
  assert json.loads(json.dumps(as_dict)) == as_dict  # what config.json in a workdir holds


@pytest.mark.parametrize(
    "override,match",
    [("--config.train.lrr=1", r"unknown config field 'train.lrr'.*valid: \[.*'lr'"),
     ("--config.optim.lr=1", r"<top level> has no field 'optim'"),
     ("--config.train.n_steps=ten", r"expects an int"),
     ("--config.model.remat=maybe", r"expects a bool"),
     ("--config.train.lr", r"must look like --config.field=value")],
)
def test_bad_overrides_raise(override, match):
  with pytest.raises(ValueError, match=match):
    config_files.apply_overrides(config_files.load_config("lm_baseline:quick"), [override])


def test_unknown_fields_in_a_dict_config_raise():
  with pytest.raises(ValueError, match=r"unknown config field\(s\) \['depth'\] in model"):
    lm_config_from({"model": {"depth": 3}})


def test_unknown_config_file_and_variant_raise():
  with pytest.raises(ValueError, match="no config named 'nope'"):
    config_files.load_config("nope")
  with pytest.raises(ValueError, match="variant"):
    config_files.load_config("lm_baseline:huge")


@pytest.mark.parametrize(
    "kw,match",
    [({"lr": float("nan")}, "TrainConfig.lr"), ({"n_steps": 0}, "n_steps"),
     ({"warmup_steps": 50, "n_steps": 10}, "warmup_steps=50 exceeds"),
     ({"b2": 1.5}, "b2"), ({"keep_checkpoints": 0}, "keep_checkpoints")],
)
def test_train_config_validation(kw, match):
  with pytest.raises(ValueError, match=match):
    TrainConfig(**kw)


def test_seq_len_longer_than_model_raises():
  with pytest.raises(ValueError, match="exceeds model.max_len"):
    lm_config_from({"model": {"max_len": 16}, "data": {"seq_len": 32}})
