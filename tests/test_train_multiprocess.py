"""2 processes x 2 CPU devices (jax.distributed, gloo) train exactly like 1 process x 4 devices."""
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np

from train_helpers import logged

DRIVER = pathlib.Path(__file__).with_name("multiprocess_train.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(workdir, local_devices, process_count, process_id, port):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DRIVER.parent), str(DRIVER.parent.parent)]),
           "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen([sys.executable, str(DRIVER), str(workdir), str(local_devices), str(process_count),
                             str(process_id), str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_two_processes_match_one(tmp_path):
    port = free_port()
    runs = [spawn(tmp_path / "one", 4, 1, 0, port),
            spawn(tmp_path / "two", 2, 2, 0, port), spawn(tmp_path / "two", 2, 2, 1, port)]
    for run in runs:
        output, _ = run.communicate(timeout=400)
        assert run.returncode == 0, output[-3000:]
    one, two = logged(tmp_path / "one"), logged(tmp_path / "two")
    assert sorted(one) == [1, 2, 3]
    np.testing.assert_allclose([two[s] for s in one], list(one.values()), atol=1e-5)
    assert (tmp_path / "two" / "checkpoints" / "3" / "params").is_dir()


def test_hosts_that_do_not_share_the_workdir_stop_before_training(tmp_path):
    """Each host given its own local folder (as with a local disk per host): both stop, naming the cause."""
    port = free_port()
    runs = [spawn(tmp_path / "host0", 2, 2, 0, port), spawn(tmp_path / "host1", 2, 2, 1, port)]
    outputs = [run.communicate(timeout=400)[0] for run in runs]
    assert all(run.returncode != 0 for run in runs)
    assert all("processes [1] cannot see the files process 0 writes there" in output for output in outputs), outputs
    assert not (tmp_path / "host0" / "checkpoints").exists() and not (tmp_path / "host1" / "config.json").exists()
