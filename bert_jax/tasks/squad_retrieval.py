"""SQuAD as a retrieval task: a question's relevant passage is the paragraph it was asked about.

    python -m bert_jax.tasks.squad_retrieval --squad=dev-v1.1.json --output=DIR [--articles=START:STOP]

DIR gets BEIR's layout, which `python -m bert_jax.evaluation.retrieval --data=DIR` scores: corpus.jsonl (one
passage per paragraph, titled with its article), queries.jsonl and qrels/test.tsv. It also gets pairs.jsonl, the
same questions as training pairs for `bert_jax.embed_train`: the positive is the paragraph as the evaluation
encodes it (title, a space, the text), the negative the next paragraph of the same article (a hard negative: same
topic, another passage). --articles keeps a slice of the file's articles, so that training pairs and the evaluation
folder can come from disjoint articles of one file.
"""
from __future__ import annotations

import json

from absl import flags

from bert_jax import cli, storage
from bert_jax.evaluation.retrieval import passage_text
from bert_jax.tasks import squad


def article_slice(text: str, count: int) -> slice:
    """"START:STOP" (either may be empty) as a slice of `count` articles; an empty slice is an error."""
    try:
        start, stop = (int(part) if part else None for part in text.split(":"))
    except ValueError as e:
        raise squad.SquadDataError(f"--articles={text!r}: give START:STOP, e.g. 0:24") from e
    chosen = slice(start, stop)
    if not range(count)[chosen]:
        raise squad.SquadDataError(f"--articles={text!r} keeps none of the file's {count} articles")
    return chosen


def build(squad_file: storage.PathLike, articles: str = ":") -> tuple[list[dict], list[dict], list[tuple], list]:
    """(corpus records, query records, qrels rows, pairs) of the chosen articles of a SQuAD file."""
    source = str(squad_file)
    all_articles = squad.read_articles(squad_file)
    corpus, queries, qrels, pairs = [], [], [], []
    for a in range(len(all_articles))[article_slice(articles, len(all_articles))]:
        article = all_articles[a]
        title = str(article.get("title", "")).replace("_", " ")
        paragraphs = squad.required(article, "paragraphs", list, f"{source}: article {a}")
        records = [{"_id": f"a{a}p{p}", "title": title,
                    "text": squad.required(paragraph, "context", str, f"{source}: article {a} paragraph {p}")}
                   for p, paragraph in enumerate(paragraphs)]
        corpus += records
        for p, paragraph in enumerate(paragraphs):
            negative = records[(p + 1) % len(records)] if len(records) > 1 else None
            for q, qa in enumerate(squad.required(paragraph, "qas", list, f"{source}: article {a} paragraph {p}")):
                where = f"{source}: article {a} paragraph {p} question {q}"
                qid, question = squad.required(qa, "id", str, where), squad.required(qa, "question", str, where)
                queries.append({"_id": qid, "text": question})
                qrels.append((qid, records[p]["_id"], 1))
                pair = {"query": question, "positive": passage_text(records[p])}
                pairs.append(pair | ({"negative": passage_text(negative)} if negative else {}))
    return corpus, queries, qrels, pairs


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def write_folder(output: storage.PathLike, corpus, queries, qrels, pairs) -> storage.Path:
    """Write the BEIR files and pairs.jsonl into a new (or empty) folder."""
    from bert_jax.pretrained import check_output_free

    check_output_free(output)
    folder = storage.make_dirs(output)
    storage.make_dirs(folder / "qrels")
    storage.atomic_write(folder / "corpus.jsonl", jsonl(corpus))
    storage.atomic_write(folder / "queries.jsonl", jsonl(queries))
    storage.atomic_write(folder / "qrels" / "test.tsv",
                         "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t{s}\n" for q, c, s in qrels))
    storage.atomic_write(folder / "pairs.jsonl", jsonl(pairs))
    return folder


def main(argv):
    del argv
    corpus, queries, qrels, pairs = build(flags.FLAGS.squad, flags.FLAGS.articles)
    folder = write_folder(flags.FLAGS.output, corpus, queries, qrels, pairs)
    print(f"wrote {len(queries)} queries over {len(corpus)} passages, and {len(pairs)} training pairs, to {folder}")


if __name__ == "__main__":
    flags.DEFINE_string("squad", None, "A SQuAD v1.1 / v2.0 JSON file (e.g. dev-v1.1.json).", required=True)
    flags.DEFINE_string("output", None, "The folder to create (must not exist or be empty).", required=True)
    flags.DEFINE_string("articles", ":", "START:STOP: the slice of the file's articles to keep.")
    cli.run(main)
