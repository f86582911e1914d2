"""Print the training examples of an epoch as JSON lines, exactly as the trainer would receive them.

    python -m bert_jax.input_pipeline.inspect --config=configs/bert.py:tiny --epoch=0 --num_batches=1 \
        [--config.masking.mode=dynamic ...] [--process_index=0 --process_count=1]

One line per example, keys: tokens, input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids
(the original ids), masked_lm_weights, and next_sentence_label / sentence_order_label / packing_segment_ids where
the example kind has them. Padding is trimmed from the per-token lists and the prediction lists.
"""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Iterator

from absl import flags
from ml_collections import config_flags

from bert_jax import cli

if TYPE_CHECKING:
    from bert_jax.input_pipeline.pipeline import PretrainingPipeline

FLAGS = flags.FLAGS

# Batch keys in the order the JSON lines list them.
KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights",
        "next_sentence_labels", "sentence_order_labels", "packing_segment_ids")
# Batch keys with one value per example, renamed to the singular the JSON lines use.
LABELS = {"next_sentence_labels": "next_sentence_label", "sentence_order_labels": "sentence_order_label"}


def example_records(pipeline: PretrainingPipeline, epoch: int, num_batches: int) -> Iterator[dict]:
    """One dict per example of the first `num_batches` batches of `epoch`."""
    batches = pipeline.dataset(epoch * pipeline.num_examples).take(num_batches).as_numpy_iterator()
    for batch in batches:
        for i in range(len(batch["input_ids"])):
            length = int(batch["input_mask"][i].sum())
            predictions = int(batch["masked_lm_weights"][i].sum())
            record = dict(tokens=[pipeline.tokenizer.id_to_token(t) for t in batch["input_ids"][i][:length]])
            for key, value in ((k, batch[k]) for k in KEYS if k in batch):
                if key in LABELS:
                    record[LABELS[key]] = int(value[i])
                else:
                    record[key] = value[i][:predictions if key.startswith("masked_lm") else length].tolist()
            yield record


def main(argv):
    del argv
    from bert_jax.input_pipeline.pipeline import PretrainingPipeline  # TensorFlow: after cli.without_keras

    pipeline = PretrainingPipeline(FLAGS.config, FLAGS.process_index, FLAGS.process_count)
    for record in example_records(pipeline, FLAGS.epoch, FLAGS.num_batches):
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")


def define_flags():
    """Command-line flags, defined only when run as a program so that importing this module is free."""
    config_flags.DEFINE_config_file("config", None, "A pretraining config, e.g. configs/bert.py:tiny.",
                                    lock_config=True)
    flags.DEFINE_integer("epoch", 0, "Which epoch's examples to show (they start at position epoch * num_examples).")
    flags.DEFINE_integer("num_batches", 1, "How many batches of that epoch.")
    flags.DEFINE_integer("process_index", 0, "Show this process's examples.")
    flags.DEFINE_integer("process_count", 1, "Number of processes the data is split across.")
    flags.mark_flags_as_required(["config"])


if __name__ == "__main__":
    define_flags()
    cli.run(main)
