"""ELECTRA (Clark et al., 2020): a small MLM generator fills the masks, the discriminator detects replaced tokens.

The generator sizes follow the paper's Table 7 ("generator size" multiplies hidden size, FFN size and heads):
1/4 for small and large, 1/3 for base. Generator and discriminator share the token embeddings.
"""
from bert_jax.families import Family, HfNames, Tf1Names, Tokenizer


def _generator(hidden_size, num_attention_heads, intermediate_size, num_hidden_layers):
    return dict(hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                intermediate_size=intermediate_size, num_hidden_layers=num_hidden_layers)


ELECTRA = dict(pooler=False)

FAMILY = Family(
    name="electra",
    title="ELECTRA",
    published="2020-03",
    recipe="replaced-token detection",
    objective="rtd",
    sizes={
        "tiny": dict(ELECTRA, embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, generator=_generator(32, 2, 128, 2)),
        "small": dict(ELECTRA, embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                      intermediate_size=1024, generator=_generator(64, 1, 256, 12)),
        "base": dict(ELECTRA, embedding_size=768, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, generator=_generator(256, 4, 1024, 12)),
        "large": dict(ELECTRA, embedding_size=1024, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                      intermediate_size=4096, generator=_generator(256, 4, 1024, 24)),
    },
    paper_params_millions={"small": 14, "base": 110, "large": 335},
    default_size="small",
    tokenizer=Tokenizer("wordpiece", "data/bert-base-uncased/vocab.txt", "data/bert-base-uncased/vocab.txt"),
    # ELECTRA's own data builder packs sentences without crossing documents.
    example_kind="doc_sentences",
    # The generator's inputs: 85% [MASK], 15% kept, none random.
    masking=dict(mask_token_prob=0.85, random_token_prob=0.0),
    hf=HfNames(
        base_prefix="electra",
        architectures={"backbone": "ElectraModel", "generator": "ElectraForMaskedLM",
                       "discriminator": "ElectraForPreTraining"},
        mlm=("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias"),
        discriminator=("discriminator_predictions.dense", "discriminator_predictions.dense_prediction"),
        pooler=None,
        config_drops=("num_hidden_groups",),
    ),
    # The generator's encoder lives under generator/; tf_checkpoint.split_electra moves it to its own state dict.
    tf1=Tf1Names(marker=r"^(electra|generator)/", rules=(
        (r"/layer_(\d+)/", r"/layer/\1/"),
        (r"^discriminator_predictions/dense_1/", "discriminator_predictions/dense_prediction/"),
        (r"^generator_predictions/output_bias$", "generator_lm_head/bias"),
    )),
    factorized_embeddings=True,
    mlm_activation="gelu",
    has_generator=True,
)
