"""ALBERT (Lan et al., 2020): factorized embeddings (E=128), one set of layer weights for all layers, MLM + SOP
with n-gram masking, sentencepiece, trained with LAMB."""
from bert_jax.families import Family, HfNames, Tf1Names, Tokenizer

# The v2 recipe: 30k sentencepiece vocabulary, gelu_new, no dropout, all layers in one shared group.
ALBERT = dict(vocab_size=30000, embedding_size=128, hidden_act="gelu_new", hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0, num_hidden_groups=1)

FAMILY = Family(
    name="albert",
    title="ALBERT",
    published="2019-09",
    recipe="MLM + SOP, n-gram masks, E < H, shared layers",
    objective="mlm_sop",
    sizes={
        "tiny": dict(ALBERT, vocab_size=8000, embedding_size=32, hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=256),
        "base": dict(ALBERT, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        "large": dict(ALBERT, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                      intermediate_size=4096),
        "xlarge": dict(ALBERT, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                       intermediate_size=8192),
        "xxlarge": dict(ALBERT, hidden_size=4096, num_hidden_layers=12, num_attention_heads=64,
                        intermediate_size=16384),
    },
    paper_params_millions={"base": 12, "large": 18, "xlarge": 60, "xxlarge": 235},
    default_size="base",
    # No 30k ALBERT vocabulary ships with the repo: set config.data.tokenizer_path for full-size runs.
    tokenizer=Tokenizer("sentencepiece", "data/albert-sp8k/spiece.model"),
    example_kind="sop_pairs",
    masking=dict(whole_word=True, ngram_max=3),
    optimizer="lamb",
    hf=HfNames(
        base_prefix="albert",
        architectures={"backbone": "AlbertModel", "pretraining": "AlbertForPreTraining",
                       "masked_lm": "AlbertForMaskedLM"},
        layer="encoder.albert_layer_groups.{index}.albert_layers.0",
        layer_modules={"query": "attention.query", "key": "attention.key", "value": "attention.value",
                       "attention_output": "attention.dense", "attention_norm": "attention.LayerNorm",
                       "intermediate": "ffn", "output": "ffn_output", "output_norm": "full_layer_layer_norm"},
        embedding_projection="encoder.embedding_hidden_mapping_in",
        pooler="pooler",
        mlm=("predictions.dense", "predictions.LayerNorm", "predictions.bias"),
        sentence_pair="sop_classifier.classifier",
        config_extra={"inner_group_num": 1},
        special_token_ids={"bos_token_id": 2, "eos_token_id": 3},
    ),
    tf1=Tf1Names(marker=r"^bert/encoder/transformer/group_", rules=(
        (r"^bert/", "albert/"),
        (r"/transformer/group_(\d+)/inner_group_0/", r"/albert_layer_groups/\1/albert_layers/0/"),
        (r"/attention(_1)?/self/", "/attention/"),
        (r"/attention(_1)?/output/dense/", "/attention/dense/"),
        (r"/albert_layers/0/LayerNorm/", "/albert_layers/0/attention/LayerNorm/"),
        (r"/LayerNorm_1/", "/full_layer_layer_norm/"),
        (r"/ffn(_1)?/intermediate/dense/", "/ffn/"),
        (r"/ffn(_1)?/intermediate/output/dense/", "/ffn_output/"),
        (r"^albert/pooler/dense/", "albert/pooler/"),
        (r"^cls/predictions/(transform/)?", "predictions/"),
        (r"^cls/seq_relationship/", "sop_classifier/classifier/"),
    ), config_file="albert_config.json"),
    always_projects_embeddings=True,
    factorized_embeddings=True,
    shared_layers=True,
)
