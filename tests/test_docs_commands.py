"""Every command in the README and docs/*.md still works as written: its entry point exists, its flags and
--config.KEY overrides parse with the entry point's own absl / config_flags machinery (tests/parse_commands.py), and
its data arguments name files bundled in the repository or what a documented download command fetches (`hf download
... --local-dir=DIR`, `tfds build NAME`, `curl -o FILE`) or a documented command writes (--workdir, --output).

A renamed flag or config key, a moved file or a dataset whose download the docs stopped giving fails here. Paths that
start with a word in capitals (DIR, PATH/x, 'CORPUS/*.txt'), $VARIABLES, `...`, bucket URLs and <placeholders> stand
for the reader's own values.
"""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from bert_jax.input_pipeline.config import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
SHELL_FENCES = ("", "bash", "sh", "shell")
PYTHON = re.compile(r"(^|/)python3?$")
WRAPPERS = {"srun", "nice", "timeout", "env", "exec", "time"}
ANGLE_PLACEHOLDERS = {"<family>": "bert", "<size>": "tiny", "<task>": "rte"}  # one value each stands for all
# Flags whose values are data a command reads: they must be bundled or fetched by a documented command.
DATA_FLAGS = {"--config.data_dir", "--config.train_file", "--config.predict_file", "--config.init",
              "--config.init_from", "--config.data.input_files", "--config.data.prepared_dir",
              "--config.data.tokenizer_path", "--data", "--corpus", "--glue", "--tokenizer", "--input", "--init",
              "--squad", "--config.eval_sts_file", "--config.eval_beir_dir", "--config.train_files"}
# Flags whose values a documented command writes, so that later commands may read them.
OUTPUT_FLAGS = {"--workdir", "--output", "--results_dir", "--local-dir", "--data_dir", "-o"}
POSITIONAL_DATA = ("bert_jax.input_pipeline.prepare", "bert_jax.input_pipeline.plain_text",
                   "bert_jax.input_pipeline.train_tokenizer", "bert_jax.evaluation.squad")


def shell_blocks(path):
    """(first line number, text) of each fenced shell block of a markdown file."""
    blocks, lines, start, fence = [], path.read_text().splitlines(), None, None
    for number, line in enumerate(lines, 1):
        if line.startswith("```") and start is None:
            start, fence = number + 1, line[3:].strip()
        elif line.startswith("```"):
            if fence in SHELL_FENCES:
                blocks.append((start, "\n".join(lines[start - 1:number - 1])))
            start = None
    return blocks


def simple_commands(text):
    """The simple commands of a shell text as token lists: continuation lines joined, comments dropped, split at
    unquoted newlines, ;, && and |; a quoted argument that holds commands itself (ssh --command="...") is searched
    too. A block that is not shell (a file listing, a log line with an apostrophe) is read line by line, and lines
    that do not parse are no commands."""
    text = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.replace("\\\n", " ").splitlines())
    try:
        return commands_of(shell_tokens(text))
    except ValueError:
        found = []
        for line in text.splitlines():
            try:
                found += commands_of(shell_tokens(line))
            except ValueError:
                continue
        return found


def shell_tokens(text):
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|\n")
    lexer.whitespace, lexer.whitespace_split, lexer.commenters = " \t\r", True, ""
    return list(lexer)


def commands_of(tokens):
    commands, current = [], []
    for token in tokens:
        if set(token) <= set(";&|\n"):
            commands.append(current)
            current = []
            continue
        inner = token.split("=", 1)[-1]
        if re.search(r"python3? -m |python3? \S+\.py|\bmake ", inner) and re.search(r"\n|&&|;", inner):
            commands += simple_commands(inner)
        else:
            current.append(token)
    return [c for c in commands + [current] if c]


def drop_optional(tokens):
    """A synopsis without its [optional ...] groups; angle placeholders replaced by one value each."""
    kept, depth = [], 0
    for token in tokens:
        depth += token.startswith("[")
        if not depth:
            for placeholder, value in ANGLE_PLACEHOLDERS.items():
                token = token.replace(placeholder, value)
            kept.append(token)
        depth -= depth and token.endswith("]")
    return kept


