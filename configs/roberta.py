"""RoBERTa (Liu et al., 2019): BERT's architecture, dynamic MLM over full sentences, no NSP, byte-level BPE.

    python -m bert_jax.train --config=configs/roberta.py:base --workdir=runs/roberta-base
"""
from bert_jax import config_lib


def get_config(size="base"):
    """The roberta preset of this size; the sizes, objective and data defaults are in bert_jax/families/roberta.py."""
    return config_lib.load_preset("roberta", size)
