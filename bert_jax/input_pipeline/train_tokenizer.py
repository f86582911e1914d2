"""Train a tokenizer on text files, with this codebase's special tokens at fixed ids.

    python -m bert_jax.input_pipeline.train_tokenizer --kind=wordpiece|sentencepiece|bpe --vocab_size=N \
        --output=DIR FILES...

Outputs: wordpiece -> DIR/vocab.txt; sentencepiece -> DIR/spiece.model (+ .vocab); bpe -> DIR/vocab.json + merges.txt.
FILES and DIR may be local or gs://. The text is read as `prepare` reads it (documents.file_lines: memory bounded,
long lines cut, invalid UTF-8 skipped, each counted and reported); the files are written locally, then copied out.
Special ids: wordpiece [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; sentencepiece <pad>=0 <unk>=1 [CLS]=2 [SEP]=3
[MASK]=4 (ALBERT's layout); bpe <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4 (RoBERTa's layout).
"""
from __future__ import annotations

import collections
import os
import sys
import tempfile
from typing import Iterator

import sentencepiece
import tokenizers
from absl import flags

from bert_jax import cli, storage
from bert_jax.input_pipeline import documents
from bert_jax.input_pipeline import tokenizers as tokenizers_lib

FLAGS = flags.FLAGS
# What `load_tokenizer` opens, in the output folder ("": the folder itself).
OPENED = {"wordpiece": "vocab.txt", "sentencepiece": "spiece.model", "bpe": ""}


def train(kind: str, files: list[storage.PathLike], vocab_size: int, output: storage.PathLike,
          lowercase: bool = True, counts: collections.Counter | None = None) -> storage.Path:
    """Train in a local folder, then copy the files to `output`; returns the path `load_tokenizer(kind, path)`
    opens. Skipped or cut input is added to `counts`."""
    documents.require_files(files, "train_tokenizer FILES")
    output = storage.make_dirs(output)
    counts = documents.new_counts() if counts is None else counts
    with tempfile.TemporaryDirectory(prefix="bert_jax-tokenizer-") as folder:
        _train(kind, text_lines(files, counts), vocab_size, folder, lowercase)
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as f:
                storage.atomic_write(output / name, f.read())
    return output / OPENED[kind]


def text_lines(files: list[storage.PathLike], counts: collections.Counter) -> Iterator[str]:
    """The non-blank lines of all files, one at a time."""
    return (line for f in files for line in documents.file_lines(f, counts) if line)


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
        # Bounded memory on large corpora: sample at most this many lines, each at most one piece of a long line.
        input_sentence_size=2_000_000, shuffle_input_sentence=True, max_sentence_length=documents.MAX_LINE_BYTES,
        minloglevel=2)


def main(argv):
    counts = documents.new_counts()
    path = train(FLAGS.kind, argv[1:], FLAGS.vocab_size, FLAGS.output, FLAGS.lowercase, counts)
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
    flags.mark_flags_as_required(["kind", "vocab_size", "output"])


if __name__ == "__main__":
    define_flags()
    cli.run(main)
