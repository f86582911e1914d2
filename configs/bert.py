"""BERT (Devlin et al., 2019): post-LN encoder pretrained with MLM + next-sentence prediction on static masks.

    python -m bert_jax.train --config=configs/bert.py:base --workdir=runs/bert-base
"""
from bert_jax import config_lib


def get_config(size="base"):
    """The bert preset of this size; the sizes, objective and data defaults are in bert_jax/families/bert.py."""
    return config_lib.load_preset("bert", size)
