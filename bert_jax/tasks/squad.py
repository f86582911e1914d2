"""SQuAD v1.1 / v2.0: reading, features over a sliding document window, and n-best span decoding.

Contexts are cut into pieces at whitespace and punctuation (as BERT's basic tokenizer cuts them) and each piece is
tokenized on its own, so every token knows the characters of its piece: an answer is a slice of the original context,
and no token-to-text realignment is needed. For WordPiece this gives exactly the tokens of the whole context.

A context longer than the window is covered by several features `doc_stride` tokens apart; a token is scored only in
the window where it has the most context on both sides (BERT's run_squad rule).

The data comes in any form of bert_jax.data_sources: the official JSON files, the hub's rajpurkar/squad (or
squad_v2) parquet files, or TFDS squad/v1.1 (v2.0). All give the same questions; the JSON and the hub keep the
file's order, while TFDS stores questions shuffled and keeps no position, so its order is TFDS's own.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import unicodedata

import numpy as np

from bert_jax import data_sources, storage
from bert_jax.errors import UserError
from bert_jax.tasks.text import pack, pad_rows, special_count


@dataclasses.dataclass(frozen=True)
class Example:
    qid: str
    question: str
    context: str
    answer_start: int  # character offsets of the first gold answer; -1 when there is none
    answer_end: int  # exclusive
    is_impossible: bool = False


class SquadDataError(UserError, ValueError):
    """A file that is not SQuAD JSON, or a question without a key it needs; the message names the file and where."""


@dataclasses.dataclass(frozen=True)
class Question:
    """One question of a SQuAD file as written there, after its keys were checked."""

    qid: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]  # (text, answer_start); empty only when is_impossible
    is_impossible: bool


def read_json(path: storage.PathLike):
    """A JSON file, local or in a bucket; a missing or malformed file is an error naming it."""
    path = storage.as_path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:  # not found, no permission, no credentials for the bucket: explain() words each
        raise SquadDataError(str(storage.explain(path, e))) from e
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise SquadDataError(f"{path}: not a UTF-8 JSON file ({e})") from e


def read_articles(path: storage.PathLike) -> list:
    """The top-level "data" list of a SQuAD JSON file."""
    document = read_json(path)
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise SquadDataError(f"{storage.as_path(path)}: not a SQuAD JSON file (it needs a top-level 'data' list of "
                             "articles)")
    return document["data"]


def required(record, key: str, kind: type, where: str):
    """record[key], checked to be a `kind`; else an error naming where it is missing."""
    if not isinstance(record, dict) or key not in record:
        raise SquadDataError(f"{where} has no {key!r}; add it (SQuAD v1.1/v2.0 files need it) or remove the entry")
    if not isinstance(record[key], kind) or isinstance(record[key], bool):  # to Python, True is an int
        raise SquadDataError(f"{where}: {key!r} is {record[key]!r}, not a {kind.__name__}")
    return record[key]


def answers_of(qa: dict, where: str) -> tuple[tuple[str, int], ...]:
    """A question's (text, answer_start) answers. Only a v2.0 question that says is_impossible may have none: a
    v1.1 question without answers is a broken file, not a no-answer target."""
    if qa.get("is_impossible") is True:
        return ()
    answers = qa.get("answers")
    if not isinstance(answers, list) or not answers:
        raise SquadDataError(f"{where} has no answers; every SQuAD v1.1 question has at least one, and a v2.0 "
                             'question without one says "is_impossible": true; fix or remove the question')
    wheres = [f"{where} answer {i}" for i in range(len(answers))]
    return tuple((required(a, "text", str, w), required(a, "answer_start", int, w)) for a, w in zip(answers, wheres))


def questions_of(articles: list, source: str) -> list[Question]:
    """Every question of a SQuAD "data" list, in file order; `source` (the file) is named in every error."""
    questions = []
    for a, article in enumerate(articles):
        title = article.get("title", a) if isinstance(article, dict) else a
        for p, paragraph in enumerate(required(article, "paragraphs", list, f"{source}: article {title!r}")):
            where = f"{source}: article {title!r} paragraph {p}"
            context = required(paragraph, "context", str, where)
            for q, qa in enumerate(required(paragraph, "qas", list, where)):
                qid = required(qa, "id", str, f"{where} question {q}")
                where_qa = f"{source}: question {qid!r}"
                questions.append(Question(qid, required(qa, "question", str, where_qa), context,
                                          answers_of(qa, where_qa), qa.get("is_impossible") is True))
    if not questions:
        raise SquadDataError(f"{source}: holds no questions; pass a SQuAD v1.1/v2.0 JSON file")
    return questions


# How the official download names each split's file, and the hub repository and config folder of each version.
JSON_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
JSON_FILES = {"v1.1": {"train": "train-v1.1.json", "validation": "dev-v1.1.json"},
              "v2.0": {"train": "train-v2.0.json", "validation": "dev-v2.0.json"}}
HUB = {"v1.1": ("rajpurkar/squad", "plain_text"), "v2.0": ("rajpurkar/squad_v2", "squad_v2")}
ROW_COLUMNS = ["id", "question", "context", "answers"]


def questions_of_rows(columns: dict[str, list], where: str) -> list[Question]:
    """Questions from rows in the layout TFDS and the hub share (id, question, context, answers: {text,
    answer_start}); a question without answers is unanswerable (v2.0)."""
    decode = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
    questions = [Question(decode(qid), decode(question), decode(context),
                          tuple((decode(t), int(a)) for t, a in zip(answers["text"], answers["answer_start"])),
                          not len(answers["text"]))
                 for qid, question, context, answers in zip(*(columns[k] for k in ROW_COLUMNS))]
    if not questions:
        raise SquadDataError(f"{where}: holds no questions")
    return questions


def read_questions(source: str, split: str, version: str, tfds_data_dir: str | None = None,
                   flag: str = "--config.data_dir") -> list[Question]:
    """The questions of one split (train | validation) of the SQuAD data `source` names: a JSON or parquet file, a
    folder of the official JSON files, the hub's rajpurkar/squad (or squad_v2: its root or config folder), or
    tfds:squad[/v1.1]. `version` (v1.1 | v2.0) picks the file names and the TFDS config; `flag` names the source in
    errors."""
    if name := data_sources.tfds_name(source):
        if name.split:
            raise SquadDataError(f"{flag}={name}: fine-tuning reads the train and validation splits itself; drop "
                                 f"':{name.split}' (or name one file with config.train_file / predict_file)")
        dataset = f"squad/{version}" if name.name == "squad" else name.name
        rows = list(data_sources.tfds_rows(dataset, split, tfds_data_dir, f"{flag}={source}"))
        columns = {key: [row[key] for row in rows] for key in ROW_COLUMNS}
        return questions_of_rows(columns, f"{flag}=tfds:{dataset} split {split!r}")
    repo, config = HUB[version]
    data_sources.reject_misspelled_path(source, flag)
    path = storage.as_path(source)
    if path.suffix == ".parquet":
        return read_parquet([path])
    if path.suffix == ".json":
        return questions_of(read_articles(path), str(path))
    if hub := data_sources.hub_config_folder(path, config):
        return read_parquet(data_sources.hub_split_files(hub, split))
    file = JSON_FILES[version][split]
    if (path / file).exists():
        return questions_of(read_articles(path / file), str(path / file))
    raise SquadDataError(
        f"{flag}={source}: no SQuAD {version} {split} data there (neither {file} nor the hub's "
        f"{config}/{split}-*.parquet); download it: {data_sources.hub_download_command(repo, source)} (or "
        f"curl --create-dirs -o {path / file} {JSON_URL}{file})")


def read_parquet(files: list[storage.Path]) -> list[Question]:
    """The questions of the hub's SQuAD parquet files, in file order."""
    columns = {key: [] for key in ROW_COLUMNS}
    for file in files:
        for batch in data_sources.parquet_columns(file, ROW_COLUMNS, "give a parquet file of rajpurkar/squad"):
            for key in ROW_COLUMNS:
                columns[key] += batch[key]
    return questions_of_rows(columns, ", ".join(map(str, files)))


