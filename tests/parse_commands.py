"""Parse documented command lines with each entry point's own flag machinery, without running the commands.

    python tests/parse_commands.py < JOBS.json     # [{"entry": "bert_jax.train" | "benchmarks/x.py", "argvs": [...]}]

prints one JSON list: per job, per argv, null when it parsed or the error the command would print. Used by
tests/test_docs_commands.py. The heavy libraries are imported once here; each entry point then runs as __main__ in a
forked child, with absl's app.run replaced by one that keeps the flags parser the entry point passes (bert_jax's
cli.parse_flags: unknown --config.KEY as one line) instead of calling main; argparse scripts alike. So the flags are
the entry point's own (those its __main__ block defines included) and --config=FILE:ARG with its --config.KEY=VALUE
overrides loads the config through ml_collections' config_flags, as in a real run. Each command line is parsed in a
child of its own: config_flags defines a flag per override, which a second parse would define again.
"""
import argparse
import contextlib
import io
import json
import os
import runpy
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen  # noqa: E402,F401 - the slow imports every entry point shares, done once before forking
import ml_collections  # noqa: E402,F401
import tensorflow  # noqa: E402,F401
import tensorflow_datasets  # noqa: E402,F401
from absl import app, flags  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Parser(Exception):
    """Raised by the stand-in for app.run: carries the entry point's flags parser out of its __main__ block."""


def stand_in_run(main, argv=None, flags_parser=app.parse_flags_with_usage):
    raise Parser(flags_parser)


def stand_in_parse_args(self, args=None, namespace=None):
    """For the scripts that use argparse: its parser, taking argv as absl's does (program name first)."""
    raise Parser(lambda argv: PARSE_ARGS(self, argv[1:]))


PARSE_ARGS = argparse.ArgumentParser.parse_args


def placeholder_for(name: str, value: str) -> str:
    """A value that a typed flag accepts in place of a documented placeholder (--process_id=i, --num_processes=N)."""
    flag = flags.FLAGS[name] if name in flags.FLAGS else None
    if flag is None or flag.flag_type() in ("string", "multi_string", "list") or not is_placeholder(value):
        return value
    return flag.default_as_str.strip("'") if flag.default is not None else "1"


def is_placeholder(value: str) -> bool:
    return value.isupper() or (len(value) == 1 and value.isalpha())


def parse_one(parser, argv: list[str]) -> str | None:
    """None if `argv` parses, else what the command would print."""
    args = []
    for arg in argv:
        name, eq, value = arg[2:].partition("=")
        args.append(f"--{name}={placeholder_for(name, value)}" if arg.startswith("--") and eq else arg)
    err = io.StringIO()
    sys.argv = ["prog", *args]  # config_flags reads the --config.KEY overrides from sys.argv
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser(sys.argv)
    except SystemExit:
        return err.getvalue().strip() or "exited while parsing flags"
    except Exception as e:  # noqa: BLE001 - a config file that fails to load, a bad override value
        return f"{type(e).__name__}: {e}"
    return None


def run_job(entry: str, argvs: list[list[str]]) -> list[str | None]:
    """Run the entry point's __main__ up to app.run (or argparse's parse_args), then parse each argv with its
    parser."""
    app.run = stand_in_run
    argparse.ArgumentParser.parse_args = stand_in_parse_args
    sys.argv = ["prog"]
    try:
        if entry.endswith(".py"):
            sys.path.insert(0, os.path.join(REPO, os.path.dirname(entry)))
            runpy.run_path(os.path.join(REPO, entry), run_name="__main__")
        else:
            runpy.run_module(entry, run_name="__main__", alter_sys=True)
    except Parser as stop:
        parser = stop.args[0]
    except BaseException as e:  # noqa: BLE001 - an entry point that does not start reaches no parser
        return [f"{entry} did not reach its flags parser: {type(e).__name__}: {e}"] * len(argvs)
    else:
        return [f"{entry} has no absl or argparse flags parser"] * len(argvs)
    return [forked(lambda argv=argv: parse_one(parser, argv)) for argv in argvs]


def forked(compute):
    """compute() in a forked child (a fresh copy of this process's absl registry); its JSON result."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = compute()
        except BaseException as e:  # noqa: BLE001
            result = f"{type(e).__name__}: {e}"
        with os.fdopen(write, "w") as out:
            json.dump(result, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as reader:
        text = reader.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else "the child process died"


def main() -> None:
    os.chdir(REPO)
    sys.path.insert(0, REPO)
    print(json.dumps([forked(lambda job=job: run_job(job["entry"], job["argvs"])) for job in json.load(sys.stdin)]))


if __name__ == "__main__":
    main()
