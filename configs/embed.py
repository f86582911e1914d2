"""Contrastive fine-tuning into a sentence embedding model (`:base` | `:tiny`), from any pretrained checkpoint.

    python -m bert_jax.embed_train --config=configs/embed.py:base --workdir=runs/embed \
        --config.init=PATH --config.train_files=pairs.jsonl [--config.eval_beir_dir=DIR] \
        [--config.eval_sts_file=tfds:glue/stsb]

Pairs are JSON lines or parquet rows with `query`, `positive` and optionally `negative` texts
(`python -m bert_jax.tasks.squad_retrieval` writes them from SQuAD). `base` scores by cosine x 20 (temperature
0.05, the default of sentence-transformers' MultipleNegativesRankingLoss) over mean-pooled vectors, with batch 64,
learning rate 2e-5 and 10% warmup; `tiny` is for tests and CPU demos. docs/embeddings.md has the keys.
"""
from bert_jax import config_lib

PRESETS = {
    "base": dict(batch_size=64, learning_rate=2e-5, max_seq_length=256, max_query_length=64),
    "tiny": dict(batch_size=32, learning_rate=1e-4, max_seq_length=128, max_query_length=32),
}


def get_config(preset="base"):
    sizes = config_lib.select_size(PRESETS, preset, "embed")
    config = config_lib.finetune_config(task="embed", max_seq_length=sizes["max_seq_length"],
                                        batch_size=sizes["batch_size"], learning_rate=sizes["learning_rate"],
                                        num_epochs=1.0)
    del config["task"]  # an embedding run trains no task head: its checkpoints load as the backbone
    config.objective = "contrastive"
    config.length_bucket = 32  # batches are cut to their longest text, per field
    config.train_files = ""  # comma-separated globs of JSON lines / parquet pair files, local or gs://
    config.max_query_length = sizes["max_query_length"]  # max_seq_length bounds positives, negatives, the export
    config.pooling = "mean"  # cls | mean: the sentence vector, trained and exported
    config.normalize = True  # exported vectors have unit length (training always scores by cosine)
    config.temperature = 0.05  # scores are cosine / temperature; the start value when learned
    config.learn_temperature = False
    config.symmetric = False  # also score each positive against all queries, and average the two losses
    config.eval_beir_dir = ""  # a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv) scored after training
    # STS-B pairs whose Spearman correlation is reported after training: any --data of evaluation.similarity (a
    # TSV, parquet, tfds:glue/stsb)
    config.eval_sts_file = ""
    return config_lib.lock(config)