def read_squad(path: storage.PathLike, training: bool) -> list[Example]:
    """The examples of a SQuAD JSON file (local or in a bucket), in file order; see `examples_of`."""
    path = storage.as_path(path)
    return examples_of(questions_of(read_articles(path), str(path)), training, str(path))


def examples_of(questions: list[Question], training: bool, source: str) -> list[Example]:
    """Examples of questions in their order. As BERT's run_squad, a first answer whose text is not at its
    answer_start is counted; in training its question is skipped, in evaluation it is kept (the scorer reads the
    gold texts). `source` names where they came from in the log and errors."""
    examples, misplaced = [], []
    for q in questions:
        start = end = -1
        if not q.is_impossible:
            text, answer_start = q.answers[0]
            if answer_is_at(q.context, text, answer_start):
                start, end = answer_start, answer_start + len(text)
            else:
                misplaced.append(q.qid)
                if training:
                    continue
        examples.append(Example(q.qid, q.question, q.context, start, end, q.is_impossible))
    if misplaced:
        logging.warning("%s: %d answers are not at their answer_start%s (first: question %s)", source,
                        len(misplaced), "; their questions are skipped" if training else "", misplaced[0])
    if not examples:
        raise SquadDataError(f"{source}: none of its {len(misplaced)} answers is at its answer_start, so there is "
                             "nothing to train on; fix the answer_start offsets")
    return examples


