"""Retrieval figures: bert_jax's scores against a sentence-transformers + ir-measures pipeline, and the memory and
time of exact search over a large corpus.

    python benchmarks/retrieval.py parity --init=ST_FOLDER --data=BEIR_DIR
    python benchmarks/retrieval.py scale --init=PATH --squad=dev-v1.1.json [--passages=100000] \
        [--corpus='data/corpus/*.txt']

parity: bert_jax.evaluation.retrieval on load_pretrained(ST_FOLDER), then SentenceTransformer(ST_FOLDER).encode of
the same texts (title, a space, the text), cosine, the top 100 and ir-measures; prints both and their differences.
scale: a BEIR folder of SQuAD's questions over its paragraphs plus distractor passages (windows of 64 words cut from
the text files, overlapping as much as needed to reach --passages) is written to a temporary folder and searched;
peak RSS is the process's (getrusage), so it includes the model, JAX and the queries. Each ends with one JSON line.
"""
import glob
import json
import os
import pathlib
import resource
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from bert_jax import load_pretrained  # noqa: E402
from bert_jax.evaluation import retrieval  # noqa: E402
from bert_jax.tasks import squad_retrieval  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
flags.DEFINE_string("init", None, "The model: a sentence-transformers folder for parity, any checkpoint for scale.",
                    required=True)
flags.DEFINE_string("data", None, "parity: the BEIR folder.")
flags.DEFINE_string("squad", None, "scale: a SQuAD JSON file whose questions and paragraphs start the corpus.")
flags.DEFINE_integer("passages", 100_000, "scale: passages in the corpus, distractors included.")
flags.DEFINE_string("corpus", str(REPO / "data" / "corpus" / "*.txt"), "scale: text files the distractors come from.")
flags.DEFINE_integer("window", 64, "scale: words per distractor passage.")
flags.DEFINE_integer("batch_size", 64, "sentence-transformers' texts a batch; bert_jax's rows per encoder call (embed "
                     "packs short texts side by side in a row).")
flags.DEFINE_integer("chunk_size", 4096, "Passages scored at a time.")


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # kilobytes on Linux


def sentence_transformers_scores(model_dir: str, folder: pathlib.Path, batch_size: int) -> dict:
    import ir_measures
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    corpus = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines()]
    qrels = retrieval.read_qrels(folder / "qrels" / "test.tsv")
    query_ids, query_texts = retrieval.read_queries(folder / "queries.jsonl", qrels)
    passages = model.encode([retrieval.passage_text(d) for d in corpus], batch_size=batch_size,
                            normalize_embeddings=True)
    queries = model.encode(query_texts, batch_size=batch_size, normalize_embeddings=True)
    run = {}
    for qid, row in zip(query_ids, queries @ passages.T):
        best = np.argsort(-row)[:retrieval.TOP_K]
        run[qid] = {corpus[i]["_id"]: float(row[i]) for i in best}
    results = ir_measures.calc_aggregate(list(retrieval.measures().values()), qrels, run)
    return {name: float(results[measure]) for name, measure in retrieval.measures().items()}


def parity() -> dict:
    folder = pathlib.Path(flags.FLAGS.data)
    start = time.perf_counter()
    ours = retrieval.evaluate(load_pretrained(flags.FLAGS.init, head="backbone"), folder,
                              batch_size=flags.FLAGS.batch_size, chunk_size=flags.FLAGS.chunk_size)
    ours_seconds = time.perf_counter() - start
    start = time.perf_counter()
    reference = sentence_transformers_scores(flags.FLAGS.init, folder, flags.FLAGS.batch_size)
    reference_seconds = time.perf_counter() - start
    print(f"{ours['queries']} queries over {ours['passages']} passages of {folder}")
    for name in reference:
        print(f"  {name:<11} bert_jax {ours[name]:.6f}  sentence-transformers + ir-measures {reference[name]:.6f}  "
              f"difference {abs(ours[name] - reference[name]):.2e}")
    print(f"  seconds: bert_jax {ours_seconds:.0f}, sentence-transformers {reference_seconds:.0f}")
    return {"queries": ours["queries"], "passages": ours["passages"],
            **{f"bert_jax_{k}": ours[k] for k in reference}, **{f"reference_{k}": v for k, v in reference.items()},
            "max_difference": max(abs(ours[k] - reference[k]) for k in reference)}


def distractors(files: list[str], count: int, window: int):
    """`count` passages of `window` words from the files' words, windows as far apart as the text allows."""
    words = [word for file in files for word in pathlib.Path(file).read_text(errors="replace").split()]
    stride = max(1, (len(words) - window) // max(count, 1))
    for i in range(count):
        start = (i * stride) % max(len(words) - window, 1)
        yield {"_id": f"d{i}", "title": "", "text": " ".join(words[start:start + window])}


def scale() -> dict:
    corpus, queries, qrels, _ = squad_retrieval.build(flags.FLAGS.squad)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp) / "beir"
        squad_retrieval.write_folder(folder, corpus, queries, qrels, [])
        files = sorted(glob.glob(flags.FLAGS.corpus))
        with (folder / "corpus.jsonl").open("a") as out:
            for record in distractors(files, flags.FLAGS.passages - len(corpus), flags.FLAGS.window):
                out.write(json.dumps(record) + "\n")
        model = load_pretrained(flags.FLAGS.init, head="backbone")
        start = time.perf_counter()
        results = retrieval.evaluate(model, folder, batch_size=flags.FLAGS.batch_size,
                                     chunk_size=flags.FLAGS.chunk_size)
        seconds = time.perf_counter() - start
    print(f"{results['queries']} queries over {results['passages']} passages: nDCG@10 {results['ndcg@10']:.4f}, "
          f"{seconds:.0f} s, peak RSS {peak_rss_gb():.2f} GB")
    return {**results, "seconds": seconds, "peak_rss_gb": peak_rss_gb(), "chunk_size": flags.FLAGS.chunk_size}


def main(argv):
    if len(argv) != 2 or argv[1] not in ("parity", "scale"):
        raise app.UsageError("say which: parity or scale")
    print(json.dumps(parity() if argv[1] == "parity" else scale()))


if __name__ == "__main__":
    app.run(main)
