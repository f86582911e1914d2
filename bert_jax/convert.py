"""Convert a checkpoint between formats: anything load_pretrained reads -> an HF directory or a bert_jax workdir.

    python -m bert_jax.convert --input=PATH --output=PATH --format=hf|bert_jax [--task=TASK]

e.g. an original ELECTRA TF checkpoint to HF:  --input=electra_small --output=electra_small_hf --format=hf
(writes discriminator/ and generator/; --task=discriminator writes the discriminator alone).
Either path may be a bucket URL (gs://...).
"""
from absl import app, flags

from bert_jax import pretrained, state_dict, storage

_INPUT = flags.DEFINE_string("input", None, "HF directory, original TF checkpoint directory or bert_jax workdir.",
                             required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Directory to create (must not exist or be empty).", required=True)
_FORMAT = flags.DEFINE_enum("format", "hf", ["hf", "bert_jax"], "Output format.")
_TASK = flags.DEFINE_enum("task", None, list(pretrained.TASKS), "Model to take from the input (default: all of it).")
# Errors that name the path and what to do: printed as one line, a traceback only with --verbosity.
USER_ERRORS = (pretrained.LoadError, state_dict.ConversionError, storage.StorageError, FileExistsError)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        loaded = pretrained.load_pretrained(_INPUT.value, task=_TASK.value)
        output = pretrained.save_pretrained(loaded, _OUTPUT.value, format=_FORMAT.value)
    except USER_ERRORS as e:
        if flags.FLAGS["verbosity"].present:
            raise
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {loaded.config.family} {loaded.task} ({_FORMAT.value}) to {output}")


if __name__ == "__main__":
    app.run(main)
