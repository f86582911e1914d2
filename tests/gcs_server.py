"""A real GCS server on localhost for the bucket tests: the PyPI package gcp-storage-emulator, in memory.

`GcsServer()` runs it in a subprocess on a free port (`python tests/gcs_server.py PORT BUCKET`); `use(server)`
points this process's clients at it: gcsfs (hence epath) through STORAGE_EMULATOR_HOST, Orbax's tensorstore through
TENSORSTORE_GCS_HTTP_URL; subprocesses take `server.env()`. Nothing leaves this machine.

One fix to the emulator: Cloud Storage sends an object's generation in `x-goog-generation` with every media
download, and tensorstore needs it for the conditional writes of Orbax's OCDBT manifests; the emulator omits it
(tensorstore then fails with "Malformed StorageGeneration"), so the server started here adds it.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

BUCKET = "bert-jax-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsServer:
    def __init__(self, bucket: str = BUCKET):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        self.process = subprocess.Popen([sys.executable, __file__, str(self.port), bucket],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("the GCS emulator did not start")
                time.sleep(0.1)

    def env(self) -> dict[str, str]:
        """What a process needs to reach this server instead of Google's: anonymously (the server checks no
        credentials, and without a token gcsfs first asks google-auth, which warns on every try) and over the JSON
        API alone (the server has no gRPC storage-control service, which gcsfs >= 2026.10 asks for each bucket's
        layout unless GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT is false; gcsfs reads that at import)."""
        return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url, "EPATH_USE_TF": "false",
                "FSSPEC_GS_TOKEN": "anon", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def use(server: GcsServer) -> None:
    """Point this process's clients at `server` (before their first bucket access)."""
    import fsspec.config

    os.environ.update(server.env())
    fsspec.config.set_conf_env(fsspec.config.conf)  # fsspec read the environment when it was imported


def serve(port: int, bucket: str) -> None:
    """Run the emulator in this process, with downloads that carry their generation as Cloud Storage's do."""
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    download = objects.download

    def download_with_generation(request, response, storage, *args, **kwargs):
        try:
            stored = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            response["x-goog-generation"] = stored["generation"]
            response["x-goog-metageneration"] = stored["metageneration"]
        except NotFound:
            pass  # the emulator's own handler answers 404
        return download(request, response, storage, *args, **kwargs)

    objects.download = download_with_generation  # before the server module builds its routes from it
    from gcp_storage_emulator.server import create_server

    create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
