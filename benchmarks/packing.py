"""Packing efficiency (real tokens / slots) of each MLM example kind on the bundled corpus.

    python benchmarks/packing.py [--family=modernbert] [--seq_lengths=128,512]

Counts one epoch of examples with the family's tiny tokenizer: full_sentences (RoBERTa's; ModernBERT's before
packed_documents) stops a sequence at the last whole sentence that fits, packed_documents fills every sequence.
The trainer logs the same ratio per step as `packing_efficiency`. The last line printed is JSON:
{"<kind>@<length>": efficiency, ...}.
"""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

from bert_jax import config_lib  # noqa: E402
from bert_jax.input_pipeline.pipeline import PretrainingPipeline  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("family", "modernbert", "Whose tiny preset (tokenizer, corpus) to count with.")
flags.DEFINE_list("seq_lengths", ["128", "512"], "Sequence lengths to count at.")
KINDS = ("full_sentences", "doc_sentences", "packed_documents")


def main(argv):
    del argv
    figures = {}
    for seq_length in map(int, FLAGS.seq_lengths):
        for kind in KINDS:
            config = config_lib.load_preset(FLAGS.family, "tiny")
            config.data.update(seq_length=seq_length, example_kind=kind)
            pipeline = PretrainingPipeline(config)
            figures[f"{kind}@{seq_length}"] = round(pipeline.examples.packing_efficiency(), 4)
            print(f"{kind:17s} seq {seq_length:4d}: {pipeline.num_examples:6d} sequences, packing efficiency "
                  f"{figures[f'{kind}@{seq_length}']:.4f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    app.run(main)
