"""Fine-tuning on a GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli) from any pretrained checkpoint.

    python -m bert_jax.finetune --config=configs/glue.py:rte --workdir=runs/rte \
        --config.init=PATH --config.data_dir=../shared/data/glue/RTE

Without data_dir the task is read from TFDS glue/<task>, if it is prepared offline. Defaults follow BERT's paper
(batch 32, learning rate 2e-5, 3 epochs, 10% warmup, max_seq_length 128).
"""
from bert_jax import config_lib
from bert_jax.tasks import glue
from bert_jax.config_lib import finetune_config


def get_config(task="rte"):
    glue.get_task(task)  # an unknown task name fails here, listing the nine
    config = finetune_config(task=task, max_seq_length=128, batch_size=32, learning_rate=2e-5, num_epochs=3.0)
    config.length_bucket = 32  # GLUE sentences are mostly far shorter than 128 tokens
    config.data_dir = ""  # folder of the task's GLUE TSV files (train.tsv, dev.tsv, test.tsv)
    config.tfds_data_dir = ""  # TFDS data_dir when reading glue/<task> from TFDS
    return config_lib.lock(config)
