"""The official SQuAD v1.1 / v2.0 scorer: exact match and token F1 after answer normalization, best over gold answers.

    python -m bert_jax.evaluation.squad DATA.json PREDICTIONS.json

prints {"exact_match": ..., "f1": ...} (percentages) as the official v1.1 script does; for v2.0 data, where a
question may have no answer and the right prediction is "", it adds the HasAns / NoAns breakdown of the v2.0 script.
Either file may be local or in a bucket (gs://...).
"""
from __future__ import annotations

import collections
import json
import re
import string
import sys

from bert_jax import storage

PUNCTUATION = frozenset(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and the articles a/an/the, collapse whitespace (the official rule)."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-overlap F1; when either side normalizes to nothing, 1 if both do, else 0 (v2.0's no-answer rule)."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_answers(dataset: list) -> dict[str, list[str]]:
    """Question id -> gold answer texts; an unanswerable (v2.0) question's only gold answer is ""."""
    golds = {}
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                texts = [a["text"] for a in qa.get("answers", []) if normalize_answer(a["text"])]
                golds[qa["id"]] = texts or [""]
    return golds


def evaluate(dataset: list, predictions: dict[str, str]) -> dict[str, float]:
    """Scores over every question in `dataset`; a question without a prediction scores 0 (reported on stderr)."""
    golds = gold_answers(dataset)
    missing = [qid for qid in golds if qid not in predictions]
    if missing:
        print(f"{len(missing)} of {len(golds)} questions have no prediction and score 0 (first: {missing[0]})",
              file=sys.stderr)
    em = {qid: max(exact_match(predictions.get(qid, ""), g) for g in gs) if qid in predictions else 0.0
          for qid, gs in golds.items()}
    f = {qid: max(f1(predictions.get(qid, ""), g) for g in gs) if qid in predictions else 0.0
         for qid, gs in golds.items()}
    scores = {"exact_match": 100.0 * sum(em.values()) / len(golds), "f1": 100.0 * sum(f.values()) / len(golds)}
    has_answer = [qid for qid, gs in golds.items() if gs != [""]]
    if len(has_answer) < len(golds):  # v2.0 data: also score answerable and unanswerable questions apart
        no_answer = [qid for qid in golds if golds[qid] == [""]]
        for name, ids in (("HasAns", has_answer), ("NoAns", no_answer)):
            if ids:
                scores[f"{name}_exact"] = 100.0 * sum(em[q] for q in ids) / len(ids)
                scores[f"{name}_f1"] = 100.0 * sum(f[q] for q in ids) / len(ids)
                scores[f"{name}_total"] = len(ids)
    return scores


def read_json(path: storage.PathLike):
    """A JSON file, local or in a bucket."""
    return json.loads(storage.as_path(path).read_text(encoding="utf-8"))


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit("usage: python -m bert_jax.evaluation.squad DATA.json PREDICTIONS.json")
    dataset, predictions = read_json(argv[1])["data"], read_json(argv[2])
    print(json.dumps(evaluate(dataset, predictions)))


if __name__ == "__main__":
    main(sys.argv)
