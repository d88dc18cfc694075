"""Functions for tests/h2/test_ranks.py that run only inside ranks, loaded by path ("file.py:function");
the test process never imports this file."""
import os

SEEN_AT_IMPORT = os.environ.get("H2_RANKS_TEST_VALUE")  # read once, when a rank loads this file


def environment_at_import(rank, world_size):
    return {"rank": rank, "world_size": world_size, "seen_at_import": SEEN_AT_IMPORT}
