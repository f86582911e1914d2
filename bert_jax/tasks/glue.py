"""The nine GLUE tasks: where their text and labels sit in the original TSV files (or TFDS), their label sets and
official metrics, and the submission format of their predictions.

A bad row is an error naming file:line: a column count that differs from the file's header (or from the task's
fixed count when the file has none), or a label outside the task's label set. The one exception is QQP, whose broken
rows are skipped as HF's QqpProcessor skips them: counted, and reported once per file with the first such line.
An empty file, or one with no rows, is an error too.
"""
from __future__ import annotations

import dataclasses
import io
import logging

import numpy as np

from bert_jax import storage
from bert_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Task:
    name: str  # the GLUE folder name, e.g. "SST-2"
    labels: tuple[str, ...] | None  # None: regression (STS-B)
    metrics: tuple[str, ...]
    columns: tuple[int, int | None, int]  # text_a, text_b, label in train/dev TSVs (-1: last column)
    test_columns: tuple[int, int | None]  # text_a, text_b in the unlabelled test TSV
    dev_files: tuple[str, ...] = ("dev",)
    test_files: tuple[str, ...] = ("test",)
    submission_names: tuple[str, ...] = ()  # file name per test file in the GLUE submission zip
    tfds_name: str = ""
    tfds_features: tuple[str, str | None] = ("sentence1", "sentence2")  # text_a, text_b in TFDS examples
    tfds_dev_splits: tuple[str, ...] = ("validation",)
    header: bool = True
    num_columns: int = 0  # for files without a header
    skips_broken_rows: bool = False  # skip rows with another column count (QQP, as HF's processor) instead of failing


# Label order follows TFDS's ClassLabel names, so a TFDS integer label indexes `labels` directly.
TASKS = {t.name.lower().replace("-", ""): t for t in (
    Task("CoLA", ("0", "1"), ("mcc",), (3, None, 1), (1, None), tfds_name="cola", tfds_features=("sentence", None),
         header=False, num_columns=4),
    Task("SST-2", ("0", "1"), ("accuracy",), (0, None, 1), (1, None), tfds_name="sst2",
         tfds_features=("sentence", None)),
    Task("MRPC", ("0", "1"), ("f1", "accuracy"), (3, 4, 0), (3, 4), tfds_name="mrpc"),
    Task("STS-B", None, ("pearson", "spearman"), (7, 8, 9), (7, 8), tfds_name="stsb"),
    Task("QQP", ("0", "1"), ("f1", "accuracy"), (3, 4, 5), (1, 2), tfds_name="qqp",
         tfds_features=("question1", "question2"), skips_broken_rows=True),
    Task("MNLI", ("entailment", "neutral", "contradiction"), ("accuracy",), (8, 9, -1), (8, 9),
         dev_files=("dev_matched", "dev_mismatched"), test_files=("test_matched", "test_mismatched"),
         submission_names=("MNLI-m", "MNLI-mm"), tfds_name="mnli", tfds_features=("premise", "hypothesis"),
         tfds_dev_splits=("validation_matched", "validation_mismatched")),
    Task("QNLI", ("entailment", "not_entailment"), ("accuracy",), (1, 2, 3), (1, 2), tfds_name="qnli",
         tfds_features=("question", "sentence")),
    Task("RTE", ("entailment", "not_entailment"), ("accuracy",), (1, 2, 3), (1, 2), tfds_name="rte"),
    Task("WNLI", ("0", "1"), ("accuracy",), (1, 2, 3), (1, 2), tfds_name="wnli"),
)}


class GlueDataError(UserError, ValueError):
    """A GLUE file, row or TFDS split that cannot be used; the message names it and says what to do."""


@dataclasses.dataclass
class Split:
    """The examples of one file: texts, and labels as class indices (float scores for STS-B; None for test)."""

    text_a: list[str]
    text_b: list[str] | None
    labels: np.ndarray | None


