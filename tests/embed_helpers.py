"""Shared by the embedding tests: a tiny random BERT saved as an HF folder with the real bert-base-uncased
vocabulary, and the SQuAD retrieval sample (data/) as a BEIR folder with training pairs."""
from __future__ import annotations

import pathlib

import jax
import train_helpers  # noqa: F401 - keeps compiled programs across runs (XLA_CACHE_DIR), as the trainer tests do

import bert_jax
from bert_jax import config_lib, modeling
from bert_jax.input_pipeline import tokenizers
from bert_jax.tasks import squad_retrieval

ROOT = pathlib.Path(__file__).parent.parent
DATA = pathlib.Path(__file__).parents[1] / "data"
RETRIEVAL_SAMPLE = DATA / "squad" / "dev-v1.1-retrieval-sample.json"
STSB_DEV = DATA / "glue" / "STS-B" / "dev.tsv"


def tiny_bert_dir(folder: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """A randomly initialised 2-layer, 32-wide BERT backbone as an HF folder, with vocab.txt."""
    config = config_lib.model_config("bert", vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                                     embedding_size=32)
    params = modeling.init_params(modeling.backbone(config), jax.random.key(seed))
    tokenizer = tokenizers.load_tokenizer("wordpiece", ROOT / "data" / "bert-base-uncased" / "vocab.txt")
    return bert_jax.save_pretrained(bert_jax.Pretrained(config, "backbone", params, tokenizer), folder, format="hf")


def squad_folder(folder: pathlib.Path, articles: str = ":") -> pathlib.Path:
    """The retrieval sample's chosen articles in BEIR's layout, plus pairs.jsonl."""
    return squad_retrieval.write_folder(folder, *squad_retrieval.build(RETRIEVAL_SAMPLE, articles))
