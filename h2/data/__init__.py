"""Training data that exists offline on any machine: a byte-level tokenizer and a corpus made of
the Python standard library's own source files, served as fixed-length sequences with
deterministic sharding by data-parallel rank and a resumable position. Imports only h2.core beside torch."""

from h2.data.corpus import Corpus, load_stdlib_corpus
from h2.data.stream import SequenceStream
from h2.data.tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "Corpus", "load_stdlib_corpus", "SequenceStream"]