def get_task(name: str) -> Task:
    key = name.lower().replace("-", "").replace("_", "")
    if key not in TASKS:
        raise GlueDataError(f"unknown GLUE task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[key]


def label_set(task: Task) -> str:
    """The task's labels in words, for error messages."""
    return "a score in [0, 5]" if task.labels is None else f"one of {', '.join(task.labels)}"


def parse_label(task: Task, text: str):
    """A class index, or a float score for regression; None when the label is outside the task's set."""
    if task.labels is None:
        try:
            score = float(text)
        except ValueError:
            return None
        return score if 0.0 <= score <= 5.0 else None
    return task.labels.index(text) if text in task.labels else None


def read_tsv(task: Task, path: storage.PathLike, labelled: bool = True) -> Split:
    """One GLUE TSV, local or in a bucket; a bad row is an error naming file:line (QQP: skipped and reported)."""
    path = storage.as_path(path)
    if not path.exists():
        raise GlueDataError(f"{path} not found; pass the folder holding the GLUE {task.name} TSVs as "
                            "--config.data_dir (download_glue_data.py layout)")
    # QUOTE_NONE semantics: GLUE text holds unbalanced quotes, so split on tabs only. MRPC starts with a BOM.
    with io.TextIOWrapper(path.open("rb"), encoding="utf-8-sig") as f:
        lines = [line.rstrip("\r\n") for line in f]
    if not lines:
        raise GlueDataError(f"{path} is empty (0 bytes); download the GLUE {task.name} files again")
    has_header = task.header or not labelled
    num_columns = len(lines[0].split("\t")) if has_header else task.num_columns
    expected = f"the header's {num_columns} columns" if has_header else f"{task.name}'s {num_columns} columns"
    a_col, b_col, label_col = task.columns if labelled else (*task.test_columns, None)
    text_a, text_b, labels = [], [], []
    skipped = []
    for line_number, line in enumerate(lines[has_header:], start=1 + has_header):
        row = line.split("\t")
        if len(row) != num_columns:
            if task.skips_broken_rows:
                skipped.append(line_number)
                continue
            found = f"{len(row)} tab-separated columns" if line.strip() else "a blank line"
            raise GlueDataError(f"{path}:{line_number}: {found} instead of {expected}; fix or remove this row")
        if labelled:
            label = parse_label(task, row[label_col])
            if label is None:
                raise GlueDataError(f"{path}:{line_number}: label {row[label_col]!r} is not "
                                    f"{label_set(task)}; fix or remove this row")
            labels.append(label)
        text_a.append(row[a_col])
        text_b.append(row[b_col] if b_col is not None else None)
    if skipped:
        logging.warning("%s: skipped %d of %d rows that do not have %s, as HF's %s processor skips them "
                        "(first: line %d)", path, len(skipped), len(lines) - has_header, expected, task.name,
                        skipped[0])
    if not text_a:
        content = f"all its {len(skipped)} rows are broken" if skipped else "it holds only a header"
        raise GlueDataError(f"{path} has no {task.name} examples: {content}; pass a GLUE {task.name} TSV file")
    return Split(text_a, text_b if b_col is not None else None,
                 np.asarray(labels, np.float32 if task.labels is None else np.int32) if labelled else None)


def read_tfds(task: Task, split: str, data_dir: str | None = None) -> Split:
    """One split of TFDS `glue/<task>`, if it is already prepared (nothing is downloaded)."""
    import tensorflow_datasets as tfds

    try:
        dataset = tfds.load(f"glue/{task.tfds_name}", split=split, data_dir=data_dir, download=False)
    except Exception as e:  # TFDS raises several types for "not prepared"; all mean the same here
        raise GlueDataError(f"TFDS glue/{task.tfds_name} split {split!r} is not available offline ({e}); pass the "
                            "folder of GLUE TSV files as --config.data_dir") from e
    rows = list(tfds.as_numpy(dataset))
    a_key, b_key = task.tfds_features
    decode = lambda key: [r[key].decode("utf-8") for r in rows]
    labels = np.asarray([r["label"] for r in rows], np.float32 if task.labels is None else np.int32)
    return Split(decode(a_key), decode(b_key) if b_key else None, None if split.startswith("test") else labels)


def load_split(task: Task, split: str, data_dir: str = "", tfds_data_dir: str | None = None) -> list[Split]:
    """`split` in train | dev | test; dev and test are lists (MNLI has matched and mismatched)."""
    names = {"train": ("train",), "dev": task.dev_files, "test": task.test_files}[split]
    if data_dir:
        return [read_tsv(task, storage.as_path(data_dir) / f"{name}.tsv", labelled=split != "test") for name in names]
    tfds_splits = {"train": ("train",), "dev": task.tfds_dev_splits,
                   "test": tuple(s.replace("validation", "test") for s in task.tfds_dev_splits)}[split]
    return [read_tfds(task, s, tfds_data_dir) for s in tfds_splits]


def has_test_files(task: Task, data_dir: str) -> bool:
    """Whether the test split can be read: GLUE copies often leave its files out (then there is no submission
    file), while a test file that is there but broken is an error like any other. TFDS always has the split."""
    return not data_dir or all((storage.as_path(data_dir) / f"{name}.tsv").exists() for name in task.test_files)


def submission_names(task: Task) -> tuple[str, ...]:
    return task.submission_names or (task.name,)


def write_submission(task: Task, predictions: np.ndarray, path: storage.PathLike) -> None:
    """GLUE's format: a header "index\\tprediction", then one row per example in file order (label strings, or
    the STS-B score clipped to [0, 5]). Written whole (storage.atomic_write), local or in a bucket."""
    values = (f"{float(np.clip(p, 0.0, 5.0)):.3f}" if task.labels is None else task.labels[int(p)]
              for p in predictions)
    storage.atomic_write(path, "index\tprediction\n" + "".join(f"{i}\t{v}\n" for i, v in enumerate(values)))
