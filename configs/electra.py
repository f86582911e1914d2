"""ELECTRA (Clark et al., 2020): a small MLM generator fills the masks, the discriminator detects replaced tokens.

The generator sizes follow the paper's Table 7 ("generator size" multiplies hidden size, FFN size and heads):
1/4 for small and large, 1/3 for base. Generator and discriminator share the token embeddings.

    python -m bert_jax.train --config=configs/electra.py:small --workdir=runs/electra-small
"""
from bert_jax import config_lib


def get_config(size="small"):
    """The electra preset of this size; the sizes, objective and data defaults are in bert_jax/families/electra.py."""
    return config_lib.load_preset("electra", size)