def answer_is_at(context: str, text: str, answer_start: int) -> bool:
    """run_squad's test: the whitespace-separated words that answer_start..answer_start+len(text) touches contain
    the text (whitespace runs compared as one space)."""
    end = answer_start + len(text)
    if not text.strip() or not 0 <= answer_start < end <= len(context):
        return False
    if context[answer_start:end] == text:
        return True
    while answer_start > 0 and not context[answer_start - 1].isspace():
        answer_start -= 1
    while end < len(context) and not context[end].isspace():
        end += 1
    return " ".join(text.split()) in " ".join(context[answer_start:end].split())


def is_separator(ch: str) -> bool:
    """Punctuation splits into its own piece; BERT counts all non-alphanumeric ASCII symbols as punctuation."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def split_pieces(text: str) -> list[tuple[int, int]]:
    """Character spans of the words and punctuation marks of `text` (whitespace dropped)."""
    spans, start = [], None
    for i, ch in enumerate(text):
        if ch.isspace() or is_separator(ch):
            if start is not None:
                spans.append((start, i))
                start = None
            if not ch.isspace():
                spans.append((i, i + 1))
        elif start is None:
            start = i
    if start is not None:
        spans.append((start, len(text)))
    return spans


def tokenize_context(tokenizer, context: str) -> tuple[list[int], np.ndarray]:
    """Token ids and, per token, the (start, end) characters of the piece it came from."""
    pieces = split_pieces(context)
    ids, spans = [], []
    for span, piece_ids in zip(pieces, tokenizer.encode_batch([context[s:e] for s, e in pieces])):
        ids += piece_ids
        spans += [span] * len(piece_ids)
    return ids, np.asarray(spans, np.int32).reshape(-1, 2)


def window_starts(num_tokens: int, window: int, doc_stride: int) -> list[int]:
    """Start of each window so that windows of `window` tokens, `doc_stride` apart, cover every token."""
    starts = [0]
    while starts[-1] + window < num_tokens:
        starts.append(starts[-1] + min(window, doc_stride))
    return starts


def max_context_mask(start: int, length: int, all_starts: list[int], window: int, num_tokens: int) -> np.ndarray:
    """bool[length]: the window at `start` is where each of its tokens has the most context (ties: earliest)."""
    def score(s, positions):
        n = min(window, num_tokens - s)
        return np.minimum(positions - s, s + n - 1 - positions) + 0.01 * n

    positions = np.arange(start, start + length)
    best = np.full(length, -np.inf)
    best_start = np.full(length, -1)
    for s in all_starts:
        inside = (positions >= s) & (positions < s + min(window, num_tokens - s))
        better = inside & (score(s, positions) > best)
        best = np.where(better, score(s, positions), best)
        best_start = np.where(better, s, best_start)
    return best_start == start


def build_features(examples: list[Example], tokenizer, family: str, max_seq_length: int, doc_stride: int,
                   max_query_length: int) -> dict[str, np.ndarray]:
    """Model inputs plus, per feature, its example index, each position's context characters ((-1, -1) outside
    the context), the max-context mask, and the answer's token positions ((0, 0), the [CLS] token, when absent)."""
    question_ids = tokenizer.encode_batch([e.question for e in examples])
    contexts = {}
    rows = collections.defaultdict(list)
    long_contexts = long_questions = 0
    for index, (example, q_ids) in enumerate(zip(examples, question_ids)):
        long_questions += len(q_ids) > max_query_length
        q_ids = q_ids[:max_query_length]
        if example.context not in contexts:
            contexts[example.context] = tokenize_context(tokenizer, example.context)
        doc_ids, doc_spans = contexts[example.context]
        window = max_seq_length - len(q_ids) - special_count(family, pair=True)
        offset = len(q_ids) + special_count(family, pair=True) - 1  # where the context starts in the input
        starts = window_starts(len(doc_ids), window, doc_stride)
        long_contexts += len(starts) > 1
        answer = answer_tokens(example, doc_spans)
        for start in starts:
            length = min(window, len(doc_ids) - start)
            ids, types = pack(q_ids, doc_ids[start:start + length], tokenizer.special, family)
            spans = np.full((max_seq_length, 2), -1, np.int32)
            spans[offset:offset + length] = doc_spans[start:start + length]
            max_context = np.zeros(max_seq_length, bool)
            max_context[offset:offset + length] = max_context_mask(start, length, starts, window, len(doc_ids))
            inside = answer is not None and start <= answer[0] and answer[1] < start + length
            rows["input_ids"].append(ids)
            rows["token_type_ids"].append(types)
            rows["example_index"].append(index)
            rows["token_spans"].append(spans)
            rows["max_context"].append(max_context)
            rows["start_positions"].append(offset + answer[0] - start if inside else 0)
            rows["end_positions"].append(offset + answer[1] - start if inside else 0)
    if long_contexts or long_questions:
        logging.warning("%d of %d questions have a context longer than max_seq_length=%d, split into windows %d "
                        "tokens apart; %d questions were cut to max_query_length=%d", long_contexts, len(examples),
                        max_seq_length, doc_stride, long_questions, max_query_length)
    lengths = np.array([len(i) for i in rows["input_ids"]])
    return {
        "input_ids": pad_rows(rows.pop("input_ids"), max_seq_length, tokenizer.special.pad),
        "attention_mask": (np.arange(max_seq_length) < lengths[:, None]).astype(np.int32),
        "token_type_ids": pad_rows(rows.pop("token_type_ids"), max_seq_length, 0),
        **{k: np.asarray(v, np.int32 if k != "max_context" else bool) for k, v in rows.items()},
    }


