"""The one path layer: every path a user gives (workdir, data, tokenizer, checkpoint) may be local or a bucket URL.

Paths are etils `epath.Path`s, the layer Orbax and TFDS use. Buckets always go through fsspec (gcsfs for gs://),
never through TensorFlow's own GCS client: that client has no endpoint override, so code on it could not be tested
against a local GCS server. TensorFlow still does the work on bytes (TFRecord parsing, event protos), but bert_jax
moves the bytes itself (`read_records`, `write_records`, `local_copy`). docs/storage.md lists what this covers.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import struct
import tempfile
from typing import Iterable, Iterator

os.environ.setdefault("EPATH_USE_TF", "false")  # read when a path is used: buckets through fsspec, not tf.io.gfile
from etils import epath  # noqa: E402

from bert_jax.errors import UserError

Path = epath.Path
PathLike = epath.PathLike
# The fsspec package each bucket scheme needs (epath knows these schemes); gcsfs is a dependency of bert_jax.
SCHEME_PACKAGES = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}
GLOB_CHARACTERS = "*?["
# What a damaged shard's error says: prepare checks every shard against its unit's marker and redoes those that
# changed (bert_jax.input_pipeline.prepare_units).
REPREPARE = "run the prepare command that wrote it again, which redoes the units whose shards changed"
# gcsfs warns on every bucket that it cannot ask the layout API, and logs each request that ran out of retries with
# its traceback: the error itself reaches the caller, which names the path.
logging.getLogger("gcsfs").setLevel(logging.CRITICAL)


class StorageError(UserError, OSError):
    """A path that cannot be used: the message names it and says what to do."""


def scheme(path: PathLike) -> str | None:
    """"gs" for gs://bucket/..., None for a local path."""
    text = os.fspath(path)
    return text.split("://", 1)[0] if "://" in text else None


def is_remote(path: PathLike) -> bool:
    return scheme(path) is not None


def orbax_path(path: PathLike) -> Path:
    """A local path made absolute, a bucket URL as it is: Orbax reads and writes absolute local paths only."""
    path = as_path(path)
    return path if is_remote(path) else path.absolute()


def as_path(path: PathLike) -> Path:
    """A user's path string as an epath.Path; a URL scheme with no installed filesystem is a StorageError."""
    if isinstance(path, Path):
        return path
    name = scheme(path)
    if name is None:
        return Path(os.path.expanduser(os.fspath(path)))
    package = SCHEME_PACKAGES.get(name)
    if package is None:
        raise StorageError(f"{path}: {name}:// is not supported; use a local path or one of "
                           f"{', '.join(s + '://' for s in SCHEME_PACKAGES)}")
    if importlib.util.find_spec(package) is None:
        raise StorageError(f"{path}: {name}:// needs the {package} package, which is not installed; "
                           f"pip install {package}")
    return Path(os.fspath(path))


def bucket_of(path: PathLike) -> str | None:
    """gs://bucket/a/b -> gs://bucket; None for a local path."""
    name = scheme(path)
    return None if name is None else f"{name}://{os.fspath(path).split('://', 1)[1].split('/', 1)[0]}"


def explain(path: PathLike, error: BaseException) -> StorageError:
    """A StorageError naming the path and the likely fix for an exception raised while using it."""
    text = f"{type(error).__name__}: {error}".lower()
    where = bucket_of(path) or path
    if "credential" in text or "401" in text or "unauthorized" in text or "refresh" in text:
        why = (f"no valid credentials for {where}: run `gcloud auth application-default login` or set "
               "GOOGLE_APPLICATION_CREDENTIALS (TPU and GCE VMs use their service account)")
    elif isinstance(error, PermissionError) or "403" in text or "forbidden" in text or "permission" in text:
        why = (f"permission denied on {where}: grant this account read/write access to the bucket "
               "(roles/storage.objectAdmin)")
    elif isinstance(error, FileNotFoundError):
        why = "not found"
    else:
        why = f"{type(error).__name__}: {error}"
    return StorageError(f"{path}: {why}")


def check_bucket(path: PathLike) -> None:
    """Fail early, naming the bucket, if a bucket path's bucket is missing or unreachable (local paths pass).

    Needed before any mkdir: gcsfs would otherwise create a missing bucket in the default project."""
    bucket = bucket_of(path)
    if bucket is None:
        return
    try:
        exists = as_path(bucket).exists()
    except StorageError:
        raise
    except Exception as e:  # noqa: BLE001 - fsspec backends raise their own types; explain() names the cause
        raise explain(path, e) from e
    if not exists:
        raise StorageError(f"{path}: the bucket {bucket} does not exist or these credentials cannot see it; "
                           f"create it (gcloud storage buckets create {bucket}) or fix the path")


