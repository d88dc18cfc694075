"""A 1 GiB flood of messages nobody posted a receive for, sent by a peer holding the job token to a
DiComm rank at the default budget: prints how much was sent before the rank refused it, and its error.

Run: python benchmarks/faults/dicomm_flood.py
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "dicomm"))
from dicomm import _dicomm_core as core
from scenarios import start
from test_faults import impersonate_rank_1

store_dir = tempfile.mkdtemp()
piece = 4 << 20
sent = 0
t0 = time.perf_counter()
with start("echo", ranks=[0], store_dir=store_dir, token="t", request_timeout=120) as victim:
    s = impersonate_rank_1(store_dir, "t")
    for seq in range((1 << 30) // piece):
        frame = core.encode_frame_header("Data", tag=5, seq=seq, total_bytes=piece, payload_bytes=piece)
        try:
            s.sendall(frame + b"z" * piece)
            sent += piece
        except OSError:
            break
    (result, ) = victim.results(timeout=120)
    s.close()
print(f"sent {sent >> 20} MiB of a 1 GiB unposted flood in {time.perf_counter() - t0:.1f} s; victim: {result['error']}")