def entry_point(tokens):
    """(kind, entry, args) of a command worth checking: ("python", "bert_jax.train" | "benchmarks/x.py", args),
    ("make", target, []), ("tfds", "build", names...), ("hf" / "curl", ..., args); None for anything else."""
    while tokens and (re.fullmatch(r"[A-Z_]+=.*", tokens[0]) or tokens[0] in WRAPPERS or tokens[0].startswith("-")
                      or tokens[0].isdigit()):
        tokens = tokens[1:]
    if not tokens:
        return None
    program, args = tokens[0], tokens[1:]
    if PYTHON.search(program) and args[:1] == ["-m"] and args[1].startswith("bert_jax"):
        return "python", args[1], args[2:]
    if PYTHON.search(program) and args and args[0].startswith("benchmarks/"):
        return "python", args[0], args[1:]
    if program in ("make", "tfds", "hf", "curl"):
        return program, args[0] if args else "", args[1:]
    return None


def flag_values(args):
    """(flag, value) of each --flag=value or -o value argument."""
    pairs = [tuple(a.split("=", 1)) for a in args if a.startswith("-") and "=" in a]
    pairs += [(a, b) for a, b in zip(args, args[1:]) if a == "-o"]
    return pairs


def is_placeholder(value):
    """Whether a value stands for the reader's own: $VAR, ..., a bucket URL, <name>, or a path whose first part is a
    word in capitals (DIR/predictions.json, PATH/model, 'CORPUS/*.txt', FILE.json)."""
    return (not value or "$" in value or "..." in value or "://" in value or "<" in value
            or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*(\.[a-z0-9.]+)?", value.split("/")[0])))


def documented_commands():
    """Every checked command: (where, kind, entry, args)."""
    found = []
    for doc in DOCS:
        for line, block in shell_blocks(doc):
            for tokens in simple_commands(block):
                if command := entry_point(drop_optional(tokens)):
                    found.append((f"{doc.relative_to(REPO_ROOT)}:{line}", *command))
    return found


COMMANDS = documented_commands()


def written_paths():
    """What documented commands write: their outputs, downloads and TFDS folders, and make train's workdir."""
    paths = {m.group(1) for m in re.finditer(r"^TRAIN_WORKDIR \?= (\S+)", (REPO_ROOT / "Makefile").read_text(), re.M)}
    for _, kind, entry, args in COMMANDS:
        paths |= {value for flag, value in flag_values([entry, *args]) if flag in OUTPUT_FLAGS}
    return {p.rstrip("/") for p in paths if not is_placeholder(p)}


def built_tfds():
    """The TFDS datasets (and their builders) that a documented `tfds build` fetches."""
    names = {name for _, kind, entry, args in COMMANDS if kind == "tfds" and entry == "build"
             for name in args if not name.startswith("-")}
    return names | {name.split("/")[0] for name in names}


def data_problem(value, written, tfds_names):
    """Why a data argument is not bundled nor fetched by a documented command; None when it is."""
    if is_placeholder(value):
        return None
    if value.startswith("tfds:"):
        name = value[5:].split(":")[0]
        return None if name in tfds_names else f"{value}: no documented `tfds build {name}`"
    for pattern in value.split(","):  # comma-separated globs (--corpus, config.data.input_files)
        if os.path.isabs(pattern):
            return f"{pattern}: an absolute path of some machine; use a path in the repository or a placeholder"
        if any(pattern == w or pattern.startswith(w + "/") for w in written):
            continue
        if not list(REPO_ROOT.glob(pattern)) and not (REPO_ROOT / pattern).exists():
            return f"{pattern}: not in the repository, and no documented command downloads or writes it"
    return None


def test_documents_hold_the_commands_of_every_entry_point():
    entries = {entry for _, kind, entry, _ in COMMANDS if kind == "python"}
    for entry in ("bert_jax.train", "bert_jax.finetune", "bert_jax.experiments.compare", "bert_jax.evaluation.squad",
                  "bert_jax.evaluation.similarity", "bert_jax.input_pipeline.prepare"):
        assert entry in entries
    assert {"make", "tfds", "hf"} <= {kind for _, kind, _, _ in COMMANDS}


def test_data_arguments_are_bundled_or_downloaded_by_a_documented_command():
    written, tfds_names = written_paths(), built_tfds()
    problems = []
    for where, kind, entry, args in COMMANDS:
        values = [v for flag, v in flag_values(args) if flag in DATA_FLAGS] if kind == "python" else []
        if entry in POSITIONAL_DATA:
            values += [a for a in args[:args.index("--") if "--" in args else None] if not a.startswith("-")]
        problems += [f"{where}: {problem}" for v in values if (problem := data_problem(v, written, tfds_names))]
    assert not problems, "\n".join(problems)


def test_make_targets_and_tfds_datasets_exist():
    import tensorflow_datasets as tfds

    targets = set(re.findall(r"^([\w.-]+):", (REPO_ROOT / "Makefile").read_text(), re.M))
    problems = [f"{where}: make {entry}" for where, kind, entry, _ in COMMANDS if kind == "make"
                and entry not in targets]
    for where, kind, entry, args in COMMANDS:
        for name in (args if kind == "tfds" else []):
            if not name.startswith("-"):
                builder, _, config = name.partition("/")
                configs = [c.name for c in tfds.builder_cls(builder).BUILDER_CONFIGS]
                if config and config not in configs:
                    problems.append(f"{where}: tfds build {name}: {builder} has no config {config}")
    assert not problems, "\n".join(problems)


# Commands that must fail to parse, checked in the same run: proof that the check sees what a user would.
BROKEN = [("bert_jax.finetune", ["--config=configs/glue.py:rte", "--workdir=DIR", "--config.data_dirr=x"],
           "has no key 'data_dirr'; did you mean 'data_dir'?"),
          ("bert_jax.evaluation.similarity", ["--init=PATH", "--dataset=x"], "Unknown command line flag 'dataset'"),
          ("bert_jax.train", ["--config=configs/bert.py:huge", "--workdir=DIR"], "huge"),
          ("benchmarks/device_check.py", ["--out=x.json", "--outfile=y"], "unrecognized arguments: --outfile=y")]


def test_flags_and_config_overrides_parse():
    jobs = {}
    for where, kind, entry, args in COMMANDS + [("broken", "python", entry, args) for entry, args, _ in BROKEN]:
        if kind == "python":
            jobs.setdefault(entry, []).append((where, args))
    request = [{"entry": entry, "argvs": [args for _, args in runs]} for entry, runs in jobs.items()]
    out = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "parse_commands.py")], input=json.dumps(request),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    parsed = json.loads(out.stdout.splitlines()[-1])  # entry points may print while they start
    results = {(entry, tuple(args)): error for (entry, runs), errors in zip(jobs.items(), parsed)
               for (_, args), error in zip(runs, errors)}
    problems = [f"{where}: python {entry} {shlex.join(args)}\n    {results[entry, tuple(args)]}"
                for where, kind, entry, args in COMMANDS if kind == "python" and results[entry, tuple(args)]]
    assert not problems, "\n".join(problems)
    for entry, args, error in BROKEN:
        assert error in (results[entry, tuple(args)] or "passed"), (entry, args, results[entry, tuple(args)])


