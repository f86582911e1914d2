"""Convert a checkpoint between formats: anything load_pretrained reads -> an HF directory or a bert_jax workdir.

    python -m bert_jax.convert --input=PATH --output=PATH --format=hf|bert_jax [--head=HEAD]

e.g. an original ELECTRA TF checkpoint to HF:  --input=electra_small --output=electra_small_hf --format=hf
(writes discriminator/ and generator/; --head=discriminator writes the discriminator alone).
Either path may be a bucket URL (gs://...). A path that cannot be used ends the command with one line (exit 1).
"""
from absl import app, flags

from bert_jax import cli, modeling, pretrained

_INPUT = flags.DEFINE_string("input", None, "HF directory, original TF checkpoint directory or bert_jax workdir.",
                             required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Directory to create (must not exist or be empty).", required=True)
_FORMAT = flags.DEFINE_enum("format", "hf", ["hf", "bert_jax"], "Output format.")
_HEAD = flags.DEFINE_enum("head", None, list(modeling.HEADS), "Model to take from the input (default: all of it).")
flags.DEFINE_alias("task", "head")  # its name before "head" became the one word for it


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    pretrained.check_output_free(_OUTPUT.value)
    loaded = pretrained.load_pretrained(_INPUT.value, head=_HEAD.value)
    output = pretrained.save_pretrained(loaded, _OUTPUT.value, format=_FORMAT.value)
    print(f"wrote {loaded.config.family} {loaded.head} ({_FORMAT.value}) to {output}")


if __name__ == "__main__":
    cli.run(main)
