"""A real GCS server on localhost for the bucket tests: the PyPI package gcp-storage-emulator, in memory.

`start()` runs it in a subprocess on a free port and points the clients at it: gcsfs (hence epath) through
STORAGE_EMULATOR_HOST, Orbax's tensorstore through TENSORSTORE_GCS_HTTP_URL. Subprocesses inherit `env()`.
Nothing leaves this machine; the server is stopped when the test session ends.
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
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host=127.0.0.1", f"--port={self.port}",
             "--in-memory", f"--default-bucket={bucket}"],
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
        """What a process needs to reach this server instead of Google's."""
        return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url, "EPATH_USE_TF": "false"}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def use(server: GcsServer) -> None:
    """Point this process's clients at `server` (before their first bucket access)."""
    os.environ.update(server.env())
