"""ELECTRA (Clark et al., 2020): a small MLM generator fills the masks, the discriminator detects replaced tokens.

The generator sizes follow the paper's Table 7 ("generator size" multiplies hidden size, FFN size and heads):
1/4 for small and large, 1/3 for base. Generator and discriminator share the token embeddings.

    python -m bert_jax.train --config=configs/electra.py:small --workdir=runs/electra-small
"""
from bert_jax import config_lib


def _generator(hidden_size, num_attention_heads, intermediate_size, num_hidden_layers):
    return dict(hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                intermediate_size=intermediate_size, num_hidden_layers=num_hidden_layers)


ELECTRA = dict(pooler=False)
SIZES = {
    "tiny": dict(ELECTRA, embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=256, generator=_generator(32, 2, 128, 2)),
    "small": dict(ELECTRA, embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                  intermediate_size=1024, generator=_generator(64, 1, 256, 12)),
    "base": dict(ELECTRA, embedding_size=768, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, generator=_generator(256, 4, 1024, 12)),
    "large": dict(ELECTRA, embedding_size=1024, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096, generator=_generator(256, 4, 1024, 24)),
}


def get_config(size="small"):
    model = config_lib.model_config("electra", **config_lib.select_size(SIZES, size, "electra"))
    return config_lib.lock(config_lib.pretraining_config(model, objective="rtd", size=size))
