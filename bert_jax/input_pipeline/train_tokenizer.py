"""Train a tokenizer on text files, with this codebase's special tokens at fixed ids.

    python -m bert_jax.input_pipeline.train_tokenizer --kind=wordpiece|sentencepiece|bpe --vocab_size=N \
        --output=DIR FILES...

Outputs: wordpiece -> DIR/vocab.txt; sentencepiece -> DIR/spiece.model (+ .vocab); bpe -> DIR/vocab.json + merges.txt.
FILES and DIR may be local or gs://; FILES are text, JSON lines or parquet files (--text_key), globs or folders of
parquet files, as `prepare` takes them. The text is read as `prepare`
reads it (documents.read_documents: long lines cut, invalid UTF-8 skipped, each counted and reported), and the
tokenizer learns from a uniform random sample of --sample_sentences of its sentences drawn in one pass (reservoir
sampling, the same for the same --seed), so memory holds the sample whatever the corpus (160 GB included); the files
are written locally, then copied out.
Special ids: wordpiece [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; sentencepiece <pad>=0 <unk>=1 [CLS]=2 [SEP]=3
[MASK]=4 (ALBERT's layout); bpe <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4 (RoBERTa's layout).
"""
from __future__ import annotations

import collections
import os
import random
import sys
import tempfile
from typing import Iterable, Iterator

import sentencepiece
import tokenizers
from absl import flags

from bert_jax import cli, storage
from bert_jax.input_pipeline import documents, prepare_units
from bert_jax.input_pipeline import tokenizers as tokenizers_lib

FLAGS = flags.FLAGS
# What `load_tokenizer` opens, in the output folder ("": the folder itself).
OPENED = {"wordpiece": "vocab.txt", "sentencepiece": "spiece.model", "bpe": ""}
SAMPLE_SENTENCES = 2_000_000  # ~300 MB of sentences; as many as sentencepiece's own default sample


def train(kind: str, files: list[storage.PathLike], vocab_size: int, output: storage.PathLike,
          lowercase: bool = True, counts: collections.Counter | None = None, sample_size: int = SAMPLE_SENTENCES,
          seed: int = 0, text_key: str = "text") -> storage.Path:
    """Train in a local folder on a sample of the sentences, then copy the files to `output`; returns the path
    `load_tokenizer(kind, path)` opens. Skipped or cut input is added to `counts`."""
    documents.require_files(files, "train_tokenizer FILES")
    output = storage.make_dirs(output)
    counts = documents.new_counts() if counts is None else counts
    sample = sample_sentences(text_lines(files, counts, text_key), sample_size, seed)
    with tempfile.TemporaryDirectory(prefix="bert_jax-tokenizer-") as folder:
        _train(kind, iter(sample), vocab_size, folder, lowercase)
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as f:
                storage.atomic_write(output / name, f.read())
    return output / OPENED[kind]


def text_lines(files: list[storage.PathLike], counts: collections.Counter, text_key: str = "text") -> Iterator[str]:
    """The sentences (non-blank lines) of all files' documents, one at a time."""
    return (line for f in files for doc in documents.read_documents(f, counts, text_key) for line in doc)


def sample_sentences(sentences: Iterable[str], size: int, seed: int) -> list[str]:
    """A uniform random sample of `size` sentences (all of them, in order, when there are fewer) drawn in one pass
    that holds only the sample (reservoir sampling, Algorithm R); the same for the same sentences and seed."""
    rng, sample = random.Random(seed), []
    for i, sentence in enumerate(sentences):
        if i < size:
            sample.append(sentence)
        elif (j := rng.randrange(i + 1)) < size:
            sample[j] = sentence
    return sample


def _train(kind: str, lines: Iterator[str], vocab_size: int, output: str, lowercase: bool) -> None:
    """Train on lines of text into a local folder."""
    specials = list(tokenizers_lib.SPECIAL_TOKENS[kind].values())
    if kind in ("wordpiece", "bpe"):
        tokenizer = (tokenizers.BertWordPieceTokenizer(lowercase=lowercase) if kind == "wordpiece"
                     else tokenizers.ByteLevelBPETokenizer(add_prefix_space=True))
        tokenizer.train_from_iterator(lines, vocab_size=vocab_size, special_tokens=specials, show_progress=False)
        tokenizer.save_model(output)
        return
    pad, unk, *control = specials
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=lines, model_prefix=os.path.join(output, "spiece"), vocab_size=vocab_size,
        model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece=pad, unk_piece=unk,
        control_symbols=control,
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
        max_sentence_length=documents.MAX_LINE_BYTES,  # a piece of a long line at most; the sample is all read
        minloglevel=2)


def main(argv):
    counts = documents.new_counts()
    files = prepare_units.expand_inputs(argv[1:])  # globs and folders of parquet files, as prepare takes them
    if tfds := [str(f) for f in files if not isinstance(f, str)]:
        raise prepare_units.PrepareError(f"{tfds[0]}: train_tokenizer reads files; prepare reads TFDS datasets")
    path = train(FLAGS.kind, files, FLAGS.vocab_size, FLAGS.output, FLAGS.lowercase, counts,
                 FLAGS.sample_sentences, FLAGS.seed, FLAGS.text_key)
    tokenizer = tokenizers_lib.load_tokenizer(FLAGS.kind, path)
    skipped = {k: counts[k] for k in documents.SKIP_COUNTS if counts[k]}
    print(f"wrote {path}: vocab_size={tokenizer.vocab_size} special ids {tokenizer.special}; skipped or cut: "
          f"{skipped or 'none'}", file=sys.stderr)


def define_flags():
    """Command-line flags, defined only when run as a program so that importing this module is free."""
    flags.DEFINE_enum("kind", None, tokenizers_lib.KINDS, "Which tokenizer to train.")
    flags.DEFINE_integer("vocab_size", None, "Vocabulary size, special tokens included.")
    flags.DEFINE_string("output", None, "Folder to write the tokenizer files into, local or gs://.")
    flags.DEFINE_bool("lowercase", True, "Lowercase text (wordpiece: in the normalizer; sentencepiece: case folding).")
    flags.DEFINE_integer("sample_sentences", SAMPLE_SENTENCES, "Train on a uniform sample of this many sentences.")
    flags.DEFINE_integer("seed", 0, "Seed of the sample.")
    flags.DEFINE_string("text_key", "text", "The field with the text in JSON-lines inputs (*.jsonl, *.json).")
    flags.mark_flags_as_required(["kind", "vocab_size", "output"])


if __name__ == "__main__":
    define_flags()
    cli.run(main)
