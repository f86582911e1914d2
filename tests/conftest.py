"""Test-wide settings: offline HF, 8 fake CPU devices for mesh tests, and one XLA compilation cache per session."""
import os
import shutil
import tempfile

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

# One persistent compilation cache for the whole session, shared by the tests and the commands and processes they
# start (which inherit this environment): a program compiled once is loaded everywhere else. Every compile is kept,
# however short: a tiny model's programs compile in under a second each, but there are hundreds of them (Orbax's
# per-shard save slices, initialisers, the steps of each family). A new folder per session keeps runs independent
# of each other and of other checkouts on the machine; it is removed at the end.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bert_jax-tests-xla-cache-")
    os.environ["BERT_JAX_TESTS_OWN_XLA_CACHE"] = os.environ["JAX_COMPILATION_CACHE_DIR"]
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The tests' models are tiny: compiling, not running, is most of their time. XLA:CPU compiles about a quarter faster
# without LLVM's costly optimizations, and in about half the time again with its older fusion emitters (LLVM IR
# written directly, not through MLIR): a tiny BERT step on a 2x2x2 mesh took 6.7 CPU-s to compile, 3.5 with them;
# ELECTRA's 10.9 and 4.5. Sharding, layouts and collectives (the audit's subject) are unchanged; fusions may be
# grouped differently. The commands the tests start inherit the setting, so compared runs compile alike. The tests
# whose subject is a user's exact numbers (parity with transformers, donation) compile with the default emitters
# (train_helpers.as_users_compile). Should a jaxlib retire a flag, every process aborts naming it ("Unknown flag in
# XLA_FLAGS"): remove it here, and the emitters' flag also from train_helpers.USERS_EMITTERS.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
                               " --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false").strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


import pytest  # noqa: E402


@pytest.fixture
def one_device_mesh(monkeypatch):
    """Meshes on the first of the 8 fake devices, for runs whose subject is not sharding: a tiny model split 8 ways
    compiles 8 partitions and runs them all on this machine's 2 cores (the comparison's end-to-end test took 1.5x as
    long on 8 devices as on one)."""
    from bert_jax import sharding

    make_mesh = sharding.make_mesh
    monkeypatch.setattr(sharding, "make_mesh", lambda data, fsdp, tensor, devices=None: make_mesh(
        data, fsdp, tensor, jax.devices()[:1] if devices is None else devices))


@pytest.fixture(scope="session")
def shared_data():
    """The development machines' full data sets (GLUE train/dev, SQuAD dev, corpora: SOURCES.md there), for the few
    tests that need more rows than data/ bundles; skipped where the folder is absent, as in a user's clone."""
    import pathlib

    folder = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
    if not folder.is_dir():
        pytest.skip(f"needs the full data sets in {folder}, which only the development machines have")
    return folder


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


def pytest_unconfigure(config):
    """Remove the session's compilation cache (not one the caller named in JAX_COMPILATION_CACHE_DIR), from the
    main process only: pytest-xdist's workers inherit its folder and share it, and end one after the other."""
    own = os.environ.get("BERT_JAX_TESTS_OWN_XLA_CACHE")
    if own and not hasattr(config, "workerinput"):
        shutil.rmtree(own, ignore_errors=True)


# The ten slowest files, slowest first (seconds of a full `make test` on the 2-core development machine, 2026-12-06:
# 136, 121, 116, 103, 96, 78, 63, 58, 50, 49). `make test` hands whole files to its two workers in collection order
# (--dist loadfile --no-loadscope-reorder): started first, these no longer leave one worker running a 100 s file alone
# at the end while the other has finished. Replayed on that run's durations, the longer worker's share went from 894
# to about 860 s.
SLOWEST_FILES_FIRST = ("test_faults.py", "test_compare.py", "test_init_from.py", "test_tpu_compile.py",
                       "test_pod_run.py", "test_train_cli.py", "test_finetune_e2e.py", "test_mixed_precision.py",
                       "test_modeling_switches.py", "test_device_check.py")


def pytest_collection_modifyitems(items):
    """Put the slowest files first (SLOWEST_FILES_FIRST), the rest in collection order."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
