"""Training stack: optax AdamW, jitted data-parallel step, orbax checkpoints, resume."""

from jaxmem.train.config import DataConfig, LMConfig, TrainConfig
from jaxmem.train.lm import evaluate_bpb, lm_loss, load_trained_lm, train_lm
from jaxmem.train.loop import (
    NonFiniteLossError,
    TrainResult,
    TrainTask,
    make_optimizer,
    prepare_workdir,
    read_metrics,
    train,
)

__all__ = [
    "DataConfig", "LMConfig", "NonFiniteLossError", "TrainConfig", "TrainResult", "TrainTask",
    "evaluate_bpb", "lm_loss", "load_trained_lm", "make_optimizer", "prepare_workdir",
    "read_metrics", "train", "train_lm",
]
