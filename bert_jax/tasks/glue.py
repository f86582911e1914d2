"""The nine GLUE tasks: where their text and labels sit in the original TSV files, TFDS's glue/<task> and the hub's
nyu-mll/glue parquet files, their label sets and official metrics, and the submission format of their predictions.
The three sources give the same examples in the same order (`split_of_rows`).

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

from bert_jax import data_sources, storage
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
    tfds_features: tuple[str, str | None] = ("sentence1", "sentence2")  # text_a, text_b in TFDS and hub rows
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
        raise GlueDataError(f"{path} not found; a folder of GLUE {task.name} TSVs holds train.tsv, "
                            f"{', '.join(f + '.tsv' for f in task.dev_files)} and, for a submission, "
                            f"{', '.join(f + '.tsv' for f in task.test_files)}")
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


def split_of_rows(task: Task, columns: dict[str, list], labelled: bool, where: str) -> Split:
    """The examples of rows in the layout TFDS and the hub share (sentence1, ..., label as a class index, idx), in
    idx order: TFDS stores rows shuffled and idx is their row in GLUE's TSV, so every source gives one order. An
    unlabelled split (test) has label -1 everywhere; a labelled row without a valid label is an error."""
    if not len(columns["label"]):
        raise GlueDataError(f"{where} holds no {task.name} examples")
    order = np.argsort(columns["idx"], kind="stable") if "idx" in columns else np.arange(len(columns["label"]))
    text = lambda key: [v.decode("utf-8") if isinstance(v, bytes) else v for v in (columns[key][i] for i in order)]
    labels = np.asarray(columns["label"])[order].astype(np.float32 if task.labels is None else np.int32)
    if labelled:
        valid = (labels >= 0) & (labels <= 5) if task.labels is None else (labels >= 0) & (labels < len(task.labels))
        if not valid.all():
            bad = int(np.flatnonzero(~valid)[0])
            raise GlueDataError(f"{where}: row {bad} has label {labels[bad]}, not {label_set(task)} (test splits "
                                "have no labels); give the train or validation split")
    a_key, b_key = task.tfds_features
    return Split(text(a_key), text(b_key) if b_key else None, labels if labelled else None)


def read_tfds(task: Task, name: str, split: str, data_dir: str | None, flag: str) -> Split:
    """One split of a built TFDS GLUE dataset (nothing is downloaded)."""
    rows = list(data_sources.tfds_rows(name, split, data_dir, f"{flag}=tfds:{name}"))
    columns = {key: [row[key] for row in rows] for key in rows[0]} if rows else {"label": []}
    return split_of_rows(task, columns, not split.startswith("test"), f"{flag}=tfds:{name} split {split!r}")


def read_parquet(task: Task, files: list[storage.Path], labelled: bool) -> Split:
    """One split of the hub's nyu-mll/glue (one or more parquet files of the task's config folder)."""
    a_key, b_key = task.tfds_features
    keys = [a_key, *([b_key] if b_key else []), "label", "idx"]
    hint = f"give the {task.tfds_name} folder of the hub's nyu-mll/glue"
    columns = {key: [] for key in keys}
    for file in files:
        for batch in data_sources.parquet_columns(file, keys, hint):
            for key in keys:
                columns[key] += batch[key]
    return split_of_rows(task, columns, labelled, ", ".join(map(str, files)))


def tfds_dataset(task: Task, name: data_sources.TfdsName, flag: str) -> str:
    """The TFDS dataset a fine-tuning source names: tfds:glue picks the task's config; tfds:glue/<config> must be
    the task's. The task reads its own splits, so a :SPLIT is an error."""
    if name.split:
        raise GlueDataError(f"{flag}={name}: {task.name} reads its train, validation and test splits itself; "
                            f"drop ':{name.split}'")
    if name.name == "glue":
        return f"glue/{task.tfds_name}"
    config = name.name.split(":")[0].partition("/")[2]
    if name.name.startswith("glue/") and config != task.tfds_name:
        raise GlueDataError(f"{flag}={name}: that is GLUE's {config}, not {task.name}; pass tfds:glue or "
                            f"tfds:glue/{task.tfds_name}")
    return name.name


def split_names(task: Task, split: str) -> tuple[str, ...]:
    """The TFDS and hub names of a split (train | dev | test): validation, validation_matched, test_matched..."""
    return {"train": ("train",), "dev": task.tfds_dev_splits,
            "test": tuple(s.replace("validation", "test") for s in task.tfds_dev_splits)}[split]


def missing_data(task: Task, source: str, flag: str, tfds_data_dir: str | None = None) -> GlueDataError:
    """The one line for a source that holds no data of the task, naming the commands that fetch it."""
    download = data_sources.hub_download_command("nyu-mll/glue", source, f"{task.tfds_name}/*")
    return GlueDataError(f"{flag}={source}: no GLUE {task.name} data there (neither its TSVs nor the hub's "
                         f"{task.tfds_name}/*.parquet); download it: {download} (or "
                         f"{data_sources.tfds_build_command(f'glue/{task.tfds_name}', tfds_data_dir)} and "
                         f"{flag}=tfds:glue)")


