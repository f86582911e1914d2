"""One way to name a dataset wherever bert_jax reads one: fine-tuning's config.data_dir, the similarity command's
--data, prepare's inputs, the comparison's --glue.

    PATH                 a local path or bucket URL: the data in its own format (GLUE TSVs, SQuAD JSON, text or JSON
                         lines), or a Hugging Face hub dataset repository as `hf download` leaves it, parquet files
                         named CONFIG/SPLIT-00000-of-00001.parquet (`hf download nyu-mll/glue --repo-type=dataset
                         --local-dir=glue`)
    tfds:NAME[:SPLIT]    a TFDS dataset built in --tfds_data_dir (TFDS's own folder when that is empty); NAME may
                         carry a version (tfds:glue/rte:2.0.0:validation)

Nothing is downloaded here: the fetching is the user's, where there is network. Data that is not there is an error
naming the command that fetches it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import re
from typing import Iterable, Iterator

from bert_jax import storage
from bert_jax.errors import UserError, absl_warnings_off

TFDS_PREFIX = "tfds:"
VERSION = re.compile(r"\d+\.\d+\.\d+")
PARQUET_BATCH_ROWS = 1024  # rows converted to Python at once; pyarrow holds one row group's columns besides


class DataSourceError(UserError, ValueError):
    """A dataset that is not there or not in a form bert_jax reads; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class TfdsName:
    name: str  # builder[/config][:version], e.g. glue/rte
    split: str = ""  # empty where the reader picks the splits (fine-tuning reads train and validation)

    def __str__(self) -> str:
        return TFDS_PREFIX + self.name + (f":{self.split}" if self.split else "")


def tfds_name(text: str) -> TfdsName | None:
    """The TFDS dataset that `text` names (tfds:NAME[:VERSION][:SPLIT]), or None when it is a path."""
    if not str(text).startswith(TFDS_PREFIX):
        return None
    name, _, split = str(text)[len(TFDS_PREFIX):].partition(":")
    version, _, rest = split.partition(":")
    if VERSION.fullmatch(version):
        name, split = f"{name}:{version}", rest
    if not name:
        raise DataSourceError(f"{text!r} names no TFDS dataset; write tfds:NAME[:SPLIT], e.g. tfds:glue/rte")
    return TfdsName(name, split)


def tfds_build_command(names: str | list[str], data_dir: str | None) -> str:
    """The command, run in the repository, that fetches and builds TFDS datasets: TFDS's own CLI, after the `data`
    extra it needs with tensorflow-datasets 4.9.10 (mlcroissant, importlib_resources; setup.py)."""
    names = [names] if isinstance(names, str) else names
    return (f"pip install -e '.[data]' && tfds build {' '.join(n.split(':')[0] for n in names)}"
            + (f" --data_dir={data_dir}" if data_dir else ""))


def tfds_is_built(name: str, data_dir: str | None) -> bool:
    """Whether a TFDS dataset is built in data_dir (TFDS's default folder when None)."""
    import tensorflow_datasets as tfds

    with quiet_tfds():
        return tfds.builder(name, data_dir=data_dir or None).is_prepared()


@contextlib.contextmanager
def quiet_tfds():
    """Look a dataset up in TFDS without its leftovers: the warnings it logs for a dataset not built yet
    (bert_jax's error says it), and the empty temporary folder its builder makes then and never removes
    (DatasetInfo.initialize_from_bucket in tensorflow-datasets 4.9)."""
    with absl_warnings_off(), storage.temporary_files_kept_inside("bert_jax-tfds-lookup-"):
        yield


def hub_download_command(repo: str, local_dir: storage.PathLike, include: str = "") -> str:
    """The command that downloads a hub dataset repository (huggingface_hub's CLI, installed with bert_jax)."""
    return (f"hf download {repo} --repo-type=dataset" + (f" --include='{include}'" if include else "")
            + f" --local-dir={local_dir}")


