"""The three tokenizer kinds behind one interface: encode, decode, special-token ids and word starts.

WordPiece (BERT, ELECTRA) is the HF `tokenizers` pipeline that BertTokenizerFast runs, so ids match it exactly;
SentencePiece (ALBERT) wraps `sentencepiece`; byte-level BPE (RoBERTa) is `tokenizers`' ByteLevelBPE. The pipeline
only needs `encode_batch`, the five special ids and `word_start_table` (for whole-word and n-gram masking in the graph).
Tokenizer files may be local or in a bucket (gs://...): bert_jax reads them and hands the libraries bytes or a
local copy.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import sentencepiece
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from bert_jax import storage
from bert_jax.errors import UserError

KINDS = ("wordpiece", "sentencepiece", "bpe")
# Special tokens per kind, in the id order train_tokenizer gives them (roles: pad, unk, cls, sep, mask).
SPECIAL_TOKENS = {
    "wordpiece": dict(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]"),
    "sentencepiece": dict(pad="<pad>", unk="<unk>", cls="[CLS]", sep="[SEP]", mask="[MASK]"),
    "bpe": dict(cls="<s>", pad="<pad>", sep="</s>", unk="<unk>", mask="<mask>"),
}


class TokenizerError(UserError, ValueError):
    """A tokenizer file that cannot be used; the message names the file."""


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int


class Tokenizer:
    """Common interface; subclasses wrap one library each."""

    kind: str
    path: storage.Path
    vocab_size: int
    special: SpecialIds

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids) -> str:
        raise NotImplementedError

    def id_to_token(self, token_id: int) -> str:
        raise NotImplementedError

    def is_word_start(self, token: str) -> bool:
        """Whether a vocabulary entry begins a word (as opposed to continuing the previous token's word)."""
        raise NotImplementedError

    def word_start_table(self) -> np.ndarray:
        """bool[vocab_size]: entry i begins a word. Whole-word masking looks ids up in it inside the tf graph."""
        table = np.array([self.is_word_start(self.id_to_token(i)) for i in range(self.vocab_size)], dtype=bool)
        table[list(dataclasses.astuple(self.special))] = True
        return table

    def _special_ids(self, token_to_id) -> SpecialIds:
        """Look up this kind's special tokens; a vocabulary without them cannot build examples, so it is an error."""
        names = SPECIAL_TOKENS[self.kind]
        ids = {role: token_to_id(token) for role, token in names.items()}
        missing = [names[role] for role, i in ids.items() if i is None]
        if missing:
            raise TokenizerError(f"{self.path}: the {self.kind} vocabulary lacks the special token(s) {missing}; "
                                 f"retrain it with `python -m bert_jax.input_pipeline.train_tokenizer` or add them")
        return SpecialIds(**ids)


class _HFTokenizer(Tokenizer):
    """WordPiece and byte-level BPE: both are `tokenizers.Tokenizer` pipelines."""

    def __init__(self, kind: str, path: storage.Path, backend: tokenizers.Tokenizer):
        self.kind, self.path, self._backend = kind, path, backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.special = self._special_ids(backend.token_to_id)

    def encode_batch(self, texts):
        return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def id_to_token(self, token_id):
        return self._backend.id_to_token(int(token_id))


class WordPieceTokenizer(_HFTokenizer):
    """BERT's uncased (or cased) WordPiece, built the way BertTokenizerFast builds it from a vocab.txt."""

    def __init__(self, vocab_file: storage.Path, lowercase: bool = True):
        vocab = _read_wordpiece_vocab(vocab_file)
        backend = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
        backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                        strip_accents=None, lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        super().__init__("wordpiece", vocab_file, backend)

    def is_word_start(self, token):
        return not token.startswith("##")


class ByteLevelBPETokenizer(_HFTokenizer):
    """RoBERTa's byte-level BPE. Every line gets a prefix space, so its first word is spelled like any other word."""

    def __init__(self, directory: storage.Path):
        files = [directory / "vocab.json", directory / "merges.txt"]
        for f in files:
            if not f.exists():
                raise TokenizerError(f"{f} not found: a byte-level BPE tokenizer is a folder with vocab.json and "
                                     "merges.txt")
        with storage.local_copy(files) as folder:  # the library reads these two files from local paths only
            vocab, merges = (os.path.join(folder, f.name) for f in files)
            backend = tokenizers.ByteLevelBPETokenizer(vocab, merges, add_prefix_space=True)
        super().__init__("bpe", directory, backend)

    def is_word_start(self, token):
        return token.startswith("\u0120")  # 'Ġ', the byte-level spelling of a leading space


class SentencePieceTokenizer(Tokenizer):
    """ALBERT's sentencepiece model; case folding, if any, is part of the model's normalizer."""

    def __init__(self, model_file: storage.Path):
        self.kind, self.path = "sentencepiece", model_file
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=model_file.read_bytes())
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"{model_file}: not a sentencepiece model ({e})") from e
        self.vocab_size = self._sp.get_piece_size()
        self.special = self._special_ids(self._piece_id)

    def _piece_id(self, piece):
        i = self._sp.piece_to_id(piece)
        return i if self._sp.id_to_piece(i) == piece else None

    def encode_batch(self, texts):
        return self._sp.encode(list(texts), out_type=int)

    def decode(self, ids):
        return self._sp.decode([int(i) for i in ids])

    def id_to_token(self, token_id):
        return self._sp.id_to_piece(int(token_id))

    def is_word_start(self, token):
        return token.startswith("\u2581")  # '▁', sentencepiece's word-boundary mark


