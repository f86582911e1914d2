"""Zero-shot semantic similarity: the cosine of two sentences' [CLS] or mean-pooled vectors against gold scores.

    python -m bert_jax.evaluation.similarity --init=PATH --data=data/glue/STS-B/dev.tsv --pooling=mean

`--init` is any checkpoint bert_jax.load_pretrained reads; `--data` names STS-B pairs in any form of
bert_jax.data_sources: a GLUE STS-B TSV or a parquet file of the hub's nyu-mll/glue (local or in a bucket), a
folder of either (its dev split is read), or tfds:glue/stsb[:SPLIT] (validation by default, from
--tfds_data_dir). The last line printed is JSON: {"pearson": ..., "spearman": ...}
(correlations, not percentages). Pairs with an empty sentence are skipped and counted; a correlation that is
undefined (fewer than 2 pairs, or all gold scores or all cosines equal) is an error, never a number.
"""
from __future__ import annotations

import json

import numpy as np
from absl import flags, logging

from bert_jax import cli, data_sources, sentence_embedding, storage
from bert_jax.errors import UserError
from bert_jax.evaluation import glue_metrics
from bert_jax.tasks import glue

POOLINGS = sentence_embedding.POOLINGS


class SimilarityError(UserError):
    """Pairs whose correlation with the gold scores is undefined; the message names the file and why."""


def cosine_similarities(pretrained, text_a: list[str], text_b: list[str], pooling: str | None) -> np.ndarray:
    """Cosine of each pair's sentence vectors; both sides are embedded in one pass."""
    vectors = pretrained.embed(list(text_a) + list(text_b), pooling=pooling, normalize=True)
    return np.sum(vectors[:len(text_a)] * vectors[len(text_a):], axis=-1)


def has_text(pairs: glue.Split) -> np.ndarray:
    """bool per pair: both sentences hold text (an empty sentence has no meaning to compare)."""
    return np.array([bool(a.strip() and b.strip()) for a, b in zip(pairs.text_a, pairs.text_b)], bool)


def why_undefined(gold: np.ndarray) -> str:
    """Why the correlation of 2 or more pairs has no value: one side is constant."""
    return "all gold scores are equal" if np.ptp(gold) == 0 else "the model gives every pair the same cosine"


def read_pairs(data: str, tfds_data_dir: str | None = None) -> glue.Split:
    """The STS-B pairs --data names: a TSV or parquet file, a folder of GLUE STS-B TSVs or the hub's nyu-mll/glue
    (the dev split), or tfds:glue/stsb[:SPLIT] (validation unless SPLIT is given)."""
    task = glue.get_task("stsb")
    if name := data_sources.tfds_name(data):
        dataset = glue.tfds_dataset(task, data_sources.TfdsName(name.name), "--data")
        return glue.read_tfds(task, dataset, name.split or "validation", tfds_data_dir, "--data")
    path = storage.as_path(data)
    if path.suffix == ".parquet" and path.is_file():
        return glue.read_parquet(task, [path], labelled=True)
    if path.is_file():
        return glue.read_tsv(task, path)
    if not path.is_dir():
        raise glue.missing_data(task, data, "--data", tfds_data_dir)
    return glue.load_split(task, "dev", data, tfds_data_dir, flag="--data")[0]


def evaluate(pretrained, data: storage.PathLike, pooling: str | None,
             tfds_data_dir: str | None = None) -> dict[str, float]:
    """Pearson and Spearman correlation of the pairs' cosines with the gold scores, the pairs scored and skipped."""
    pairs = read_pairs(str(data), tfds_data_dir)
    usable = has_text(pairs)
    kept, skipped = np.flatnonzero(usable), np.flatnonzero(~usable)
    if len(skipped):
        logging.warning("%s: skipped %d of %d pairs with an empty sentence (first: pair %d)", data, len(skipped),
                        len(usable), skipped[0] + 1)
    if len(kept) < 2:
        raise SimilarityError(f"{data}: {len(kept)} pair(s) with text in both sentences; a correlation needs at "
                              "least 2")
    gold = pairs.labels[kept]
    cosines = cosine_similarities(pretrained, [pairs.text_a[i] for i in kept], [pairs.text_b[i] for i in kept],
                                  pooling)
    scores = {"pearson": glue_metrics.pearson(cosines, gold), "spearman": glue_metrics.spearman(cosines, gold)}
    if not np.all(np.isfinite(list(scores.values()))):
        raise SimilarityError(f"{data}: the correlation over {len(kept)} pairs is undefined: "
                              f"{why_undefined(gold)}")
    return {**scores, "pairs": len(kept), "skipped": len(skipped)}


def main(argv):
    del argv
    from bert_jax.pretrained import load_pretrained

    f = flags.FLAGS
    scores = evaluate(load_pretrained(f.init, head="backbone"), f.data, f.pooling, f.tfds_data_dir)
    print(f"{scores['pairs']} pairs from {f.data} ({scores['skipped']} skipped), {f.pooling or 'the checkpoint'} "
          f"pooling: Pearson {scores['pearson']:.4f}, Spearman {scores['spearman']:.4f}")
    print(json.dumps({"pearson": scores["pearson"], "spearman": scores["spearman"]}))


if __name__ == "__main__":  # flags defined here, so that benchmarks can import this module with flags of their own
    flags.DEFINE_string("init", None, "A checkpoint bert_jax.load_pretrained reads.", required=True)
    flags.DEFINE_string("data", None, "STS-B pairs: a TSV or parquet file, a folder of them (its dev split) or "
                        "tfds:glue/stsb[:SPLIT].", required=True)
    flags.DEFINE_string("tfds_data_dir", None, "Where TFDS datasets are built (TFDS's default folder if unset).")
    flags.DEFINE_enum("pooling", None, POOLINGS, "Sentence vector: the [CLS] hidden state or the mean over tokens "
                      "(default: the checkpoint's pooling, e.g. a sentence-transformers folder's; else [CLS]).")
    cli.run(main)