def make_dirs(path: PathLike) -> Path:
    """Create a folder (and parents) after checking its bucket; returns it as an epath.Path."""
    path = as_path(path)
    check_bucket(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except Exception as e:  # noqa: BLE001
        raise explain(path, e) from e
    return path


def check_writable(folder: PathLike) -> None:
    """Create `folder` and write and delete a probe file in it: credentials and permissions fail here, once,
    with one line, not at the first checkpoint an hour later."""
    folder = make_dirs(folder)
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        probe.write_text("ok")
        probe.unlink()
    except Exception as e:  # noqa: BLE001
        raise explain(folder, e) from e


@contextlib.contextmanager
def atomic_open(path: PathLike) -> Iterator:
    """A binary file to write whole: readers see the old content or the new, never half of it, and a failure
    leaves nothing behind. It is written beside the target and renamed over it (a server-side copy in a bucket)."""
    path = as_path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        with tmp.open("wb") as f:
            yield f
        move_file(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: PathLike, data: bytes | str) -> None:
    """Write a whole file atomically (see `atomic_open`)."""
    with atomic_open(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def _bucket_fs(path: Path):
    """epath's own fsspec instance for a bucket path (so that its listing cache stays right) and the bare path."""
    from fsspec.core import strip_protocol

    return epath.backend.fsspec_backend.fs(path), strip_protocol(os.fspath(path))


def forget_listings(path: PathLike) -> None:
    """Drop this process's cached bucket listings under `path`: gcsfs keeps what it listed, so a file that another
    host wrote since would look absent here."""
    if is_remote(path):
        fs, root = _bucket_fs(as_path(path))
        fs.invalidate_cache(root)


def move_file(source: PathLike, target: PathLike) -> None:
    """Rename a file over `target`: os.replace locally, a server-side copy then delete in a bucket (gcsfs's own move
    first tries an object-move API that not every bucket, nor the test server, offers, for half a minute)."""
    source, target = as_path(source), as_path(target)
    if not is_remote(source):
        os.replace(source, target)
        return
    fs, bare = _bucket_fs(source)
    fs.copy(bare, _bucket_fs(target)[1])
    fs.rm(bare)


def move_tree(source: PathLike, target: PathLike) -> None:
    """Move a folder to `target` (absent, same filesystem): a rename locally. A bucket has no folders to rename:
    each object is copied server-side (a failed copy removes the target again), then the source is deleted."""
    source, target = as_path(source), as_path(target)
    if not is_remote(source):
        source.rename(target)
        return
    fs, root = _bucket_fs(source)
    new_root = _bucket_fs(target)[1]
    files = fs.find(root)
    try:
        fs.copy(files, [new_root + file[len(root):] for file in files])
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm(new_root, recursive=True)
        raise
    fs.rm(root, recursive=True)


def glob(pattern: str) -> list[Path]:
    """The sorted files a pattern matches (`*`, `?`, `[...]` in any component), local or in a bucket."""
    parts = pattern.split("/")
    first_glob = next((i for i, part in enumerate(parts) if any(c in part for c in GLOB_CHARACTERS)), None)
    if first_glob is None:
        path = as_path(pattern)
        return [path] if path.is_file() else []
    root = "/".join(parts[:first_glob]) or ("/" if pattern.startswith("/") else ".")
    return sorted(p for p in as_path(root).glob("/".join(parts[first_glob:])) if p.is_file())


@contextlib.contextmanager
def local_copy(files: Iterable[PathLike]) -> Iterator[str]:
    """A local folder holding copies of `files` (which must share a folder), for libraries that open local paths
    only (TensorFlow's checkpoint reader). Local files are used where they are, without a copy."""
    files = [as_path(f) for f in files]
    if not any(is_remote(f) for f in files):
        yield os.fspath(files[0].parent) if files else "."
        return
    with tempfile.TemporaryDirectory(prefix="bert_jax-") as folder:
        for file in files:
            with file.open("rb") as source, open(os.path.join(folder, file.name), "wb") as target:
                shutil.copyfileobj(source, target, 1 << 24)
        yield folder


@contextlib.contextmanager
def temporary_files_kept_inside(prefix: str) -> Iterator[None]:
    """Inside the block Python's `tempfile` makes its folders in one of ours, removed after with all they hold: for
    libraries that make temporary folders and never remove them (TFDS's builder, Beam's job submission)."""
    temp_root = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        tempfile.tempdir = scratch
        try:
            yield
        finally:
            tempfile.tempdir = temp_root


# ---- TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C of the data ----------------------


def _masked_crc(data: bytes) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def framed(record: bytes) -> bytes:
    """One record as a TFRecord file holds it (what tf.io.TFRecordWriter writes, uncompressed)."""
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", _masked_crc(length)) + record + struct.pack("<I", _masked_crc(record))


def write_records(path: PathLike, records: Iterable[bytes]) -> dict:
    """Stream records into a TFRecord file, atomically (see `atomic_open`); returns how many were written and the
    file's `fingerprint`, computed on the way."""
    import google_crc32c

    count, size, checksum = 0, 0, google_crc32c.Checksum()
    with atomic_open(path) as f:
        for count, record in enumerate(records, 1):
            data = framed(record)
            f.write(data)
            size += len(data)
            checksum.update(data)
    return {"records": count, "size": size, "crc32c": checksum.hexdigest().decode()}


def fingerprint(path: PathLike, chunk_bytes: int = 1 << 24) -> dict:
    """A file's size and CRC32C (what `write_records` returns), read whole."""
    import google_crc32c

    size, checksum = 0, google_crc32c.Checksum()
    with as_path(path).open("rb") as f:
        while chunk := f.read(chunk_bytes):
            size += len(chunk)
            checksum.update(chunk)
    return {"size": size, "crc32c": checksum.hexdigest().decode()}


def read_records(path: PathLike) -> Iterator[bytes]:
    """The records of a TFRecord file, streamed, each checked against its CRC; a damaged file names itself."""
    path = as_path(path)
    with path.open("rb") as f:
        while header := f.read(12):
            if len(header) < 12:
                raise StorageError(f"{path}: truncated TFRecord file; {REPREPARE}")
            (length,), (length_crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
            data, footer = f.read(length), f.read(4)
            if (_masked_crc(header[:8]) != length_crc or len(data) < length or len(footer) < 4
                    or _masked_crc(data) != struct.unpack("<I", footer)[0]):
                raise StorageError(f"{path}: corrupt or truncated TFRecord file; {REPREPARE}")
            yield data
