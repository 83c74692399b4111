"""Training stack: optax AdamW, jitted data-parallel step, orbax checkpoints, resume.

:mod:`~jaxmem.train.losses` holds the losses, :mod:`~jaxmem.train.lm` the byte-LM run,
:mod:`~jaxmem.train.recall` training and scoring on recall tasks (MQAR, multi-hop).
"""

from jaxmem.train.config import DataConfig, LMConfig, TrainConfig
from jaxmem.train.lm import evaluate_bpb, load_trained_lm, train_lm
from jaxmem.train.loop import (
    NonFiniteLossError,
    TrainResult,
    TrainTask,
    apply_model,
    make_optimizer,
    prepare_workdir,
    read_metrics,
    train,
)
from jaxmem.train.losses import lm_loss, recall_loss, sequence_loss, token_nll, with_ponder_cost
from jaxmem.train.recall import recall_accuracy, recall_mixer, recall_train_config, train_recall

__all__ = [
    "DataConfig", "LMConfig", "NonFiniteLossError", "TrainConfig", "TrainResult", "TrainTask",
    "apply_model", "evaluate_bpb", "lm_loss", "load_trained_lm", "make_optimizer", "prepare_workdir",
    "read_metrics", "recall_accuracy", "recall_loss", "recall_mixer", "recall_train_config",
    "sequence_loss", "token_nll", "train", "train_lm", "train_recall", "with_ponder_cost",
]
