"""Raw books and articles -> the pipeline's text format: one sentence per line, a blank line between documents.

    python -m bert_jax.input_pipeline.plain_text --output=DIR FILES...

Text as it is usually found (Project Gutenberg prose wrapped at 70 columns, WikiText with one paragraph per line)
is turned into documents and sentences the way data/SOURCES.md describes for the bundled corpus:
  - a heading line (CHAPTER 1, Chapter IV, BOOK II, "II. Title", WikiText's " = Title = ") starts a new document and
    is itself dropped, so documents are chapters or articles; WikiText's " = = Section = = " only ends a paragraph;
  - the lines of a paragraph (blank lines separate paragraphs) are joined and whitespace collapsed;
  - paragraphs are split into sentences at whitespace after . ! ? " ' ) and before a capital, a quote or "(".
The words are unchanged. Each input FILE becomes DIR/FILE's name; FILES and DIR may be local or gs://. Files are
read and written streaming, as `prepare` reads them (documents.file_lines: long lines cut, lines of invalid UTF-8
skipped, both counted), and a document is cut at MAX_DOCUMENT_CHARS, so memory is bounded whatever the input.
"""
from __future__ import annotations

import collections
import re
import sys
from typing import Iterable, Iterator

from absl import flags

from bert_jax import cli, storage
from bert_jax.errors import UserError
from bert_jax.input_pipeline import documents as documents_lib

HEADING = re.compile(r"^(?:(?:CHAPTER|Chapter|BOOK|Book)\s+(?:\d+|[IVXLC]+)\b\.?.{0,60}|[IVXLC]+\. .{1,60}"
                     r"|= [^=].* =)$")
SECTION = re.compile(r"^= = .* = =$")  # WikiText's sub-headings: they end a paragraph, not the article
SENTENCE_BREAK = re.compile(r"(?<=[.!?\"')])\s+(?=[\"'(A-Z])")


class SameNameError(UserError, ValueError):
    """Two inputs that would be written to one output file."""


def documents(lines: Iterable[str]) -> Iterator[list[str]]:
    """Documents (lists of sentences) of a text's lines; headings split documents, blank lines paragraphs, and a
    document is cut when its paragraphs reach MAX_DOCUMENT_CHARS characters."""
    document, paragraph, size = [], [], 0

    def end_paragraph():
        text = " ".join(" ".join(paragraph).split())
        paragraph.clear()
        if text:
            document.extend(SENTENCE_BREAK.split(text))

    def end_document():
        nonlocal size
        end_paragraph()
        finished, size = list(document), 0
        document.clear()
        return [finished] if finished else []

    for line in lines:
        stripped = line.strip()
        if HEADING.match(stripped):
            yield from end_document()
        elif SECTION.match(stripped):
            end_paragraph()
        elif stripped:
            paragraph.append(stripped)
            size += len(stripped)
            if size >= documents_lib.MAX_DOCUMENT_CHARS:
                yield from end_document()
        else:
            end_paragraph()
    yield from end_document()


def convert_file(source: storage.PathLike, target: storage.PathLike, counts: collections.Counter) -> int:
    """Write `source` in the pipeline's format to `target`, document by document; returns the number of
    documents. Skipped or cut lines are added to `counts`."""
    written = 0
    with storage.atomic_open(target) as out:
        for doc in documents(documents_lib.file_lines(source, counts)):
            out.write((("\n\n" if written else "") + "\n".join(doc)).encode("utf-8"))
            written += 1
        out.write(b"\n")
    return written


def convert_files(sources: Iterable[storage.PathLike], output: storage.PathLike,
                  counts: collections.Counter | None = None) -> list[storage.Path]:
    """Convert every file into `output` (created); returns the written paths. Two sources of one name are an error.
    Skipped or cut lines are added to `counts`."""
    sources = list(sources)
    documents_lib.require_files(sources, "plain_text FILES")
    names = [storage.as_path(source).name for source in sources]
    if twice := sorted({name for name in names if names.count(name) > 1}):
        raise SameNameError(f"plain_text FILES: two input files are named {twice[0]}; rename one, outputs go to "
                            "one folder")
    output = storage.make_dirs(output)
    counts = documents_lib.new_counts() if counts is None else counts
    for source, name in zip(sources, names):
        convert_file(source, output / name, counts)
    return [output / name for name in names]


def main(argv: list[str]) -> None:
    counts = documents_lib.new_counts()
    for path in convert_files(argv[1:], flags.FLAGS.output, counts):
        print(path)
    skipped = {k: counts[k] for k in ("invalid_utf8_lines", "long_lines_split") if counts[k]}
    if skipped:
        print(f"skipped or cut: {skipped}", file=sys.stderr)


if __name__ == "__main__":
    # Defined only when run as a program, so that importing this module adds no flags.
    flags.DEFINE_string("output", None, "Folder for the converted files.", required=True)
    cli.run(main)
