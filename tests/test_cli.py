"""Commands end a user error with one line: an unknown --config key is named with the closest key the file has."""
import pathlib

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
