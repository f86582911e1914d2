"""Test-wide settings: offline HF, 8 fake CPU devices for mesh tests, float32 matmuls at full precision."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def gcs_server():
    """One GCS emulator for the session; tests use their own prefixes (gs://<bucket>/<test name>/...)."""
    from gcs_server import GcsServer, use

    server = GcsServer()
    use(server)
    yield server
    server.stop()


@pytest.fixture
def bucket_dir(gcs_server, request):
    """A fresh gs:// folder for one test."""
    import uuid

    return f"gs://{gcs_server.bucket}/{request.node.name}-{uuid.uuid4().hex[:8]}"
