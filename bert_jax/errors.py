"""The base class of every error a user can fix; commands print its message as one line (see bert_jax.cli)."""


class UserError(Exception):
    """Bad input or an unusable environment: the message names the file, key or step and says what to do."""
