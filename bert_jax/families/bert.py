"""BERT (Devlin et al., 2019): the post-LN encoder, MLM + next-sentence prediction on static masks, WordPiece."""
from bert_jax.families import Family, HfNames, Tf1Names, Tokenizer

FAMILY = Family(
    name="bert",
    title="BERT",
    published="2018-10",
    recipe="MLM + NSP, static masks",
    objective="mlm_nsp",
    sizes={
        "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
        "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    },
    paper_params_millions={"base": 110, "large": 340},
    default_size="base",
    tokenizer=Tokenizer("wordpiece", "data/bert-base-uncased/vocab.txt", "data/bert-base-uncased/vocab.txt"),
    example_kind="nsp_pairs",
    masking=dict(mode="static"),
    hf=HfNames(
        base_prefix="bert",
        architectures={"backbone": "BertModel", "pretraining": "BertForPreTraining", "masked_lm": "BertForMaskedLM"},
        mlm=("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
        sentence_pair="cls.seq_relationship",
        config_drops=("embedding_size", "num_hidden_groups"),
    ),
    tf1=Tf1Names(marker=r"^bert/encoder/layer_\d+/",  # ALBERT's release keeps the bert/ scope, with layer groups
                 rules=((r"/layer_(\d+)/", r"/layer/\1/"),), config_file="bert_config.json"),
)
