"""Fine-tuning on SQuAD v1.1 or v2.0 (`:v1.1` | `:v2.0`) from any pretrained checkpoint.

    python -m bert_jax.finetune --config=configs/squad.py:v1.1 --workdir=runs/squad \
        --config.init=PATH --config.data_dir=squad

config.data_dir names the data (bert_jax.data_sources): a folder of the official JSON files (train-v1.1.json,
dev-v1.1.json), the hub's rajpurkar/squad (squad_v2 for v2.0) as `hf download` leaves it, or tfds:squad (the
default; TFDS squad/v1.1 or squad/v2.0). config.train_file and config.predict_file name one JSON or parquet file
each instead (data/squad/dev-v1.1-sample.json is a 55-question sample). Writes predictions.json, which
`python -m bert_jax.evaluation.squad DEV.json predictions.json` scores. Defaults follow BERT's run_squad.py (batch
32, learning rate 3e-5, 2 epochs, windows of 384 tokens 128 apart).
"""
from bert_jax import config_lib
from bert_jax.config_lib import finetune_config

VERSIONS = ("v1.1", "v2.0")


def get_config(version="v1.1"):
    if version not in VERSIONS:
        raise config_lib.ConfigError(f"unknown SQuAD version {version!r}; choose one of {VERSIONS}")
    config = finetune_config(task="squad", max_seq_length=384, batch_size=32, learning_rate=3e-5, num_epochs=2.0)
    config.version_2 = version == "v2.0"
    config.data_dir = "tfds:squad"  # official JSON files, the hub's rajpurkar/squad, or tfds:squad
    config.tfds_data_dir = ""  # where TFDS datasets are built (TFDS's default folder when empty)
    config.train_file = ""  # one JSON or parquet file to train on instead of data_dir's train split
    config.predict_file = ""  # one to predict and score instead of data_dir's validation split
    config.doc_stride = 128
    config.max_query_length = 64
    config.n_best = 20
    config.max_answer_length = 30
    config.null_threshold = 0.0  # v2.0: answer "" when null score - best span score exceeds this
    return config_lib.lock(config)
