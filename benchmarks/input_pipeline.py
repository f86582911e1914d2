"""Input pipeline throughput: sequences/s at length 128 from prepared shards through NSP pairing and dynamic masking.

    python benchmarks/input_pipeline.py [--batch_size=256] [--seconds=20]

The baseline is HF transformers' DataCollatorForLanguageModeling (the masking and padding most PyTorch scripts
use) on the same tokenized sequences, timed on the already-built examples, so it does less work than the pipeline.
The last line printed is JSON: {"sequences_per_s": ..., "baseline_sequences_per_s": ..., "ratio": ...}.
"""
import json
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import app, flags  # noqa: E402

from bert_jax import config_lib  # noqa: E402
from bert_jax.input_pipeline import prepare  # noqa: E402
from bert_jax.input_pipeline.config import REPO_ROOT  # noqa: E402
from bert_jax.input_pipeline.pipeline import PretrainingPipeline  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 256, "Sequences per batch.")
flags.DEFINE_float("seconds", 20.0, "How long to time each side (in 5 alternating windows).")


def timed(sides: dict, seconds: float, rounds: int = 5) -> dict:
    """Sequences per second of each batch iterator. The sides take turns in short windows, so that a busy machine
    slows them alike and their ratio stays meaningful."""
    counts, elapsed = dict.fromkeys(sides, 0), dict.fromkeys(sides, 0.0)
    for batches in sides.values():
        next(batches)  # warm-up: tracing, first prefetch
    for _ in range(rounds):
        for name, batches in sides.items():
            start = time.perf_counter()
            while time.perf_counter() - start < seconds / rounds:
                counts[name] += len(next(batches)["input_ids"])
            elapsed[name] += time.perf_counter() - start
    return {name: counts[name] / elapsed[name] for name in sides}


def collator_batches(pipeline: PretrainingPipeline, batch_size: int):
    """DataCollatorForLanguageModeling over the pipeline's unmasked NSP pairs, cycling endlessly."""
    from transformers import BertTokenizerFast, DataCollatorForLanguageModeling
    tokenizer = BertTokenizerFast.from_pretrained(str(pipeline.tokenizer.path.parent))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, pad_to_multiple_of=128)
    n = min(pipeline.num_examples, 64 * batch_size)
    import tensorflow as tf
    built = pipeline.examples(0, 0, tf.range(n), tf.zeros([n], tf.int32))
    examples = [dict(input_ids=ids[:length].tolist(), token_type_ids=seg[:length].tolist())
                for ids, seg, length in zip(built["input_ids"].numpy(), built["segment_ids"].numpy(),
                                            built["input_mask"].numpy().sum(1))]
    while True:
        for i in range(0, n - batch_size + 1, batch_size):
            yield collator(examples[i:i + batch_size])


def main(argv):
    del argv
    with tempfile.TemporaryDirectory() as shards:
        corpus = sorted(str(p) for p in (REPO_ROOT / "data" / "corpus").glob("*.txt"))
        vocab = str(REPO_ROOT / "data" / "bert-base-uncased" / "vocab.txt")
        totals = prepare.prepare(prepare.work_units(corpus, pathlib.Path(shards), vocab, "wordpiece", True, 50_000),
                                 num_workers=1)
        config = config_lib.load_preset("bert", "tiny")
        config.data.prepared_dir, config.data.input_files = shards, ""
        config.data.batch_size, config.data.seq_length = FLAGS.batch_size, 128
        config.masking.mode = "dynamic"
        pipeline = PretrainingPipeline(config)
        print(f"corpus: {totals['documents']} documents, {totals['tokens']} tokens, {pipeline.num_examples} "
              f"examples of 128; batch {FLAGS.batch_size}; {os.cpu_count()} CPUs", file=sys.stderr)
        rates = timed(dict(ours=pipeline.dataset(0).as_numpy_iterator(),
                           baseline=collator_batches(pipeline, FLAGS.batch_size)), FLAGS.seconds)
        ours, baseline = rates["ours"], rates["baseline"]
        print(f"bert_jax pipeline (nsp_pairs + dynamic masking): {ours:,.0f} sequences/s", file=sys.stderr)
        print(f"DataCollatorForLanguageModeling (masking + padding only): {baseline:,.0f} sequences/s",
              file=sys.stderr)
    print(json.dumps(dict(sequences_per_s=round(ours, 1), baseline_sequences_per_s=round(baseline, 1),
                          ratio=round(ours / baseline, 2))))


if __name__ == "__main__":
    app.run(main)
