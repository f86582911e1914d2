"""RoBERTa (Liu et al., 2019): BERT's architecture, dynamic MLM over full sentences, no NSP, byte-level BPE.

    python -m bert_jax.train --config=configs/roberta.py:base --workdir=runs/roberta-base
"""
from bert_jax import config_lib

# fairseq's vocabulary (50265) and position table: 512 positions after the padding offset of pad_token_id + 1 = 2.
ROBERTA = dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
SIZES = {
    "tiny": dict(ROBERTA, vocab_size=8000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
    "base": dict(ROBERTA, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(ROBERTA, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def get_config(size="base"):
    model = config_lib.model_config("roberta", **config_lib.select_size(SIZES, size, "roberta"))
    return config_lib.lock(config_lib.pretraining_config(model, objective="mlm", size=size))
