"""Prefetch of a ministage's parameters on a side stream (heteropp.ministages.StreamLane) on an emulated
discrete chip whose host link takes 0.4 s a copy: the host does not wait for the copy (settling the
move hands the parameters over at once); the compute stream does (its next kernel ends after the copy)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PROFILE = "name: slow-link\ndevice_count: 1\nhost_accessible: false\nhost_link_gbps: 1\nhost_link_latency_us: 400000\n"

CODE = """
    import time, torch, ditorch.dipu
    from heteropp.ministages import ParameterHome, StreamLane
    params = [torch.nn.Parameter(torch.randn(64, 64))]
    home = ParameterHome(params, torch.device("dipu"), pinned=True)
    home.to_host()
    lane = StreamLane(torch.device("dipu"))
    torch.dipu.synchronize()
    start = time.perf_counter()
    home.move(lane, to_device=True)
    home.settle()
    settled = time.perf_counter() - start
    doubled = params[0] * 2
    torch.dipu.current_stream().synchronize()
    computed = time.perf_counter() - start
    assert torch.equal(doubled.cpu(), params[0].detach().cpu() * 2)
    print(settled, computed, params[0].device.type, home.host[0].is_pinned())
"""


def test_a_prefetched_chunk_is_waited_for_by_the_compute_stream_not_by_the_host(tmp_path):
    profile = tmp_path / "slow-link.yaml"
    profile.write_text(PROFILE)
    env = {**os.environ, "DIPU_HOST_PROFILE": str(profile)}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    settled, computed, device, pinned = result.stdout.split()
    assert float(settled) < 0.2, result.stdout  # the host went on during the copy
    assert float(computed) >= 0.4, result.stdout  # the kernel after it waited for the copy's end
    assert (device, pinned) == ("dipu", "True")