def load_tokenizer(kind: str, path: storage.PathLike, lowercase: bool = True) -> Tokenizer:
    """Open a tokenizer: a vocab.txt (wordpiece), a .model (sentencepiece) or a vocab.json+merges.txt folder (bpe)."""
    path = storage.as_path(path)
    if kind not in KINDS:
        raise TokenizerError(f"unknown tokenizer kind {kind!r}; choose one of {KINDS}")
    if not path.exists():
        raise TokenizerError(f"tokenizer file {path} does not exist")
    if kind == "wordpiece":
        return WordPieceTokenizer(path, lowercase)
    if kind == "sentencepiece":
        return SentencePieceTokenizer(path)
    return ByteLevelBPETokenizer(path if path.is_dir() else path.parent)


def load_tokenizer_json(file: storage.PathLike) -> Tokenizer:
    """An HF tokenizer.json, as model folders ship it, behind the same interface (without padding or truncation,
    which callers do per batch)."""
    file = storage.as_path(file)
    backend = tokenizers.Tokenizer.from_str(file.read_text(encoding="utf-8"))
    backend.no_padding()
    backend.no_truncation()
    kind = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "sentencepiece"}.get(type(backend.model).__name__)
    if kind is None:
        raise TokenizerError(f"{file}: a {type(backend.model).__name__} tokenizer; expected WordPiece, BPE or Unigram")
    return _HFTokenizer(kind, file, backend)


def hf_tokenizer_files(tokenizer: Tokenizer, pair_separators: int, pair_token_types: bool,
                       max_length: int) -> dict[str, str]:
    """The files transformers' AutoTokenizer reads beside the vocabulary: tokenizer_config.json (the special tokens,
    the longest input), and for WordPiece and byte-level BPE a tokenizer.json, the whole pipeline with the special
    tokens and the family's [CLS] a [SEP] (b [SEP]) template. From the vocabulary files alone a cased WordPiece
    loads lowercased (in bert_jax too) and a ModernBERT's BPE not at all. ALBERT's sentencepiece model holds its
    own normalization: the config tells AlbertTokenizer to add none (no lowercasing, accents kept)."""
    names = SPECIAL_TOKENS[tokenizer.kind]
    config = {f"{role}_token": token for role, token in names.items()} | {"model_max_length": max_length}
    if not isinstance(tokenizer, _HFTokenizer):
        config.update(tokenizer_class="AlbertTokenizer", do_lower_case=False, keep_accents=True)
        return {"tokenizer_config.json": json.dumps(config, indent=2)}
    backend = tokenizers.Tokenizer.from_str(tokenizer._backend.to_str())
    # RoBERTa's <mask> takes the space before it, so "a <mask>" asks for a word as it is spelled mid-sentence.
    backend.add_special_tokens([tokenizers.AddedToken(token, special=True, lstrip=tokenizer.kind == "bpe"
                                                      and role == "mask") for role, token in names.items()])
    cls, sep = names["cls"], names["sep"]
    second = 1 if pair_token_types else 0
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A " + f"{sep} " * pair_separators + f"$B:{second} {sep}:{second}",
        special_tokens=[(cls, tokenizer.special.cls), (sep, tokenizer.special.sep)])
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_input_names"] = ["input_ids", *(["token_type_ids"] if pair_token_types else []), "attention_mask"]
    return {"tokenizer.json": backend.to_str(), "tokenizer_config.json": json.dumps(config, indent=2)}


def infer_kind(path: storage.PathLike) -> str:
    """The tokenizer kind a path holds, from its name: *.txt wordpiece, *.model sentencepiece, a folder bpe."""
    path = storage.as_path(path)
    if path.is_dir() or path.name in ("vocab.json", "merges.txt"):
        return "bpe"
    if path.suffix == ".model":
        return "sentencepiece"
    if path.suffix == ".txt":
        return "wordpiece"
    raise TokenizerError(f"cannot tell the tokenizer kind of {path}: expected a vocab.txt, a .model or a folder "
                         "with vocab.json and merges.txt")


def _read_wordpiece_vocab(vocab_file: storage.Path) -> dict[str, int]:
    """One token per line, id = line number (BERT's format)."""
    vocab = {}
    with vocab_file.open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            vocab.setdefault(line.rstrip("\n"), i)
    if not vocab:
        raise TokenizerError(f"{vocab_file}: empty vocabulary")
    return vocab

