"""The official SQuAD v1.1 / v2.0 scorer: exact match and token F1 after answer normalization, best over gold answers.

    python -m bert_jax.evaluation.squad DATA.json PREDICTIONS.json

prints {"exact_match": ..., "f1": ...} (percentages) as the official v1.1 script does; for v2.0 data, where a
question may have no answer and the right prediction is "", it adds the HasAns / NoAns breakdown of the v2.0 script.
Either file may be local or in a bucket (gs://...). A missing or malformed file ends it with one line naming it.
"""
from __future__ import annotations

import collections
import json
import re
import string
import sys

from bert_jax import cli, storage
from bert_jax.tasks.squad import Question, SquadDataError, questions_of, read_articles, read_json

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


def gold_answers(questions: list[Question]) -> dict[str, list[str]]:
    """Question id -> gold answer texts; an unanswerable (v2.0) question's only gold answer is ""."""
    return {q.qid: [text for text, _ in q.answers if normalize_answer(text)] or [""] for q in questions}


def evaluate(dataset: list, predictions: dict[str, str], source: str = "the SQuAD data") -> dict[str, float]:
    """Scores over every question in `dataset`, a SQuAD JSON file's "data" list (read from `source`, named in
    errors); see `score`."""
    return score(gold_answers(questions_of(dataset, source)), predictions)


def score(golds: dict[str, list[str]], predictions: dict[str, str]) -> dict[str, float]:
    """Scores over every question of `golds` (gold_answers), whatever file format they came from; a question
    without a prediction scores 0 (reported on stderr)."""
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


def read_predictions(path: storage.PathLike) -> dict[str, str]:
    """A predictions file: one JSON object of question id -> answer text (what run_squad and finetune write)."""
    predictions = read_json(path)
    if not isinstance(predictions, dict) or not all(isinstance(text, str) for text in predictions.values()):
        raise SquadDataError(f"{storage.as_path(path)}: not a predictions file; it must be one JSON object of "
                             "question id -> answer text")
    return predictions


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit("usage: python -m bert_jax.evaluation.squad DATA.json PREDICTIONS.json")
    data_file, predictions_file = argv[1:]
    print(json.dumps(evaluate(read_articles(data_file), read_predictions(predictions_file), source=data_file)))


if __name__ == "__main__":
    cli.run(main)
