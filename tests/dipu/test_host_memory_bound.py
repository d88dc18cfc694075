"""Emulated device memory lives in host memory: a profile may promise more than the host has, but
an allocation the host cannot back is a clean out-of-memory error naming the host, never a block
the kernel's OOM killer ends when it is touched. No test here touches the memory it allocates."""

HUGE = "name: huge\ndevice_count: 1\nmemory_capacity: 1024TiB\nhost_accessible: false\n"


def _huge_profile(tmp_path) -> str:
    path = tmp_path / "huge.yaml"
    path.write_text(HUGE)
    return str(path)


def _meminfo_bytes(field: str) -> int:
    for line in open("/proc/meminfo"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/meminfo has no {field}")


def test_free_device_memory_is_bounded_by_the_host_memory_that_backs_it(tmp_path, python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch, ditorch.dipu
        free, total = torch.dipu.mem_get_info()
        print(free, total)
    """, DIPU_HOST_PROFILE=_huge_profile(tmp_path))
    assert result.returncode == 0, result.stderr
    free, total = map(int, result.stdout.split())
    assert total == 1024 * 2**40
    assert free <= _meminfo_bytes("MemTotal")


def test_an_allocation_larger_than_the_host_is_an_out_of_memory_error_naming_the_host(tmp_path, python_in_subprocess):
    result = python_in_subprocess(
        f"""
        import torch, ditorch.dipu
        try:
            torch.empty({_meminfo_bytes("MemTotal") + 2**30}, dtype=torch.uint8, device="dipu")
            print("allocated")
        except torch.OutOfMemoryError as error:
            print(str(error).splitlines()[0])
    """, DIPU_HOST_PROFILE=_huge_profile(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "the host cannot back it" in result.stdout, result.stdout


def test_untouched_allocations_count_against_what_the_host_can_still_back(tmp_path, python_in_subprocess):
    # Two blocks of 60 % of the available memory each fit one at a time; together they would not.
    result = python_in_subprocess(
        """
        import torch, ditorch.dipu
        block = int(torch.dipu.mem_get_info()[0] * 0.6)
        first = torch.empty(block, dtype=torch.uint8, device="dipu")
        try:
            second = torch.empty(block, dtype=torch.uint8, device="dipu")
            print("allocated both")
        except torch.OutOfMemoryError as error:
            print("refused the second:", "the host cannot back it" in str(error))
    """, DIPU_HOST_PROFILE=_huge_profile(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "refused the second: True"
