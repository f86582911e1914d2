"""Every command's entry point: absl flags, then the command; a UserError ends it with one line and exit code 1.

Tracebacks are for bugs: a user error shows its traceback only when --verbosity is given. A --config.KEY override
that the config does not have is named on one line (exit code 2) instead of ml_collections' AttributeError.

A command ends through `end_process`, without Python's teardown: once its results are on disk, nothing the exit
needs is left, and the teardown (freeing the tf.data iterator, which finishes its batches in flight, and every
module of TensorFlow and XLA) took up to 40 s on a loaded machine, more than a preemption's grace period.
"""
from __future__ import annotations

import atexit
import difflib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags, logging

from bert_jax import native_stderr, pod
from bert_jax.errors import UserError

USAGE_ERROR = 2  # what absl uses for a flag it cannot parse
_running_command = False  # set by `run`: this process is a command, and `run` ends it
# libtpu's flags for every TPU program bert_jax compiles (read once, when libtpu starts). The scoped VMEM limit is what
# one XLA op may take of a TensorCore's VMEM; the rest prefetches later ops' operands. Raised from libtpu's default to
# the value MaxText gives dense models, XLA:TPU tiles the layers' matmul fusions in larger windows: BERT-base s128 at
# 256 a chip on v5p-8 (compiler's estimates, libtpu 0.0.42.1) went from 56.4 to 53.6 ms unscanned and from 72.5 to
# 65.7 ms scanned, in 0.04 to 0.09 GB more (docs/tpu.md). A flag of the same name in LIBTPU_INIT_ARGS wins.
TPU_COMPILER_FLAGS = ("--xla_tpu_scoped_vmem_limit_kib=98304",)


def verbose() -> bool:
    """Whether the user asked for the log and for tracebacks (--verbosity=0 shows Orbax's and JAX's INFO lines)."""
    return flags.FLAGS["verbosity"].present


def unknown_config_key(argv: list[str], error: Exception) -> str:
    """The one line for a --config.KEY=VALUE naming a key the config file lacks, with the closest key it has."""
    text = str(error)
    overrides = [arg[2:].split("=", 1)[0] for arg in argv[1:] if arg.startswith("--config.")]
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)
    culprit = next((o for word in words for o in overrides if word in o.split(".")[1:]), None)
    key = culprit.rsplit(".", 1)[-1] if culprit else (words[0] if words else text)
    config = next((arg.split("=", 1)[1] for arg in argv[1:] if arg.startswith("--config=")), "the config file")
    close = next(iter(close_keys(culprit or key, config)), None)
    hint = f"did you mean {close!r}?" if close else "check its spelling against that config file"
    return f"error: --{culprit or 'config.' + key}: {config} has no key {key!r}; {hint}"


def close_keys(dotted: str, config_arg: str) -> list[str]:
    """Keys of the config file `config_arg` (path[:argument]) at the level of `dotted` spelled like its last part."""
    path, _, argument = config_arg.partition(":")
    try:
        spec = importlib.util.spec_from_file_location("bert_jax_cli_config", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config(*([argument] if argument else []))
    except Exception:  # noqa: BLE001 - only a hint; the error line is printed either way
        return []
    *parents, name = dotted.removeprefix("config.").split(".")
    for parent in parents:
        config = config.get(parent) if hasattr(config, "get") else None
    return difflib.get_close_matches(name, list(config.keys()), n=1) if hasattr(config, "keys") else []


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with an unknown --config.KEY as one line."""
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        print(unknown_config_key(argv, e), file=sys.stderr)
        sys.exit(USAGE_ERROR)
    except flags.Error as e:
        print(f"error: {e}\nPass --helpshort or --helpfull to see help on flags.", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def guarded(command: Callable[[list[str]], object]) -> Callable[[list[str]], None]:
    """`command` with quiet logging unless --verbosity is given, and a UserError ending it as one line. In a run
    over several processes every error ends all of them (bert_jax.pod), each with one line: the error's, or
    for a bug a line after its traceback."""

    def main(argv: list[str]) -> None:
        if not verbose():
            logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
        try:
            command(argv)
        except Exception as e:
            line = f"error: {e}" if isinstance(e, UserError) else pod.failure_line(e)
            if not pod.running() and (line is None or verbose()):
                raise
            if line is None or verbose():
                traceback.print_exc()
            # Ended here, while the failed command's objects are still referenced: freeing them is teardown too.
            fail(line or f"error: {type(e).__name__} (the traceback above is this process's)")

    return main


def fail(line: str) -> NoReturn:
    """End the command with its error line and exit code 1; in a run over several processes, the others too."""
    if pod.running():
        pod.end_together(line)
    native_stderr.say_last(line)
    end_process(1)


def in_command() -> bool:
    """Whether this process is a bert_jax command (started by `run`), which ends it once its work is saved."""
    return _running_command


def end_process(code: int) -> NoReturn:
    """Exit with `code` now: run the atexit handlers (jax.distributed's shutdown, which every host waits for;
    logging's flush), flush stdout and stderr, and leave without Python's teardown, which only frees memory and
    waits for threads nothing needs any more (tf.data's, Orbax's idle pools, TensorFlow's and XLA's)."""
    atexit._run_exitfuncs()
    pod.exit_now(code)


def use_tpu_compiler_flags() -> None:
    """Add TPU_COMPILER_FLAGS to LIBTPU_INIT_ARGS, each unless the user's own LIBTPU_INIT_ARGS sets that flag: call
    it before anything starts JAX, so that a TPU run and the compile check's estimate of it are the same program."""
    given = os.environ.get("LIBTPU_INIT_ARGS", "")
    names = {arg.split("=", 1)[0] for arg in given.split()}
    missing = [flag for flag in TPU_COMPILER_FLAGS if flag.split("=", 1)[0] not in names]
    os.environ["LIBTPU_INIT_ARGS"] = " ".join([given, *missing]).strip()


def without_keras() -> None:
    """Keep Keras out of this process. Importing TensorFlow imports all of Keras 3, and Keras imports scikit-learn
    where it is installed, unless that import fails, which TensorFlow allows for. No bert_jax command uses Keras:
    a tiny training run on the 2-core development machine (scikit-learn installed, as sentence-transformers brings
    it) went from 12.2 to 10.9 CPU-seconds. Keras already loaded (by a caller) stays."""
    sys.modules.setdefault("keras", None)


def run(command: Callable[[list[str]], object]) -> NoReturn:
    """Parse the flags, run `command(argv)` as a bert_jax command and end the process with its exit code."""
    global _running_command
    _running_command = True
    use_tpu_compiler_flags()
    without_keras()
    try:
        app.run(guarded(command), flags_parser=parse_flags)
    except SystemExit as done:
        if isinstance(done.code, str):  # what Python would print for SystemExit("message")
            print(done.code, file=sys.stderr)
        end_process(done.code if isinstance(done.code, int) else int(done.code is not None))
