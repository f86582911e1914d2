"""Retrieval evaluation on a folder in BEIR's layout, scored by a kept library (ir-measures over trec_eval).

    python -m bert_jax.evaluation.retrieval --init=PATH --data=DIR [--split=test] [--pooling=mean]

`DIR` (local or gs://) holds corpus.jsonl ({"_id", "title", "text"} per line), queries.jsonl ({"_id", "text"}) and
qrels/<split>.tsv (query-id, corpus-id, score, with a header). Passages are encoded as BEIR and MTEB encode them
(title, a space, then the text) and queries as they are; both are scored by cosine similarity. Search is exact: the
corpus streams through in chunks, each chunk's vectors are scored against every query (split over the devices) and
merged into a running top 100, so memory stays about queries x (100 + chunk) scores whatever the corpus size.
nDCG@10, MRR@10 and Recall@100 come from ir-measures, never from formulas of ours. The last line printed is JSON
with "ndcg@10", "mrr@10", "recall@100", the numbers of queries and passages, and the seconds taken.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from absl import flags

from bert_jax import cli, data_sources, sentence_embedding, sharding, storage
from bert_jax.errors import UserError

TOP_K = 100  # enough for Recall@100


class RetrievalDataError(UserError, ValueError):
    """A BEIR folder with a missing file or a malformed line; the message names the file and line."""


def ir_measures_module():
    """ir-measures, or one line saying how to install it (the `embed` extra)."""
    try:
        import ir_measures
    except ImportError as e:
        raise UserError("retrieval scores come from ir-measures, which is not installed; pip install -e "
                        "'.[embed]' (or pip install ir-measures)") from e
    return ir_measures


def measures() -> dict:
    """Our names for the reported ir-measures measures."""
    ir = ir_measures_module()
    return {"ndcg@10": ir.nDCG @ 10, "mrr@10": ir.RR @ 10, "recall@100": ir.R @ 100}


# ---------------------------------------------------------------------------------------------- reading the folder


def read_jsonl(file: storage.Path):
    """(line number, object) of a JSON lines file, streamed."""
    if not file.exists():
        raise RetrievalDataError(f"{file} does not exist; a BEIR folder holds corpus.jsonl, queries.jsonl and "
                                 "qrels/<split>.tsv")
    with file.open("r", encoding="utf-8") as lines:
        for number, record in data_sources.json_lines(lines, str(file), RetrievalDataError):
            if not isinstance(record, dict) or not isinstance(record.get("_id"), str) or not isinstance(
                    record.get("text"), str):
                raise RetrievalDataError(f"{file}:{number}: needs string '_id' and 'text' fields")
            yield number, record


def passage_text(record: dict) -> str:
    """How BEIR and MTEB encode a passage: its title, a space, then its text (the text alone without a title)."""
    title = record.get("title") or ""
    return (title + " " + record["text"]).strip() if title else record["text"].strip()


def read_qrels(file: storage.Path) -> dict[str, dict[str, int]]:
    """{query id: {passage id: relevance}} from a BEIR qrels TSV (its header line skipped)."""
    if not file.exists():
        raise RetrievalDataError(f"{file} does not exist; pass --split to name another qrels/<split>.tsv")
    qrels: dict[str, dict[str, int]] = {}
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines()[1:], 2):
        fields = line.split("\t")
        if len(fields) != 3 or not fields[2].strip().lstrip("-").isdigit():
            raise RetrievalDataError(f"{file}:{number}: expected 'query-id<TAB>corpus-id<TAB>score'")
        qrels.setdefault(fields[0], {})[fields[1]] = int(fields[2])
    if not qrels:
        raise RetrievalDataError(f"{file}: holds no judgements; there is nothing to score")
    return qrels


def read_queries(file: storage.Path, wanted: dict) -> tuple[list[str], list[str]]:
    """(ids, texts) of the queries that have qrels, in the file's order; a judged query missing is an error."""
    queries = {record["_id"]: record["text"] for _, record in read_jsonl(file) if record["_id"] in wanted}
    missing = sorted(set(wanted) - set(queries))
    if missing:
        raise RetrievalDataError(f"{file}: {len(missing)} queries of the qrels are missing (first: {missing[0]!r})")
    return list(queries), list(queries.values())


def corpus_chunks(file: storage.Path, size: int):
    """(ids, texts) of `size` passages at a time, streamed from corpus.jsonl."""
    records = (record for _, record in read_jsonl(file))
    while chunk := list(itertools.islice(records, size)):
        yield [record["_id"] for record in chunk], [passage_text(record) for record in chunk]


# ------------------------------------------------------------------------------------------------------- search


@functools.partial(jax.jit, static_argnames="k")
def merge_top_k(best_scores, best_rows, queries, passages, first_row, valid, k: int = TOP_K):
    """The running top k (scores, corpus rows) per query, updated with a chunk of passages; rows past `valid` in the
    chunk are padding and never chosen."""
    real = jnp.arange(passages.shape[0]) < valid
    scores = jnp.where(real, queries @ passages.T, -jnp.inf)
    rows = jnp.where(real, first_row + jnp.arange(passages.shape[0]), -1)
    scores = jnp.concatenate([best_scores, scores], axis=1)
    rows = jnp.concatenate([best_rows, jnp.broadcast_to(rows, (queries.shape[0], rows.shape[0]))], axis=1)
    top, where = jax.lax.top_k(scores, k)
    return top, jnp.take_along_axis(rows, where, axis=1)


