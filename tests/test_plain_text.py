"""Raw text -> one sentence per line, blank line between documents (bert_jax.input_pipeline.plain_text)."""
import pytest

from bert_jax.input_pipeline import plain_text

GUTENBERG = """[Emma by Jane Austen 1816]

CHAPTER I

Emma Woodhouse, handsome, clever, and rich, seemed to unite some
of the best blessings of existence. She had lived nearly twenty-one
years in the world!

"How was you?" said she.  (Nobody answered.)

CHAPTER II

Mr. Weston was a native of Highbury.
"""


def test_headings_split_documents_and_wrapped_lines_join_into_sentences():
    docs = list(plain_text.documents(GUTENBERG.splitlines()))
    assert docs == [
        ["[Emma by Jane Austen 1816]"],
        ["Emma Woodhouse, handsome, clever, and rich, seemed to unite some of the best blessings of existence.",
         "She had lived nearly twenty-one years in the world!", '"How was you?" said she.', "(Nobody answered.)"],
        # "Mr. Weston": a break needs a capital after the space, and "Mr." is followed by one; BERT's own data had
        # the same kind of sentence splitter errors, and a pair built across them is still two real spans.
        ["Mr.", "Weston was a native of Highbury."],
    ]


def test_wikitext_headings_and_paragraph_lines():
    lines = [" = Robert Boulter = \r\n", " Robert Boulter is an English actor . He was born in 1970 .\r\n",
             " = = Career = = \r\n", " He had a role .\r\n", " = Du Fu = \r\n", " Du Fu was a poet . \r\n"]
    docs = list(plain_text.documents(lines))
    assert docs == [["Robert Boulter is an English actor .", "He was born in 1970 .", "He had a role ."],
                    ["Du Fu was a poet ."]]


def test_words_are_unchanged(tmp_path):
    source = tmp_path / "in" / "book.txt"
    source.parent.mkdir()
    source.write_text(GUTENBERG)
    [target] = plain_text.convert_files([source], tmp_path / "out")
    converted = target.read_text()
    headings = {"CHAPTER", "I", "II"}
    assert converted.split() == [w for w in GUTENBERG.split() if w not in headings]
    assert converted.count("\n\n") == 2  # three documents


def test_two_inputs_of_one_name_are_refused(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "book.txt").write_text("One. Two.\n")
    with pytest.raises(ValueError, match="book.txt"):
        plain_text.convert_files([tmp_path / "a" / "book.txt", tmp_path / "b" / "book.txt"], tmp_path / "out")
