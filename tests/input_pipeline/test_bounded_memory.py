"""Bounded memory and honest counts wherever pretraining text is read: long lines cut and counted, tokenizer batches
bounded, a clear error when nothing usable remains, markers that notice a changed input, one-line CLI errors."""
import json
import os
import subprocess
import sys
import tracemalloc

import pytest

from bert_jax import config_lib
from bert_jax.errors import UserError
from bert_jax.input_pipeline import documents, plain_text, prepare, train_tokenizer
from bert_jax.input_pipeline.config import REPO_ROOT
from bert_jax.input_pipeline.pipeline import PretrainingPipeline

VOCAB = str(REPO_ROOT / "data" / "bert-base-uncased" / "vocab.txt")
WORDS = " ".join((REPO_ROOT / "data" / "corpus" / "chesterton-brown.txt").read_text(encoding="utf-8").split())


def one_line(path, size: int, text: str = WORDS):
    """A file of `size` bytes or so of `text` repeated, without any newline."""
    data = text.encode("utf-8")
    path.write_bytes(data * (size // len(data)) + data[:size % len(data)].rsplit(b" ", 1)[0])
    return path


def test_long_lines_are_cut_at_spaces_or_between_characters_and_counted(tmp_path, caplog):
    path = tmp_path / "long.txt"
    words, symbols = WORDS[:300_000], "€" * 50_000  # symbols: 150 kB of 3-byte characters without a space
    path.write_bytes(f"A short line.\n{words}\n{symbols}\n".encode() + b"\xff bad\nLast line.")
    counts = documents.new_counts()
    lines = list(documents.file_lines(path, counts))
    assert counts["long_lines_split"] == 2 and counts["invalid_utf8_lines"] == 1
    assert f"{path}:2: a line of {documents.MAX_LINE_BYTES} bytes or more" in caplog.text  # the first one, named
    assert f"{path}:4: invalid UTF-8" in caplog.text  # line numbers count lines, not pieces
    assert max(len(line.encode()) for line in lines) <= documents.MAX_LINE_BYTES
    pieces_of = {text: [line for line in lines if line and line in text] for text in (words, symbols)}
    assert " ".join(pieces_of[words]) == words and len(pieces_of[words]) > 4  # whole words in every piece
    assert "".join(pieces_of[symbols]) == symbols and len(pieces_of[symbols]) > 2
    assert lines[0] == "A short line." and lines[-1] == "Last line."


def test_reading_a_20_mb_line_holds_a_few_mb(tmp_path):
    path = one_line(tmp_path / "one_line.txt", 20 * 10**6)
    counts = documents.new_counts()
    tracemalloc.start()
    try:
        sizes = [sum(map(len, doc)) for doc in documents.read_documents(path, counts)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"peak Python allocation {peak / 2**20:.1f} MiB"
    assert sum(sizes) > 19.5 * 10**6 and max(sizes) < documents.MAX_DOCUMENT_CHARS + documents.MAX_LINE_BYTES
    assert counts["long_lines_split"] == 1 and counts["long_documents_split"] == len(sizes) - 1 >= 17


class CountingTokenizer:
    """One token per word; remembers how many characters each encode_batch call received."""

    def __init__(self):
        self.batch_chars = []

    def encode_batch(self, lines):
        self.batch_chars.append(sum(map(len, lines)))
        return [[1] * len(line.split()) for line in lines]


def test_tokenizer_batches_are_bounded_in_characters(tmp_path):
    path = one_line(tmp_path / "one_line.txt", 12 * 10**6)
    tokenizer, counts = CountingTokenizer(), documents.new_counts()
    docs = list(documents.tokenize_files([path], tokenizer, counts))
    assert len(tokenizer.batch_chars) > 2
    assert max(tokenizer.batch_chars) < documents.ENCODE_BATCH_CHARS + documents.MAX_DOCUMENT_CHARS
    assert counts["documents"] == len(docs) > 10 and counts["long_lines_split"] == 1
    assert counts["tokens"] == sum(len(tokens) for tokens, _ in docs) > 2 * 10**6


def test_too_few_documents_says_why(tmp_path):
    (tmp_path / "one.txt").write_text("Only one sentence here.\n\nAnd one more, alone.\n")
    (tmp_path / "empty.txt").write_text("\n")
    config = config_lib.load_preset("bert", "tiny")
    config.data.input_files = str(tmp_path / "*.txt")
    with pytest.raises(documents.NoDocumentsError) as error:
        PretrainingPipeline(config)
    assert str(error.value) == (
        "config.data.input_files: 0 documents from 2 files: 1 empty file, 2 one-sentence documents skipped "
        "(2 needed); give text with one sentence per line and a blank line between documents of two or more "
        "sentences")
    assert isinstance(error.value, UserError)


def test_a_changed_input_or_setting_is_prepared_again(tmp_path):
    text, out = tmp_path / "text.txt", tmp_path / "out"
    text.write_text("One. Two.\nThree.\n\nFour.\nFive.\n\nSix.\nSeven.\n")
    job = prepare.work_units([str(text)], out, VOCAB, "wordpiece", True, 1)
    assert prepare.prepare(job, num_workers=1)["shards"] == 3
    own_files = {out / "00000-notes.txt": "mine", out / "00000-0002.tfrecord.bak": "mine too"}
    for path, content in own_files.items():
        path.write_text(content)
    done = {p: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")}
    assert prepare.prepare(job, num_workers=1)["shards"] == 3  # unchanged: skipped
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")} == done

    text.write_text("One. Two.\nThree.\n\nFour and five.\nSix and seven.\n")  # the user fixed the file
    totals = prepare.prepare(job, num_workers=1)
    assert totals["documents"] == totals["shards"] == 2 and sorted(p.name for p in out.glob("*.tfrecord")) == [
        "00000-0000.tfrecord", "00000-0001.tfrecord"]
    assert [len(lengths) for _, lengths in documents.read_shards(sorted(out.glob("*.tfrecord")))] == [2, 2]
    assert all(path.read_text() == content for path, content in own_files.items())  # not prepare's to delete

    bigger_shards = prepare.work_units([str(text)], out, VOCAB, "wordpiece", True, 10)
    assert prepare.prepare(bigger_shards, num_workers=1)["shards"] == 1  # a flag that changes the shards
    assert json.loads((out / "00000.done.json").read_text())["made_from"]["docs_per_shard"] == 10


def test_input_errors_are_user_errors_naming_the_key_or_flag(tmp_path):
    with pytest.raises(documents.InputFilesError, match=r"^config.data.input_files: 'nope/\*.txt' matches no file"):
        documents.expand_patterns("nope/*.txt", "config.data.input_files")
    with pytest.raises(documents.InputFilesError, match=r"^train_tokenizer FILES: input files not found: \[.*nope"):
        train_tokenizer.train("wordpiece", [tmp_path / "nope.txt"], 100, tmp_path / "out")
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "book.txt").write_text("One. Two.\n")
    with pytest.raises(plain_text.SameNameError, match="two input files are named book.txt"):
        plain_text.convert_files([tmp_path / "a" / "book.txt", tmp_path / "b" / "book.txt"], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before writing anything


def test_plain_text_cuts_a_huge_line_and_keeps_every_word(tmp_path):
    (tmp_path / "in").mkdir()
    source = one_line(tmp_path / "in" / "book.txt", 3 * 10**6)
    counts = documents.new_counts()
    [target] = plain_text.convert_files([source], tmp_path / "out", counts)
    converted = target.read_text()
    assert converted.split() == source.read_text().split()
    assert counts["long_lines_split"] == 1 and converted.count("\n\n") >= 2  # cut into documents of bounded size


def run_command(module, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=REPO_ROOT)


def test_commands_end_a_user_error_with_one_line_and_exit_code_1(tmp_path):
    one_sentence = tmp_path / "one.txt"
    one_sentence.write_text("Only one sentence here.\n")
    prepared = run_command("bert_jax.input_pipeline.prepare", f"--tokenizer={VOCAB}", f"--output={tmp_path}/out",
                           "--num_workers=1", one_sentence)
    inspected = run_command("bert_jax.input_pipeline.inspect", f"--config={REPO_ROOT}/configs/bert.py:tiny",
                            "--config.data.input_files=nope/*.txt")
    for result, error in [
        (prepared, ("error: prepare: 0 documents from 1 file: 1 one-sentence document skipped (1 needed); give text "
                    "with one sentence per line")),
        (inspected, "error: config.data.input_files: 'nope/*.txt' matches no file"),
    ]:
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1].startswith(error)
