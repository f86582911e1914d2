"""BERT (Devlin et al., 2019): post-LN encoder pretrained with MLM + next-sentence prediction on static masks.

    python -m bert_jax.train --config=configs/bert.py:base --workdir=runs/bert-base
"""
from bert_jax import config_lib

SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def get_config(size="base"):
    model = config_lib.model_config("bert", **config_lib.select_size(SIZES, size, "bert"))
    return config_lib.lock(config_lib.pretraining_config(model, objective="mlm_nsp", size=size))
