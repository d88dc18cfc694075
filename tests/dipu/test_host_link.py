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
