"""Train a tokenizer on text files, with this codebase's special tokens at fixed ids.

    python -m bert_jax.input_pipeline.train_tokenizer --kind=wordpiece|sentencepiece|bpe --vocab_size=N \
        --output=DIR FILES...

Outputs: wordpiece -> DIR/vocab.txt; sentencepiece -> DIR/spiece.model (+ .vocab); bpe -> DIR/vocab.json + merges.txt.
FILES and DIR may be local or gs://: the libraries train on local files, so bucket files are copied in and out.
Special ids: wordpiece [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; sentencepiece <pad>=0 <unk>=1 [CLS]=2 [SEP]=3
[MASK]=4 (ALBERT's layout); bpe <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4 (RoBERTa's layout).
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import sentencepiece
import tokenizers
from absl import app, flags

from bert_jax import storage
from bert_jax.input_pipeline import tokenizers as tokenizers_lib

FLAGS = flags.FLAGS
# What `load_tokenizer` opens, in the output folder ("": the folder itself).
OPENED = {"wordpiece": "vocab.txt", "sentencepiece": "spiece.model", "bpe": ""}


def train(kind: str, files: list[storage.PathLike], vocab_size: int, output: storage.PathLike,
          lowercase: bool = True) -> storage.Path:
    """Train in a local folder, then copy the files to `output`; returns the path `load_tokenizer(kind, path)`
    opens."""
    missing = [os.fspath(f) for f in files if not storage.as_path(f).is_file()]
    if not files or missing:
        raise FileNotFoundError(f"training text files not found: {missing or 'none given'}")
    output = storage.make_dirs(output)
    with tempfile.TemporaryDirectory(prefix="bert_jax-tokenizer-") as folder, contextlib.ExitStack() as copies:
        # One local_copy per file: two bucket files of one name must not overwrite each other.
        local_files = [os.path.join(copies.enter_context(storage.local_copy([f])), storage.as_path(f).name)
                       for f in files]
        _train(kind, local_files, vocab_size, folder, lowercase)
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as f:
                storage.atomic_write(output / name, f.read())
    return output / OPENED[kind]


def _train(kind: str, files: list[str], vocab_size: int, output: str, lowercase: bool) -> None:
    """Train on local files into a local folder."""
    specials = list(tokenizers_lib.SPECIAL_TOKENS[kind].values())
    if kind in ("wordpiece", "bpe"):
        tokenizer = (tokenizers.BertWordPieceTokenizer(lowercase=lowercase) if kind == "wordpiece"
                     else tokenizers.ByteLevelBPETokenizer(add_prefix_space=True))
        tokenizer.train(files, vocab_size=vocab_size, special_tokens=specials, show_progress=False)
        tokenizer.save_model(output)
        return
    pad, unk, *control = specials
    sentencepiece.SentencePieceTrainer.train(
        input=",".join(files), model_prefix=os.path.join(output, "spiece"), vocab_size=vocab_size,
        model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece=pad, unk_piece=unk,
        control_symbols=control,
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
        # Bounded memory on large corpora: sample at most this many lines.
        input_sentence_size=2_000_000, shuffle_input_sentence=True, minloglevel=2)


def main(argv):
    for name in ("kind", "vocab_size", "output"):
        if FLAGS[name].value is None:
            raise app.UsageError(f"--{name} is required")
    path = train(FLAGS.kind, argv[1:], FLAGS.vocab_size, FLAGS.output, FLAGS.lowercase)
    tokenizer = tokenizers_lib.load_tokenizer(FLAGS.kind, path)
    print(f"wrote {path}: vocab_size={tokenizer.vocab_size} special ids {tokenizer.special}", file=sys.stderr)


def define_flags():
    """Command-line flags, defined only when run as a program so that importing this module is free."""
    flags.DEFINE_enum("kind", None, tokenizers_lib.KINDS, "Which tokenizer to train.")
    flags.DEFINE_integer("vocab_size", None, "Vocabulary size, special tokens included.")
    flags.DEFINE_string("output", None, "Folder to write the tokenizer files into, local or gs://.")
    flags.DEFINE_bool("lowercase", True, "Lowercase text (wordpiece: in the normalizer; sentencepiece: case folding).")


if __name__ == "__main__":
    define_flags()
    app.run(main)
