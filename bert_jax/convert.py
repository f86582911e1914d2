"""Convert a checkpoint between formats: anything load_pretrained reads -> an HF directory or a bert_jax workdir.

    python -m bert_jax.convert --input=PATH --output=PATH --format=hf|bert_jax|sentence-transformers [--head=HEAD]

e.g. an original ELECTRA TF checkpoint to HF:  --input=electra_small --output=electra_small_hf --format=hf
(writes discriminator/ and generator/; --head=discriminator writes the discriminator alone).
--format=sentence-transformers writes the backbone with its pooling (the input's, e.g. an embedding run's; else
mean pooling, as sentence-transformers gives a plain HF folder); --pooling and --normalize override it.
Either path may be a bucket URL (gs://...). A path that cannot be used ends the command with one line (exit 1).
"""
import dataclasses

from absl import app, flags

from bert_jax import cli, modeling, pretrained, sentence_embedding

_INPUT = flags.DEFINE_string("input", None, "HF directory, original TF checkpoint directory or bert_jax workdir.",
                             required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Directory to create (must not exist or be empty).", required=True)
_FORMAT = flags.DEFINE_enum("format", "hf", list(pretrained.FORMATS), "Output format.")
_HEAD = flags.DEFINE_enum("head", None, list(modeling.HEADS), "Model to take from the input (default: all of it).")
_POOLING = flags.DEFINE_enum("pooling", None, list(sentence_embedding.POOLINGS),
                             "sentence-transformers: the sentence vector (default: the input's, else mean).")
_NORMALIZE = flags.DEFINE_bool("normalize", None, "sentence-transformers: scale vectors to unit length (default: "
                               "the input's, else no).")
flags.DEFINE_alias("task", "head")  # its name before "head" became the one word for it


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    pretrained.check_output_free(_OUTPUT.value)
    loaded = pretrained.load_pretrained(_INPUT.value, head=_HEAD.value)
    if _FORMAT.value == "sentence-transformers":
        loaded = dataclasses.replace(loaded, pooling=sentence_embedding.overridden(
            loaded.pooling, _POOLING.value, _NORMALIZE.value, default=sentence_embedding.DEFAULT_EXPORT_POOLING))
    output = pretrained.save_pretrained(loaded, _OUTPUT.value, format=_FORMAT.value)
    print(f"wrote {loaded.config.family} {loaded.head} ({_FORMAT.value}) to {output}")


if __name__ == "__main__":
    cli.run(main)
