"""ALBERT (Lan et al., 2020): factorized embeddings (E=128), one set of layer weights for all layers, MLM + SOP.

    python -m bert_jax.train --config=configs/albert.py:base --workdir=runs/albert-base
"""
from bert_jax import config_lib

# The v2 recipe: 30k sentencepiece vocabulary, gelu_new, no dropout, all layers in one shared group.
ALBERT = dict(vocab_size=30000, embedding_size=128, hidden_act="gelu_new", hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0, num_hidden_groups=1)
SIZES = {
    "tiny": dict(ALBERT, vocab_size=8000, embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=256),
    "base": dict(ALBERT, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(ALBERT, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    "xlarge": dict(ALBERT, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16, intermediate_size=8192),
    "xxlarge": dict(ALBERT, hidden_size=4096, num_hidden_layers=12, num_attention_heads=64, intermediate_size=16384),
}


def get_config(size="base"):
    model = config_lib.model_config("albert", **config_lib.select_size(SIZES, size, "albert"))
    return config_lib.lock(config_lib.pretraining_config(model, objective="mlm_sop", size=size))
