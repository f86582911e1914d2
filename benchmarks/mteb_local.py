"""The MTEB harness (PyPI `mteb`) on an exported bert_jax model, over a local BEIR folder, with no download.

    python benchmarks/mteb_local.py --model=ST_FOLDER --data=BEIR_DIR

MTEB's own tasks download their data from the Hugging Face hub; this defines one retrieval task whose data is the
local folder (e.g. the one `python -m bert_jax.tasks.squad_retrieval` builds) and runs `mteb.evaluate` on
`SentenceTransformer(ST_FOLDER)`, as MTEB runs any model. Prints MTEB's scores, then one JSON line with its
ndcg_at_10, mrr_at_10 and recall_at_100. Where there is network, MTEB's published tasks run the same way:
`mteb.evaluate(SentenceTransformer(ST_FOLDER), mteb.get_tasks(tasks=["SciFact", "NFCorpus"]))`.
"""
import json
import os
import pathlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from absl import app, flags  # noqa: E402

flags.DEFINE_string("model", None, "A sentence-transformers folder (save_pretrained(..., 'sentence-transformers')).",
                    required=True)
flags.DEFINE_string("data", None, "A BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv.", required=True)


def local_task(folder: pathlib.Path):
    """An MTEB retrieval task whose corpus, queries and qrels are read from `folder`."""
    import datasets
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.task_metadata import TaskMetadata

    from bert_jax.evaluation import retrieval

    class LocalBeirRetrieval(AbsTaskRetrieval):
        metadata = TaskMetadata(
            name="LocalBeirRetrieval", dataset={"path": str(folder), "revision": "local"},
            description="A local folder in BEIR's layout.", reference=None, type="Retrieval", category="t2t",
            modalities=["text"], eval_splits=["test"], eval_langs=["eng-Latn"], main_score="ndcg_at_10",
            date=None, domains=None, task_subtypes=None, license=None, annotations_creators=None, dialect=None,
            sample_creation=None, bibtex_citation="")

        def load_data(self, num_proc=None, **kwargs):
            if self.data_loaded:
                return
            corpus = [r for _, r in retrieval.read_jsonl(folder / "corpus.jsonl")]
            qrels = retrieval.read_qrels(folder / "qrels" / "test.tsv")
            ids, texts = retrieval.read_queries(folder / "queries.jsonl", qrels)
            self.corpus = {"test": datasets.Dataset.from_dict(
                {"id": [r["_id"] for r in corpus], "title": [r.get("title", "") for r in corpus],
                 "text": [r["text"] for r in corpus]})}
            self.queries = {"test": datasets.Dataset.from_dict({"id": ids, "text": texts})}
            self.relevant_docs = {"test": qrels}
            self.dataset = {}
            self.dataset_transform(num_proc=num_proc)
            self.data_loaded = True

    return LocalBeirRetrieval()


def main(argv):
    del argv
    import mteb
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(flags.FLAGS.model, device="cpu")
    result = mteb.evaluate(model, local_task(pathlib.Path(flags.FLAGS.data)), cache=None)
    scores = result.task_results[0].scores["test"][0]
    print({k: scores[k] for k in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "main_score")})
    print(json.dumps({k: scores[k] for k in ("ndcg_at_10", "mrr_at_10", "recall_at_100")}))


if __name__ == "__main__":
    app.run(main)
