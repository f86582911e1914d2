"""The path layer (bert_jax.storage) against local folders and a real GCS server on localhost."""
import subprocess
import sys

import pytest
import tensorflow as tf

from bert_jax import storage


def test_records_are_what_tensorflow_reads_and_writes(tmp_path):
    records = [b"", b"one", bytes(range(256)) * 40]
    ours = tmp_path / "ours.tfrecord"
    storage.write_records(ours, records)
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(ours))] == records
    theirs = tmp_path / "theirs.tfrecord"
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for record in records:
            writer.write(record)
    assert ours.read_bytes() == theirs.read_bytes()
    assert list(storage.read_records(theirs)) == records


def test_a_damaged_record_file_names_itself(tmp_path):
    path = tmp_path / "x.tfrecord"
    storage.write_records(path, [b"abcdef" * 10])
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(storage.StorageError, match="x.tfrecord: corrupt or truncated"):
        list(storage.read_records(path))


def test_bucket_round_trip_glob_and_local_copy(bucket_dir):
    storage.make_dirs(f"{bucket_dir}/a/b")
    storage.atomic_write(f"{bucket_dir}/a/b/one.txt", "1")
    storage.atomic_write(f"{bucket_dir}/a/two.txt", b"2")
    storage.write_records(f"{bucket_dir}/a/r.tfrecord", [b"x", b"yz"])
    assert [p.name for p in storage.glob(f"{bucket_dir}/a/*.txt")] == ["two.txt"]
    assert [p.name for p in storage.glob(f"{bucket_dir}/*/b/*.txt")] == ["one.txt"]
    assert list(storage.read_records(f"{bucket_dir}/a/r.tfrecord")) == [b"x", b"yz"]
    with storage.local_copy([f"{bucket_dir}/a/two.txt"]) as folder:
        assert open(f"{folder}/two.txt").read() == "2"


def test_local_paths_are_used_in_place(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    with storage.local_copy([tmp_path / "f.txt"]) as folder:
        assert folder == str(tmp_path)
    assert storage.glob(str(tmp_path / "*.txt")) == [storage.as_path(tmp_path / "f.txt")]
    assert not storage.is_remote(tmp_path)


def test_missing_bucket_is_named_and_not_created(gcs_server):
    with pytest.raises(storage.StorageError, match="bucket gs://no-such-bucket does not exist"):
        storage.make_dirs("gs://no-such-bucket/run")
    assert not storage.as_path("gs://no-such-bucket").exists()


def test_unsupported_scheme_and_missing_package():
    with pytest.raises(storage.StorageError, match="ftp:// is not supported"):
        storage.as_path("ftp://host/x")
    with pytest.raises(storage.StorageError, match="s3:// needs the s3fs package"):
        storage.as_path("s3://bucket/x")


def test_denied_requests_name_the_bucket_and_the_fix():
    """A server that answers 401/403 to everything stands for missing credentials and a missing permission."""
    code = r'''
import http.server, os, sys, threading
status = int(sys.argv[1])
class Deny(http.server.BaseHTTPRequestHandler):
    def deny(self):
        self.send_response(status); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(b'{"error": {"code": %d, "message": "denied"}}' % status)
    do_GET = do_POST = do_PUT = do_DELETE = deny
    def log_message(self, *a): pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Deny)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{server.server_port}"
from bert_jax import storage
try:
    storage.check_writable("gs://some-bucket/run")
except storage.StorageError as e:
    print(e)
'''
    for status, expected in ((401, "no valid credentials for gs://some-bucket"),
                             (403, "permission denied on gs://some-bucket")):
        out = subprocess.run([sys.executable, "-c", code, str(status)], capture_output=True, text=True, timeout=120)
        assert expected in out.stdout, out.stdout + out.stderr[-2000:]
