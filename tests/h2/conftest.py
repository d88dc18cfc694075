"""Fixtures of the h2 tests."""

import pytest

from h2.data import load_stdlib_corpus


@pytest.fixture(scope="module")
def corpus():
    """The first MiB of the offline corpus, read once per test module."""
    return load_stdlib_corpus(max_bytes=1 << 20)
