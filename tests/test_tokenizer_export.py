"""An exported model folder carries its tokenizer so that transformers' AutoTokenizer encodes as bert_jax does (the
special tokens, the family's pair layout and token types, the casing) and load_pretrained reads it back unchanged."""
import json
import warnings

import jax
import numpy as np
import pytest
import transformers
from flax import linen as nn

import bert_jax
from bert_jax import config_lib, families
from bert_jax.input_pipeline import config as input_config
from bert_jax.input_pipeline import tokenizers
from bert_jax.tasks import text

FIRST, SECOND = "The Captain was proud of his ship, said Mr. Elliot.", "He sailed at dawn."


def bundled_tokenizer(family: str, lowercase: bool = True) -> tokenizers.Tokenizer:
    bundled = families.get(family).tokenizer
    return tokenizers.load_tokenizer(bundled.kind, input_config.resolve_path(bundled.tiny_path), lowercase)


def export(family: str, tokenizer, path) -> bert_jax.Pretrained:
    """The tiny preset's backbone with random weights, saved as an HF folder with `tokenizer`."""
    pretrained = bert_jax.Pretrained(config=config_lib.load_preset(family, "tiny").model, head="backbone",
                                     params=None, tokenizer=tokenizer)
    init = jax.jit(pretrained.model.init)(jax.random.key(0), np.ones((1, 8), np.int32))
    pretrained.params = nn.unbox(init["params"])
    bert_jax.save_pretrained(pretrained, path)
    return pretrained


def reloaded_tokenizer(path) -> tokenizers.Tokenizer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a backbone folder has no head weights to report
        return bert_jax.load_pretrained(path).tokenizer


@pytest.mark.parametrize("family", ["bert", "roberta", "modernbert"])
def test_auto_tokenizer_encodes_as_bert_jax_packs(family, tmp_path):
    tokenizer = bundled_tokenizer(family)
    export(family, tokenizer, tmp_path / "hf")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids_a, ids_b = tokenizer.encode(FIRST), tokenizer.encode(SECOND)

    assert hf(FIRST)["input_ids"] == text.pack(ids_a, None, tokenizer.special, family)[0]
    pair = hf(FIRST, SECOND)
    packed_ids, packed_types = text.pack(ids_a, ids_b, tokenizer.special, family)
    assert pair["input_ids"] == packed_ids
    assert pair.get("token_type_ids", [0] * len(packed_ids)) == packed_types
    assert ("token_type_ids" in pair) == families.get(family).pair_token_types
    special = tokenizer.special
    assert (hf.cls_token_id, hf.sep_token_id, hf.pad_token_id, hf.mask_token_id, hf.unk_token_id) == (
        special.cls, special.sep, special.pad, special.mask, special.unk)
    assert hf.model_max_length == bert_jax.pretrained.max_tokens(config_lib.load_preset(family, "tiny").model)
    assert reloaded_tokenizer(tmp_path / "hf").encode(FIRST) == ids_a

    # A mask token in the text stands for a word as it is spelled mid-sentence (RoBERTa's <mask> takes the space).
    before, after = FIRST.split(" was ")
    masked = tokenizer.encode(before) + [special.mask] + tokenizer.encode(after)
    assert hf(f"{before} {hf.mask_token} {after}")["input_ids"] == text.pack(masked, None, special, family)[0]


@pytest.mark.parametrize("family, reference", [("bert", "BertTokenizer"), ("roberta", "RobertaTokenizer")])
def test_auto_tokenizer_equals_transformers_own_class_on_the_vocabulary(family, reference, tmp_path):
    """The same vocabulary read by transformers' own class for the family gives the same ids for a text and a pair
    (bert_jax's byte-level BPE spaces every line's first word, as the class does with add_prefix_space=True)."""
    export(family, bundled_tokenizer(family), tmp_path / "hf")
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    files = {"bert": dict(vocab=str(tmp_path / "hf" / "vocab.txt")),
             "roberta": dict(vocab=str(tmp_path / "hf" / "vocab.json"), merges=str(tmp_path / "hf" / "merges.txt"),
                             add_prefix_space=True)}
    own = getattr(transformers, reference)(**files[family])
    for args in [(FIRST,), (FIRST, SECOND)]:
        assert exported(*args)["input_ids"] == own(*args)["input_ids"], args


def test_cased_wordpiece_stays_cased(tmp_path):
    """A folder of vocab.txt alone reads lowercased, in transformers and in bert_jax alike."""
    cased = bundled_tokenizer("bert", lowercase=False)
    assert cased.encode("Hello World") != bundled_tokenizer("bert").encode("Hello World")
    export("bert", cased, tmp_path / "hf")
    own = transformers.BertTokenizer(vocab=str(tmp_path / "hf" / "vocab.txt"), do_lower_case=False)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")("Hello World")["input_ids"] == \
        own("Hello World")["input_ids"]
    assert reloaded_tokenizer(tmp_path / "hf").encode("Hello World") == cased.encode("Hello World")


def test_sentencepiece_folder_adds_no_normalization(tmp_path):
    """ALBERT's sentencepiece model holds its own normalization; AlbertTokenizer lowercases and strips accents
    unless its config says otherwise."""
    tokenizer = bundled_tokenizer("albert")
    export("albert", tokenizer, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert (config["tokenizer_class"], config["do_lower_case"], config["keep_accents"]) == (
        "AlbertTokenizer", False, True)
    assert (config["cls_token"], config["sep_token"], config["mask_token"]) == ("[CLS]", "[SEP]", "[MASK]")
    assert reloaded_tokenizer(tmp_path / "hf").encode(FIRST) == tokenizer.encode(FIRST)
