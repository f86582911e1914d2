"""RoBERTa (Liu et al., 2019): BERT's architecture, dynamic MLM over full sentences, no NSP, byte-level BPE, and
fairseq's position numbering (from pad_token_id + 1)."""
from bert_jax.families import Family, HfNames, Tokenizer

# fairseq's vocabulary (50265) and position table: 512 positions after the padding offset of pad_token_id + 1 = 2.
ROBERTA = dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)

FAMILY = Family(
    name="roberta",
    title="RoBERTa",
    published="2019-07",
    recipe="dynamic MLM, full sentences",
    objective="mlm",
    sizes={
        "tiny": dict(ROBERTA, vocab_size=8000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256),
        "base": dict(ROBERTA, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        "large": dict(ROBERTA, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                      intermediate_size=4096),
    },
    paper_params_millions={"base": 125, "large": 355},
    default_size="base",
    # No 50k GPT-2 vocabulary ships with the repo: set config.data.tokenizer_path for full-size runs.
    tokenizer=Tokenizer("bpe", "data/roberta-bpe8k"),
    example_kind="full_sentences",
    hf=HfNames(
        base_prefix="roberta",
        architectures={"backbone": "RobertaModel", "masked_lm": "RobertaForMaskedLM"},
        mlm=("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
        config_drops=("embedding_size", "num_hidden_groups"),
        special_token_ids={"bos_token_id": 0, "eos_token_id": 2},
    ),
    position_offset=True,
    mlm_activation="gelu",  # exact GELU in the head whatever the encoder's activation
    pair_separators=2,
    pair_token_types=False,
)
