"""A real GCS server on localhost for the bucket tests: the PyPI package gcp-storage-emulator, in memory.

`GcsServer()` runs it in a subprocess on a free port (`python tests/gcs_server.py PORT BUCKET`); `use(server)`
points this process's clients at it: gcsfs (hence epath) through STORAGE_EMULATOR_HOST, Orbax's tensorstore through
TENSORSTORE_GCS_HTTP_URL; subprocesses take `server.env()`. `FlakyProxy(server, rate)` stands in front of it and
fails a share of the requests (429, 503, a reset connection), for the tests and benchmarks of a flaky bucket.
Nothing leaves this machine.

One fix to the emulator: Cloud Storage sends an object's generation in `x-goog-generation` with every media
download, and tensorstore needs it for the conditional writes of Orbax's OCDBT manifests; the emulator omits it
(tensorstore then fails with "Malformed StorageGeneration"), so the server started here adds it.
"""
from __future__ import annotations

import io
import json
import os
import socket
import struct
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


class FlakyProxy:
    """A bucket that fails now and then: an HTTP proxy in front of a GcsServer that answers a request, with
    probability `rate`, with 429 or 503 or by resetting its connection, before passing it on (so the server did
    nothing); the rest go through. `rate=1` is an outage. `faults` counts what it did, by kind.

    `env()` points a process's clients at it, as GcsServer.env() at the server."""

    KINDS = ("429", "503", "reset")

    def __init__(self, server: GcsServer, rate: float, seed: int = 0):
        import http.server
        import random
        import threading

        self.server, self.rate, self.random, self.lock = server, rate, random.Random(seed), threading.Lock()
        self.faults = {kind: 0 for kind in self.KINDS}
        self.requests = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def relay(self):
                body = read_body(self)
                fault = proxy.pick()
                if fault == "reset":  # SO_LINGER 0: close with a TCP reset, no response at all
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection, self.wfile = True, io.BytesIO()
                    return
                if fault:
                    status, data, headers = int(fault), json.dumps({"error": {"code": int(fault), "message":
                                                                               "injected"}}).encode(), []
                else:
                    status, data, headers = forward(proxy.server.port, self, body)
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = relay

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that gave up on a request (it retries) closed the connection under a reply

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def pick(self) -> str | None:
        with self.lock:
            self.requests += 1
            if self.random.random() >= self.rate:
                return None
            kind = self.random.choice(self.KINDS)
            self.faults[kind] += 1
            return kind

    def env(self) -> dict[str, str]:
        return {**self.server.env(), "STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url}

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def read_body(handler) -> bytes:
    """A request's body, sent with a Content-Length or chunked."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while size := int(handler.rfile.readline().split(b";")[0], 16):
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
        handler.rfile.readline()
        return b"".join(chunks)
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def forward(port: int, handler, body: bytes) -> tuple[int, bytes, list[tuple[str, str]]]:
    """Send the request on to the server at `port`; its status, body and headers."""
    import http.client

    headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
    headers["Content-Length"] = str(len(body))
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(handler.command, handler.path, body, headers)
        response = connection.getresponse()
        return response.status, response.read(), response.getheaders()
    finally:
        connection.close()


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
