"""ALBERT (Lan et al., 2020): factorized embeddings (E=128), one set of layer weights for all layers, MLM + SOP.

    python -m bert_jax.train --config=configs/albert.py:base --workdir=runs/albert-base
"""
from bert_jax import config_lib


def get_config(size="base"):
    """The albert preset of this size; the sizes, objective and data defaults are in bert_jax/families/albert.py."""
    return config_lib.load_preset("albert", size)
