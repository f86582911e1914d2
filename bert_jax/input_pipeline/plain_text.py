"""Raw books and articles -> the pipeline's text format: one sentence per line, a blank line between documents.

    python -m bert_jax.input_pipeline.plain_text --output=DIR FILES...

Text as it is usually found (Project Gutenberg prose wrapped at 70 columns, WikiText with one paragraph per line)
is turned into documents and sentences the way data/SOURCES.md describes for the bundled corpus:
  - a heading line (CHAPTER 1, Chapter IV, BOOK II, "II. Title", WikiText's " = Title = ") starts a new document and
    is itself dropped, so documents are chapters or articles; WikiText's " = = Section = = " only ends a paragraph;
  - the lines of a paragraph (blank lines separate paragraphs) are joined and whitespace collapsed;
  - paragraphs are split into sentences at whitespace after . ! ? " ' ) and before a capital, a quote or "(".
The words are unchanged. Each input FILE becomes DIR/FILE's name; FILES and DIR may be local or gs://.
"""
from __future__ import annotations

import io
import re
from typing import Iterable, Iterator

from absl import app, flags

from bert_jax import storage

HEADING = re.compile(r"^(?:(?:CHAPTER|Chapter|BOOK|Book)\s+(?:\d+|[IVXLC]+)\b\.?.{0,60}|[IVXLC]+\. .{1,60}"
                     r"|= [^=].* =)$")
SECTION = re.compile(r"^= = .* = =$")  # WikiText's sub-headings: they end a paragraph, not the article
SENTENCE_BREAK = re.compile(r"(?<=[.!?\"')])\s+(?=[\"'(A-Z])")


def documents(lines: Iterable[str]) -> Iterator[list[str]]:
    """Documents (lists of sentences) of a text's lines; headings split documents, blank lines paragraphs."""
    document, paragraph = [], []

    def end_paragraph():
        text = " ".join(" ".join(paragraph).split())
        paragraph.clear()
        if text:
            document.extend(SENTENCE_BREAK.split(text))

    for line in lines:
        stripped = line.strip()
        if HEADING.match(stripped):
            end_paragraph()
            if document:
                yield list(document)
            document.clear()
        elif SECTION.match(stripped):
            end_paragraph()
        elif stripped:
            paragraph.append(stripped)
        else:
            end_paragraph()
    end_paragraph()
    if document:
        yield document


def convert_file(source: storage.PathLike, target: storage.PathLike) -> int:
    """Write `source` in the pipeline's format to `target`; returns the number of documents."""
    with storage.as_path(source).open("rb") as f:
        docs = list(documents(io.TextIOWrapper(f, encoding="utf-8", errors="replace")))
    storage.atomic_write(target, "\n\n".join("\n".join(doc) for doc in docs) + "\n")
    return len(docs)


def convert_files(sources: Iterable[storage.PathLike], output: storage.PathLike) -> list[storage.Path]:
    """Convert every file into `output` (created); returns the written paths. Two sources of one name are an error."""
    output = storage.make_dirs(output)
    written = []
    for source in sources:
        target = output / storage.as_path(source).name
        if target in written:
            raise ValueError(f"two input files are named {target.name}; rename one, outputs go to one folder")
        convert_file(source, target)
        written.append(target)
    return written


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise app.UsageError("give the text files to convert")
    for path in convert_files(argv[1:], flags.FLAGS.output):
        print(path)


if __name__ == "__main__":
    # Defined only when run as a program, so that importing this module adds no flags.
    flags.DEFINE_string("output", None, "Folder for the converted files.", required=True)
    app.run(main)
