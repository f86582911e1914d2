"""The base class of every error a user can fix; commands print its message as one line (see bert_jax.cli)."""
import contextlib
import logging


class UserError(Exception):
    """Bad input or an unusable environment: the message names the file, key or step and says what to do."""


@contextlib.contextmanager
def absl_warnings_off():
    """Without the warnings libraries log through absl meanwhile: those of things bert_jax reports in its own
    words or does on purpose (a TFDS dataset not built, Orbax's array handler replaced)."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl_logger.setLevel(level)
