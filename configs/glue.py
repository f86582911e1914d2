"""Fine-tuning on a GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli) from any pretrained checkpoint.

    python -m bert_jax.finetune --config=configs/glue.py:rte --workdir=runs/rte \
        --config.init=runs/bert-tiny --config.data_dir=data/glue/RTE

config.data_dir names the task's data (bert_jax.data_sources): a folder of its GLUE TSVs (data/glue/RTE holds a
64-row sample), the hub's nyu-mll/glue as `hf download` leaves it, or tfds:glue (the default; TFDS glue/<task>,
built with `tfds build glue/<task>`). Defaults follow BERT's paper (batch 32, learning rate 2e-5, 3 epochs, 10%
warmup, max_seq_length 128).
"""
from bert_jax import config_lib
from bert_jax.tasks import glue
from bert_jax.config_lib import finetune_config


def get_config(task="rte"):
    glue.get_task(task)  # an unknown task name fails here, listing the nine
    config = finetune_config(task=task, max_seq_length=128, batch_size=32, learning_rate=2e-5, num_epochs=3.0)
    config.length_bucket = 32  # GLUE sentences are mostly far shorter than 128 tokens
    config.data_dir = "tfds:glue"  # GLUE TSVs (train.tsv, dev.tsv, test.tsv), the hub's nyu-mll/glue, or tfds:glue
    config.tfds_data_dir = ""  # where TFDS datasets are built (TFDS's default folder when empty)
    return config_lib.lock(config)