def answer_tokens(example: Example, doc_spans: np.ndarray) -> tuple[int, int] | None:
    """First and last context token of the gold answer, or None (no answer, or it was not found)."""
    if example.is_impossible or example.answer_start < 0:
        return None
    overlapping = np.flatnonzero((doc_spans[:, 1] > example.answer_start) & (doc_spans[:, 0] < example.answer_end))
    return (int(overlapping[0]), int(overlapping[-1])) if len(overlapping) else None


def decode_predictions(examples: list[Example], features: dict[str, np.ndarray], start_logits: np.ndarray,
                       end_logits: np.ndarray, n_best: int = 20, max_answer_length: int = 30,
                       version_2: bool = False, null_threshold: float = 0.0) -> dict[str, str]:
    """Question id -> answer text. Each feature proposes its n_best starts x n_best ends; a valid span lies in the
    context, ends after it starts, is at most max_answer_length tokens and starts where it has most context. With
    version_2 the answer is "" when the null score (start and end at [CLS], lowest over the windows) beats the
    best span's by more than null_threshold."""
    by_example = collections.defaultdict(list)
    for f, index in enumerate(features["example_index"]):
        by_example[int(index)].append(f)
    predictions = {}
    for index, example in enumerate(examples):
        best_score, best_text, null_score = -np.inf, "", np.inf
        for f in by_example[index]:
            spans, starts, ends = features["token_spans"][f], start_logits[f], end_logits[f]
            null_score = min(null_score, starts[0] + ends[0])
            for s in np.argsort(starts)[::-1][:n_best]:
                for e in np.argsort(ends)[::-1][:n_best]:
                    valid = (spans[s, 0] >= 0 and spans[e, 0] >= 0 and s <= e < s + max_answer_length
                             and features["max_context"][f, s])
                    if valid and starts[s] + ends[e] > best_score:
                        best_score, best_text = starts[s] + ends[e], example.context[spans[s, 0]:spans[e, 1]]
        if version_2 and null_score - best_score > null_threshold:
            best_text = ""
        predictions[example.qid] = best_text
    return predictions