def tfds_builder(name: str, data_dir: str | None, where: str, split: str = ""):
    """The builder of a TFDS dataset that is built already (and has `split`, when given); `where` (the flag and
    value the user gave) starts the error messages."""
    import tensorflow_datasets as tfds  # imported here: slow, and only TFDS inputs need it

    try:
        with quiet_tfds():
            builder = tfds.builder(name, data_dir=data_dir or None)
            built = builder.is_prepared()
    except (tfds.core.registered.DatasetNotFoundError, ValueError) as e:  # an unknown dataset, config or version
        raise DataSourceError(f"{where}: no TFDS dataset {name} ({str(e).splitlines()[0]})") from e
    if not built:
        raise DataSourceError(f"{where}: TFDS {name} is not built in {builder.data_dir_root}; fetch it where there "
                              f"is network: {tfds_build_command(name, data_dir)}")
    if split and split.split("[")[0] not in builder.info.splits:  # train[:10%] is a slice of train
        raise DataSourceError(f"{where}: TFDS {name} has no split {split!r}, only {', '.join(builder.info.splits)}")
    return builder


def tfds_rows(name: str, split: str, data_dir: str | None, where: str) -> Iterator[dict]:
    """The examples of one split of a built TFDS dataset, as dicts of numpy values (text as bytes)."""
    return tfds_builder(name, data_dir, where, split).as_dataset(split=split).as_numpy_iterator()


def reject_misspelled_path(source: str, flag: str) -> None:
    """Raise, naming the path and the closest name beside it, when `source` does not exist but something close does:
    advice to download into a misspelled folder would fill the wrong one. A path with nothing close is left to the
    caller's own missing-data line, which names the commands that fetch the data."""
    path = storage.as_path(source)
    if path.exists() or not path.parent.is_dir():
        return
    if close := difflib.get_close_matches(path.name, [p.name for p in path.parent.iterdir()], n=1):
        raise DataSourceError(f"{flag}={source}: no such file or folder; did you mean {path.parent / close[0]}?")


def hub_config_folder(root: storage.PathLike, config: str) -> storage.Path | None:
    """Where a downloaded hub repository keeps one config's parquet files: `root` itself when they are there (the
    config's folder was given), else root/config; None when neither holds parquet files."""
    root = storage.as_path(root)
    for folder in (root, root / config):
        if folder.is_dir() and any(folder.glob("*.parquet")):
            return folder
    return None


def hub_split_files(folder: storage.Path, split: str, required: bool = True) -> list[storage.Path]:
    """The parquet files of one split in a hub config folder (SPLIT-00000-of-00002.parquet, ...), in order; none
    is an error when the split is `required`."""
    files = sorted(folder.glob(f"{split}-*.parquet"))
    if required and not files:
        raise DataSourceError(f"{folder}: no {split}-*.parquet; download the whole folder of the hub repository")
    return files


def parquet_columns(path: storage.PathLike, columns: list[str], hint: str) -> Iterator[dict[str, list]]:
    """A parquet file's `columns` (local or in a bucket), PARQUET_BATCH_ROWS rows at a time as lists, so that memory
    holds one row group whatever the file's size. A missing column is an error naming the file, the columns it
    has, and `hint` (what to do)."""
    import pyarrow.parquet as pq  # imported here: only parquet inputs need it

    path = storage.as_path(path)
    try:
        with path.open("rb") as f:
            reader = pq.ParquetFile(f)
            if missing := [c for c in columns if c not in reader.schema_arrow.names]:
                raise DataSourceError(f"{path}: no column {', '.join(map(repr, missing))} (it has "
                                      f"{', '.join(reader.schema_arrow.names)}); {hint}")
            for batch in reader.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
                yield batch.to_pydict()
    except UserError:
        raise
    except OSError as e:  # pyarrow's ArrowInvalid for a file that is not parquet is a ValueError, named below
        raise storage.explain(path, e) from e
    except ValueError as e:
        raise DataSourceError(f"{path}: not a parquet file ({e})") from e


def json_lines(lines: Iterable[str], where: str, error: type[UserError]) -> Iterator[tuple[int, object]]:
    """(line number, value) of each non-blank line of a JSON lines text; a line that is not JSON raises `error`
    naming where:number, since a reader that skipped it would silently train or score on fewer rows."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{where}:{number}: not a JSON object ({e}); JSON lines hold one object per line") from e
        yield number, value