def embed_with_progress(model, texts: list[str], batch_size: int, chunk_size: int) -> np.ndarray:
    """Unit vectors of the queries, `chunk_size` at a time under a progress bar."""
    chunks = range(0, len(texts), chunk_size)
    with tqdm.tqdm(total=len(texts), unit="query", desc="queries", disable=jax.process_index() != 0,
                   dynamic_ncols=True) as progress:
        vectors = []
        for start in chunks:
            vectors.append(model.embed(texts[start:start + chunk_size], normalize=True, batch_size=batch_size))
            progress.update(len(vectors[-1]))
    return np.concatenate(vectors)


def search(model, query_vectors: np.ndarray, corpus_file: storage.Path, batch_size: int, chunk_size: int,
           mesh=None, top_k: int = TOP_K) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(scores [Q, k], corpus rows [Q, k], corpus ids) of the k best passages per query by cosine similarity; rows
    past the corpus's size are -1."""
    place = None
    if mesh is not None:
        shards = mesh.shape["data"] * mesh.shape["fsdp"]
        if chunk_size % shards:
            raise RetrievalDataError(f"--chunk_size={chunk_size} does not split over the {shards} devices; choose a "
                                     "multiple of it")
        place = sharding.batch_sharding(mesh)
    queries = jnp.asarray(query_vectors)
    best_scores = jnp.full((len(query_vectors), top_k), -jnp.inf, jnp.float32)
    best_rows = jnp.full((len(query_vectors), top_k), -1, jnp.int32)
    ids: list[str] = []
    with tqdm.tqdm(unit="passage", desc="corpus", disable=jax.process_index() != 0, dynamic_ncols=True) as progress:
        for chunk_ids, texts in corpus_chunks(corpus_file, chunk_size):
            vectors = np.zeros((chunk_size, query_vectors.shape[1]), np.float32)
            vectors[:len(texts)] = model.embed(texts, normalize=True, batch_size=batch_size)
            passages = jax.device_put(vectors, place) if place is not None else vectors
            best_scores, best_rows = merge_top_k(best_scores, best_rows, queries, passages, len(ids), len(texts),
                                                 k=top_k)
            ids += chunk_ids
            progress.update(len(texts))
    return np.asarray(best_scores), np.asarray(best_rows), ids


def run_of(query_ids: list[str], scores: np.ndarray, rows: np.ndarray, corpus_ids: list[str]) -> dict:
    """The ranking as ir-measures (and pytrec_eval) take it: {query id: {passage id: score}}."""
    return {qid: {corpus_ids[row]: float(score) for score, row in zip(query_scores, query_rows) if row >= 0}
            for qid, query_scores, query_rows in zip(query_ids, scores, rows)}


def score_run(qrels: dict, run: dict) -> dict[str, float]:
    """nDCG@10, MRR@10 and Recall@100 of a run, from ir-measures."""
    results = ir_measures_module().calc_aggregate(list(measures().values()), qrels, run)
    return {name: float(results[measure]) for name, measure in measures().items()}


def evaluate(model, folder: storage.PathLike, split: str = "test", batch_size: int = 64, chunk_size: int = 4096,
             pooling: str | None = None, mesh=None) -> dict[str, float]:
    """Encode the judged queries, search the corpus, score the top 100 with ir-measures. `model` is a
    bert_jax.Pretrained (its pooling unless `pooling` is given)."""
    folder = storage.as_path(folder)
    if pooling is not None:
        model = dataclasses.replace(model, pooling=sentence_embedding.overridden(model.pooling, pooling))
    start = time.perf_counter()
    qrels = read_qrels(folder / "qrels" / f"{split}.tsv")
    query_ids, query_texts = read_queries(folder / "queries.jsonl", qrels)
    query_vectors = embed_with_progress(model, query_texts, batch_size, chunk_size)
    scores, rows, corpus_ids = search(model, query_vectors, folder / "corpus.jsonl", batch_size, chunk_size, mesh)
    results = score_run(qrels, run_of(query_ids, scores, rows, corpus_ids))
    return {**results, "queries": len(query_ids), "passages": len(corpus_ids),
            "seconds": time.perf_counter() - start}


def main(argv):
    del argv
    from bert_jax.pretrained import load_pretrained

    mesh = sharding.make_mesh(-1, 1, 1)
    model = load_pretrained(flags.FLAGS.init, head="backbone", mesh=mesh)
    results = evaluate(model, flags.FLAGS.data, flags.FLAGS.split, flags.FLAGS.batch_size, flags.FLAGS.chunk_size,
                       flags.FLAGS.pooling, mesh)
    print(f"{results['queries']} queries over {results['passages']} passages of {flags.FLAGS.data}: "
          f"nDCG@10 {results['ndcg@10']:.4f}, MRR@10 {results['mrr@10']:.4f}, "
          f"Recall@100 {results['recall@100']:.4f} ({results['seconds']:.0f} s)")
    print(json.dumps(results))


if __name__ == "__main__":  # flags defined here, so that benchmarks can import this module with flags of their own
    flags.DEFINE_string("init", None, "A checkpoint bert_jax.load_pretrained reads.", required=True)
    flags.DEFINE_string("data", None, "A BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv.",
                        required=True)
    flags.DEFINE_string("split", "test", "Which qrels/<split>.tsv to score.")
    flags.DEFINE_enum("pooling", None, list(sentence_embedding.POOLINGS),
                      "Sentence vector (default: the checkpoint's, else [CLS]).")
    flags.DEFINE_integer("batch_size", 64, "Rows per encoder call (embed packs short texts side by side in a row).")
    flags.DEFINE_integer("chunk_size", 4096, "Passages scored at a time (memory: queries x (100 + chunk) floats).")
    cli.run(main)
