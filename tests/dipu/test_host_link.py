"""The emulated host link of a discrete chip (host_link_gbps, host_link_latency_us): each copy across
it takes the link's latency plus bytes / bandwidth, whatever the host's memmove took."""

LINK = "name: linked\ndevice_count: 2\nhost_accessible: false\nhost_link_gbps: 1\nhost_link_latency_us: {latency}\n"


def _profile(tmp_path, latency_us: float) -> str:
    path = tmp_path / "linked.yaml"
    path.write_text(LINK.format(latency=latency_us))
    return str(path)


def test_a_copy_to_the_device_takes_the_link_latency_plus_bytes_over_bandwidth(tmp_path, python_in_subprocess):
    result = python_in_subprocess(
        """
        import statistics, time, torch, ditorch.dipu
        host = torch.ones(1_000_000, dtype=torch.uint8)
        device = torch.empty_like(host, device="dipu")
        times = []
        for _ in range(7):
            start = time.perf_counter()
            device.copy_(host)
            times.append(time.perf_counter() - start)
        print(statistics.median(times))
    """, DIPU_HOST_PROFILE=_profile(tmp_path, 2000))
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) >= 0.003  # 2 ms latency + 1 MB at 1 GB/s; a memmove alone takes ~0.1 ms


def test_a_copy_back_to_the_host_pays_the_link_too(tmp_path, python_in_subprocess):
    result = python_in_subprocess(
        """
        import time, torch, ditorch.dipu
        device = torch.ones(1_000_000, dtype=torch.uint8, device="dipu")
        device.cpu()
        start = time.perf_counter()
        device.cpu()
        print(time.perf_counter() - start)
    """, DIPU_HOST_PROFILE=_profile(tmp_path, 2000))
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) >= 0.003


def test_an_asynchronous_copy_returns_at_once_and_synchronize_waits_for_the_link(tmp_path, python_in_subprocess):
    result = python_in_subprocess(
        """
        import time, torch, ditorch.dipu
        host = torch.ones(1000, dtype=torch.uint8).pin_memory()
        device = torch.empty(1000, dtype=torch.uint8, device="dipu")
        device.copy_(host, non_blocking=True); torch.dipu.synchronize()
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        queued = time.perf_counter() - start
        torch.dipu.synchronize()
        print(queued < 0.2, time.perf_counter() - start >= 0.2)
    """, DIPU_HOST_PROFILE=_profile(tmp_path, 200_000))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


def test_a_copy_between_two_devices_crosses_the_link_and_one_within_a_device_does_not(tmp_path, python_in_subprocess):
    result = python_in_subprocess(
        """
        import time, torch, ditorch.dipu
        a = torch.ones(1000, dtype=torch.uint8, device="dipu:0")
        same, other = torch.empty_like(a), torch.empty(1000, dtype=torch.uint8, device="dipu:1")
        def timed(target):
            start = time.perf_counter()
            target.copy_(a)
            return time.perf_counter() - start
        timed(same)
        print(timed(same) < 0.2, timed(other) >= 0.2)
    """, DIPU_HOST_PROFILE=_profile(tmp_path, 200_000))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


# A slow chip (kernels at 0.2 of a host core) on a slow link: a copy's emulated time is set by the
# latency, a kernel's by its CPU time.
ENGINES = "name: engines\ndevice_count: 1\nhost_accessible: false\nrelative_speed: 0.2\nhost_link_gbps: 1\n" \
    "host_link_latency_us: 400000\n"

# `kernels(n)` keeps the chip busy for about 0.4 s (calibrated after a warm-up); `copy_on_side()`
# queues a copy to the device on a created stream (0.4 s of link latency) and records `copied` there.
COPY_BESIDE_KERNELS = """
    import time, torch, ditorch.dipu
    host = torch.ones(1000, dtype=torch.uint8).pin_memory()
    landing = torch.empty(1000, dtype=torch.uint8, device="dipu")
    a = torch.randn(256, 256, device="dipu")
    def kernels(n):
        for _ in range(n):
            a.mul_(1.0001)
    def timed(case):
        torch.dipu.synchronize()
        start = time.perf_counter()
        case()
        return time.perf_counter() - start
    timed(lambda: (kernels(20), torch.dipu.synchronize()))  # the first kernels run slower
    per = timed(lambda: (kernels(20), torch.dipu.synchronize())) / 20
    n = max(1, int(0.4 / per))
    side = torch.dipu.Stream()
    copied = torch.dipu.Event()
    def copy_on_side():
        with torch.dipu.stream(side):
            landing.copy_(host, non_blocking=True)
            copied.record(side)
"""


def _engines_profile(tmp_path) -> str:
    path = tmp_path / "engines.yaml"
    path.write_text(ENGINES)
    return str(path)


def test_a_copy_on_a_side_stream_overlaps_the_kernels_of_the_default_stream(tmp_path, python_in_subprocess):
    """A copy engine beside the compute engine: kernels and an asynchronous copy on another stream
    take about the longer of the two, not their sum (on one timeline per device they took the sum)."""
    result = python_in_subprocess(
        COPY_BESIDE_KERNELS + """
    compute = timed(lambda: (kernels(n), torch.dipu.synchronize()))
    both = timed(lambda: (copy_on_side(), kernels(n), torch.dipu.synchronize()))
    print(compute, both)
    """, DIPU_HOST_PROFILE=_engines_profile(tmp_path))
    assert result.returncode == 0, result.stderr
    compute, both = map(float, result.stdout.split())
    assert both >= 0.4  # the device synchronize waits for the copy (0.4 s of latency)
    assert both < compute + 0.4 - 0.5 * min(compute, 0.4), (compute, both)


def test_the_default_stream_waits_for_a_side_copy_only_through_its_event(tmp_path, python_in_subprocess):
    """Without a wait the default stream's kernels end before the side stream's copy; after
    wait_event(copied) the next kernel starts after the copy's emulated end, and synchronising the
    side stream, or its event, waits for the copy."""
    result = python_in_subprocess(
        COPY_BESIDE_KERNELS + """
    def default_stream_done():
        torch.dipu.current_stream().synchronize()
    unordered = timed(lambda: (copy_on_side(), kernels(1), default_stream_done()))
    torch.dipu.synchronize()
    def ordered():
        copy_on_side()
        torch.dipu.current_stream().wait_event(copied)
        kernels(1)
        default_stream_done()
    waited = timed(ordered)
    side_synchronized = timed(lambda: (copy_on_side(), side.synchronize()))
    event_synchronized = timed(lambda: (copy_on_side(), copied.synchronize()))
    print(unordered, waited, side_synchronized, event_synchronized)
    """, DIPU_HOST_PROFILE=_engines_profile(tmp_path))
    assert result.returncode == 0, result.stderr
    unordered, waited, side_synchronized, event_synchronized = map(float, result.stdout.split())
    assert unordered < 0.3, unordered
    assert waited >= 0.4 and side_synchronized >= 0.4 and event_synchronized >= 0.4, result.stdout


def test_copies_on_one_side_stream_queue_behind_each_other(tmp_path, python_in_subprocess):
    """One copy engine per direction: two copies to the device take the link twice."""
    result = python_in_subprocess(
        COPY_BESIDE_KERNELS + """
    print(timed(lambda: (copy_on_side(), copy_on_side(), side.synchronize())))
    """, DIPU_HOST_PROFILE=_engines_profile(tmp_path))
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) >= 0.8