@pytest.mark.parametrize("text, expected", [
    ("python -m bert_jax.train --config=configs/<family>.py:<size> --workdir=DIR [--config.key=value ...]",
     [("python", "bert_jax.train", ["--config=configs/bert.py:tiny", "--workdir=DIR"])]),
    ("make train   # a comment\nX=1 nice -n 19 .venv/bin/python benchmarks/x.py --a=b \\\n    --c=d",
     [("make", "train", []), ("python", "benchmarks/x.py", ["--a=b", "--c=d"])]),
    ('gcloud ssh --command="cd bert_jax &&\n  .venv/bin/python -m bert_jax.train --workdir=$B/run"',
     [("python", "bert_jax.train", ["--workdir=$B/run"])]),
    ("pip install -e '.[data]' && tfds build glue/rte glue/cola", [("tfds", "build", ["glue/rte", "glue/cola"])]),
])
def test_commands_are_found_in_shell_text(text, expected):
    found = [entry_point(drop_optional(tokens)) for tokens in simple_commands(text)]
    assert [f for f in found if f] == expected


def test_data_problems_are_named():
    written, tfds_names = {"runs/rte", "glue"}, {"glue/rte", "glue"}
    assert data_problem("data/glue/RTE", written, tfds_names) is None
    assert data_problem("glue/rte", written, tfds_names) is None  # under a download's --local-dir
    assert data_problem("DIR/predictions.json", written, tfds_names) is None
    assert data_problem("tfds:glue/rte", written, tfds_names) is None
    assert data_problem("tfds:squad", written, tfds_names) == "tfds:squad: no documented `tfds build squad`"
    assert "not in the repository" in data_problem("data/glue/QQP", written, tfds_names)
    assert "absolute path" in data_problem("/data/glue", written, tfds_names)
