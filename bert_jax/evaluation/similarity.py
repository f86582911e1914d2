"""Zero-shot semantic similarity: the cosine of two sentences' [CLS] or mean-pooled vectors against gold scores.

    python -m bert_jax.evaluation.similarity --init=PATH --data=STS-B/dev.tsv --pooling=mean

`--init` is any checkpoint bert_jax.load_pretrained reads; `--data` a GLUE STS-B TSV (sentence1, sentence2, score
columns), local or in a bucket (gs://...). The last line printed is JSON: {"pearson": ..., "spearman": ...}
(correlations, not percentages).
"""
from __future__ import annotations

import json

import numpy as np
from absl import app, flags, logging

from bert_jax import storage
from bert_jax.evaluation import glue_metrics
from bert_jax.tasks import glue

POOLINGS = ("cls", "mean")


def cosine_similarities(pretrained, text_a: list[str], text_b: list[str], pooling: str) -> np.ndarray:
    """Cosine of each pair's sentence vectors; both sides are embedded in one pass."""
    vectors = pretrained.embed(list(text_a) + list(text_b), pooling=pooling, normalize=True)
    return np.sum(vectors[:len(text_a)] * vectors[len(text_a):], axis=-1)


def evaluate(pretrained, data_file: storage.PathLike, pooling: str) -> dict[str, float]:
    pairs = glue.read_tsv(glue.get_task("stsb"), data_file)
    cosines = cosine_similarities(pretrained, pairs.text_a, pairs.text_b, pooling)
    return {"pearson": glue_metrics.pearson(cosines, pairs.labels),
            "spearman": glue_metrics.spearman(cosines, pairs.labels), "pairs": len(cosines)}


def main(argv):
    del argv
    from bert_jax.pretrained import load_pretrained

    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)

    scores = evaluate(load_pretrained(flags.FLAGS.init, task="backbone"), flags.FLAGS.data, flags.FLAGS.pooling)
    print(f"{scores['pairs']} pairs from {flags.FLAGS.data}, {flags.FLAGS.pooling} pooling: "
          f"Pearson {scores['pearson']:.4f}, Spearman {scores['spearman']:.4f}")
    print(json.dumps({"pearson": scores["pearson"], "spearman": scores["spearman"]}))


if __name__ == "__main__":  # flags defined here, so that benchmarks can import this module with flags of their own
    flags.DEFINE_string("init", None, "A checkpoint bert_jax.load_pretrained reads.", required=True)
    flags.DEFINE_string("data", None, "A GLUE STS-B TSV file (e.g. STS-B/dev.tsv).", required=True)
    flags.DEFINE_enum("pooling", "cls", POOLINGS, "Sentence vector: the [CLS] hidden state or the mean over tokens.")
    app.run(main)
