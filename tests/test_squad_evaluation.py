"""The SQuAD scorer against hand-computed exact match and F1: articles, punctuation, case, several gold answers."""
import json
import subprocess
import sys

import pytest

from bert_jax.evaluation import squad as ev
from bert_jax.tasks.squad import SquadDataError


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
    """A one-paragraph SQuAD file; `questions` maps id -> gold answer texts ([] = unanswerable, as v2.0 marks it)."""
    qas = [{"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in texts],
            **({} if texts else {"is_impossible": True})} for qid, texts in questions.items()]
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


def test_a_question_without_answers_is_unanswerable_only_when_it_says_so(tmp_path):
    dataset = json.loads(squad_file(tmp_path, {"q1": ["Broncos"], "q2": []}).read_text())["data"]
    assert ev.evaluate(dataset, {"q1": "Broncos", "q2": ""})["NoAns_total"] == 1
    del dataset[0]["paragraphs"][0]["qas"][1]["is_impossible"]  # a v1.1 question that lost its answers
    with pytest.raises(SquadDataError, match="dev.json: question 'q2' has no answers"):
        ev.evaluate(dataset, {"q1": "Broncos", "q2": ""}, source="dev.json")


def test_predictions_must_map_ids_to_texts(tmp_path):
    path = tmp_path / "predictions.json"
    for bad in ([], {"q1": 3}):
        path.write_text(json.dumps(bad))
        with pytest.raises(SquadDataError, match="predictions.json: not a predictions file"):
            ev.read_predictions(path)


def test_cli_names_a_missing_or_malformed_file_in_one_line(tmp_path):
    data = squad_file(tmp_path, {"q1": ["Broncos"]})
    (tmp_path / "broken.json").write_text('{"q1": ')
    for args, named in (((data, tmp_path / "absent.json"), f"{tmp_path / 'absent.json'}: not found"),
                        ((tmp_path / "broken.json", data), f"{tmp_path / 'broken.json'}: not a UTF-8 JSON file")):
        out = subprocess.run([sys.executable, "-m", "bert_jax.evaluation.squad", *map(str, args)],
                             capture_output=True, text=True)
        assert out.returncode == 1 and out.stdout == ""
        assert out.stderr.startswith(f"error: {named}") and len(out.stderr.splitlines()) == 1, out.stderr
