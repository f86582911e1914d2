"""Test-wide settings: offline HF, 8 fake CPU devices for mesh tests, float32 matmuls at full precision."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The tests run on the CPU; with libtpu installed (the test extra), JAX would otherwise look for a TPU at start.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# google-auth (under gcsfs) looks for a GCE metadata server when no credentials are configured: keep that lookup on
# this machine's loopback (a closed port) instead of the link-local metadata address. Read at import, so set first.
# gcsfs decides at import whether to ask a gRPC control plane for bucket layouts, which the test server lacks
# (tests/gcs_server.py).
for _key, _value in (("NO_GCE_CHECK", "true"), ("GCE_METADATA_HOST", "127.0.0.1:9"), ("GCE_METADATA_IP", "127.0.0.1:9"),
                     ("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")):
    os.environ.setdefault(_key, _value)

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
    import re
    import uuid

    name = re.sub(r"[^\w-]+", "-", request.node.name)  # parametrize ids hold [ ], glob characters
    return f"gs://{gcs_server.bucket}/{name}-{uuid.uuid4().hex[:8]}"