def load_split(task: Task, split: str, data_dir: str, tfds_data_dir: str | None = None,
               flag: str = "--config.data_dir") -> list[Split]:
    """`split` in train | dev | test; dev and test are lists (MNLI has matched and mismatched). `data_dir` names the
    data in any form of bert_jax.data_sources: a folder of the task's GLUE TSVs, the hub's nyu-mll/glue (its root or
    the task's folder), or tfds:glue[/<task>]. `flag` says where the user gave it, for the error messages."""
    if not data_dir:
        raise GlueDataError(f"{flag} is empty; name the {task.name} data: a folder of its GLUE TSVs, the hub's "
                            f"nyu-mll/glue, or tfds:glue")
    if name := data_sources.tfds_name(data_dir):
        return [read_tfds(task, tfds_dataset(task, name, flag), s, tfds_data_dir, flag)
                for s in split_names(task, split)]
    if hub := data_sources.hub_config_folder(data_dir, task.tfds_name):
        return [read_parquet(task, data_sources.hub_split_files(hub, s), split != "test")
                for s in split_names(task, split)]
    names = {"train": ("train",), "dev": task.dev_files, "test": task.test_files}[split]
    data_sources.reject_misspelled_path(data_dir, flag)
    folder = storage.as_path(data_dir)
    if not (folder / f"{names[0]}.tsv").exists() and not (folder / "train.tsv").exists():
        raise missing_data(task, data_dir, flag, tfds_data_dir)
    return [read_tsv(task, folder / f"{name}.tsv", labelled=split != "test") for name in names]


def has_test_files(task: Task, data_dir: str) -> bool:
    """Whether the test split can be read: GLUE copies often leave its files out (then there is no submission
    file), while a test file that is there but broken is an error like any other. TFDS always has the split."""
    if data_sources.tfds_name(data_dir):
        return True
    if hub := data_sources.hub_config_folder(data_dir, task.tfds_name):
        return all(data_sources.hub_split_files(hub, s, required=False) for s in split_names(task, "test"))
    return all((storage.as_path(data_dir) / f"{name}.tsv").exists() for name in task.test_files)


def check_tasks(tasks: list[Task], glue_root: str, tfds_data_dir: str | None, flag: str) -> None:
    """Fail before any work when a GLUE source given once for several tasks lacks some of them: one line naming
    them and the one command that fetches them all."""
    if name := data_sources.tfds_name(glue_root):
        datasets = [tfds_dataset(task, name, flag) for task in tasks]
        if missing := [d for d in datasets if not data_sources.tfds_is_built(d, tfds_data_dir)]:
            raise GlueDataError(f"{flag}={glue_root}: TFDS {', '.join(missing)} not built; fetch them where there is "
                                f"network: {data_sources.tfds_build_command(missing, tfds_data_dir)}")
        return
    has_data = lambda task: (data_sources.hub_config_folder(glue_root, task.tfds_name)
                             or (storage.as_path(task_data_dir(glue_root, task)) / "train.tsv").exists())
    if missing := [task for task in tasks if not has_data(task)]:
        raise GlueDataError(f"{flag}={glue_root} lacks {', '.join(t.name for t in missing)} (neither GLUE TSV folders "
                            f"such as {missing[0].name}/train.tsv nor the hub's {missing[0].tfds_name}/*.parquet); "
                            f"download them: {data_sources.hub_download_command('nyu-mll/glue', glue_root)}")


def task_data_dir(glue_root: str, task: Task) -> str:
    """One task's data_dir under a GLUE source given once for several tasks (the comparison's --glue): tfds:glue
    and the hub's repository as they are (the task picks its config), a folder of task folders joined with the
    task's (RTE/, SST-2/, as download_glue_data.py lays them out)."""
    if data_sources.tfds_name(glue_root) or data_sources.hub_config_folder(glue_root, task.tfds_name):
        return glue_root
    return str(storage.as_path(glue_root) / task.name)


def submission_names(task: Task) -> tuple[str, ...]:
    return task.submission_names or (task.name,)


def write_submission(task: Task, predictions: np.ndarray, path: storage.PathLike) -> None:
    """GLUE's format: a header "index\\tprediction", then one row per example in file order (label strings, or
    the STS-B score clipped to [0, 5]). Written whole (storage.atomic_write), local or in a bucket."""
    values = (f"{float(np.clip(p, 0.0, 5.0)):.3f}" if task.labels is None else task.labels[int(p)]
              for p in predictions)
    storage.atomic_write(path, "index\tprediction\n" + "".join(f"{i}\t{v}\n" for i, v in enumerate(values)))
