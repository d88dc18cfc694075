"""Fixtures of the HeteroAuto tests."""

import pytest


@pytest.fixture
def write(tmp_path):

    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write
