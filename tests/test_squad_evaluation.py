"""The SQuAD scorer against hand-computed exact match and F1: articles, punctuation, case, several gold answers."""
import json
import subprocess
import sys

import pytest

from bert_jax.evaluation import squad as ev


@pytest.mark.parametrize("prediction, gold, em, f1", [
    ("the Denver Broncos", "Denver Broncos", 1, 1.0),  # article dropped
    ("An apple", "apple", 1, 1.0),
    ("Santa Clara, California.", "Santa Clara California", 1, 1.0),  # punctuation dropped
    ("DENVER  Broncos", "denver broncos", 1, 1.0),  # case and whitespace
    ("Denver Broncos team", "Denver Broncos", 0, 0.8),  # P = 2/3, R = 1
    ("cat cat dog", "cat dog dog", 0, 2 / 3),  # overlap counts each token at most min(count) times
    ("theatre", "the atre", 0, 0.0),  # "the" is an article only as a whole word
    ("Carolina Panthers", "Denver Broncos", 0, 0.0),
    ("", "", 1, 1.0),  # v2.0: no answer predicted for an unanswerable question
    ("Denver", "", 0, 0.0),
])
def test_exact_match_and_f1(prediction, gold, em, f1):
    assert ev.exact_match(prediction, gold) == em
    assert ev.f1(prediction, gold) == pytest.approx(f1)


def squad_file(tmp_path, questions):
    """A one-paragraph SQuAD file; `questions` maps id -> gold answer texts ([] = unanswerable)."""
    qas = [{"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in texts]}
           for qid, texts in questions.items()]
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "c", "qas": qas}]}]}))
    return path


def run_cli(data, predictions):
    out = subprocess.run([sys.executable, "-m", "bert_jax.evaluation.squad", str(data), str(predictions)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_cli_takes_best_gold_answer_and_scores_missing_predictions_zero(tmp_path):
    data = squad_file(tmp_path, {"q1": ["Denver Broncos", "the Broncos", "Broncos"],
                                 "q2": ["Levi's Stadium", "Levi's Stadium in the San Francisco Bay Area"],
                                 "q3": ["February 7, 2016"]})
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({"q1": "broncos", "q2": "Levi's Stadium in the Bay Area"}))
    scores, stderr = run_cli(data, predictions)
    # q1: EM 1 (third gold). q2: best F1 against the long gold: pred {levis stadium in bay area} 5 tokens,
    # gold {levis stadium in san francisco bay area} 7 tokens, 5 shared: P = 1, R = 5/7, F1 = 10/12. q3: missing.
    assert scores == pytest.approx({"exact_match": 100 / 3, "f1": 100 * (1 + 10 / 12 + 0) / 3})
    assert "1 of 3 questions have no prediction" in stderr


def test_v2_unanswerable_questions_are_scored_apart(tmp_path):
    data = squad_file(tmp_path, {"q1": ["Broncos"], "q2": [], "q3": []})
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({"q1": "Broncos", "q2": "", "q3": "Panthers"}))
    scores, _ = run_cli(data, predictions)
    assert scores["exact_match"] == pytest.approx(200 / 3) and scores["f1"] == pytest.approx(200 / 3)
    assert scores["HasAns_exact"] == 100 and scores["NoAns_exact"] == 50
    assert scores["HasAns_total"] == 1 and scores["NoAns_total"] == 2
