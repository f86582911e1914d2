"""Commands end a user error with one line: an unknown --config key is named with the closest key the file has."""
import pathlib
import subprocess
import sys

import pytest

from bert_jax import cli

CONFIG = str(pathlib.Path(__file__).resolve().parent.parent / "configs" / "bert.py") + ":tiny"


@pytest.mark.parametrize("override, error, hint", [
    ("--config.init=x", AttributeError("\"'init'\""), "did you mean 'init_from'?"),
    ("--config.optimizer.learning_rat=1", KeyError("'learning_rat'\nDid you mean ..."),
     "did you mean 'learning_rate'?"),
    ("--config.zzz=1", AttributeError("\"'zzz'\""), "check its spelling against that config file"),
])
def test_unknown_config_key_is_one_line_with_the_closest_key(override, error, hint):
    line = cli.unknown_config_key(["prog", f"--config={CONFIG}", "--config.seed=1", override], error)
    key = override.split("=")[0]
    assert line == f"error: {key}: {CONFIG} has no key {key.rsplit('.', 1)[1]!r}; {hint}"


FAILING_COMMAND = """
import threading
from bert_jax import cli
from bert_jax.errors import UserError

def command(argv):
    threading.Thread(target=threading.Event().wait, name="left behind").start()
    raise UserError("config.data.input_files: 'x/*.txt' matches no file")

cli.run(command)
"""


def test_a_user_error_is_one_line_and_the_exit_waits_for_nothing_left_behind():
    """The error line ends the process: a thread the failed command left running (a writer, a prefetcher) would
    otherwise hold it forever."""
    child = subprocess.run([sys.executable, "-c", FAILING_COMMAND], capture_output=True, text=True, timeout=120)
    assert child.returncode == 1
    assert child.stderr == "error: config.data.input_files: 'x/*.txt' matches no file\n"


PRINT_LIBTPU_ARGS = """
import os
from bert_jax import cli

cli.run(lambda argv: print(os.environ["LIBTPU_INIT_ARGS"]))
"""


@pytest.mark.parametrize("given, expected", [
    (None, " ".join(cli.TPU_COMPILER_FLAGS)),
    ("--xla_tpu_scoped_vmem_limit_kib=16384 --xla_x=1", "--xla_tpu_scoped_vmem_limit_kib=16384 --xla_x=1"),
    ("--xla_x=1", "--xla_x=1 " + " ".join(cli.TPU_COMPILER_FLAGS)),
])
def test_a_command_gives_libtpu_bert_jax_flags_unless_the_user_set_them(given, expected, monkeypatch):
    """LIBTPU_INIT_ARGS as a command starts JAX: bert_jax's scoped VMEM limit added, a user's own value kept."""
    if given is None:
        monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    else:
        monkeypatch.setenv("LIBTPU_INIT_ARGS", given)
    child = subprocess.run([sys.executable, "-c", PRINT_LIBTPU_ARGS], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == expected


READ_DATA_IN_A_COMMAND = """
import sys
from bert_jax import cli

def command(argv):
    import tensorflow as tf

    batches = [b.tolist() for b in tf.data.Dataset.range(5).map(lambda x: 2 * x).batch(2).as_numpy_iterator()]
    loaded = sorted({name.split(".")[0] for name, module in sys.modules.items()
                     if name.split(".")[0] in ("keras", "sklearn") and module is not None})
    print(batches, loaded)

cli.run(command)
"""


def test_a_command_reads_data_without_loading_keras():
    """TensorFlow imported in a command leaves Keras (and the scikit-learn it pulls in) unloaded; tf.data works."""
    child = subprocess.run([sys.executable, "-c", READ_DATA_IN_A_COMMAND], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[[0, 2], [4, 6], [8]] []"
