"""The settings every fine-tuning run shares; configs/glue.py and configs/squad.py add their task's own."""
from __future__ import annotations

import ml_collections

from bert_jax import config_lib


def finetune_config(task: str, max_seq_length: int, batch_size: int, learning_rate: float,
                    num_epochs: float) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(
        task=task,
        objective=f"finetune_{task}",  # what the workdir's checkpoints hold (checked on resume)
        init="",  # any path bert_jax.load_pretrained accepts (HF dir, TF1 checkpoint, bert_jax workdir); required
        # Replaced by the init checkpoint's architecture at start; listed so config.json records it.
        model=config_lib.model_config("bert"),
        max_seq_length=max_seq_length,
        # Cut each batch's trailing padding to a multiple of this many tokens (0: always max_seq_length).
        length_bucket=0,
        batch_size=batch_size,
        eval_batch_size=64,
        num_epochs=num_epochs,
        max_train_examples=0,  # 0: all; else the first N (quick runs)
        seed=0,
        log_every_steps=50,
        checkpoint_every_steps=1000,
        checkpoint_every_secs=600,  # also save when this many seconds passed since the last save (0: off)
        keep_checkpoints=1,
        mesh=dict(data=-1, fsdp=1, tensor=1),
        optimizer=dict(
            name="adamw",
            learning_rate=learning_rate,
            warmup_fraction=0.1,  # of the total steps, then linear decay to 0
            decay="linear",
            power=1.0,
            weight_decay=0.01,
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            grad_clip_norm=1.0,
        ),
        nan_policy="stop",
    ))
