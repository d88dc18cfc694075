"""Memory of the dipu device: allocator statistics and the emulated capacity."""
import torch

BLOCK = 512  # allocator granularity


def test_memory_allocated_matches_the_tensors_alive():
    torch.dipu.empty_cache()
    base = torch.dipu.memory_allocated()
    sizes = [1024, 4096, 64 * 1024]  # float32 elements: multiples of the block size in bytes
    tensors = [torch.empty(n, device="dipu") for n in sizes]
    assert torch.dipu.memory_allocated() - base == sum(4 * n for n in sizes)
    del tensors[1]
    assert torch.dipu.memory_allocated() - base == 4 * (sizes[0] + sizes[2])
    del tensors
    assert torch.dipu.memory_allocated() == base


def test_allocations_round_up_to_blocks():
    base = torch.dipu.memory_allocated()
    t = torch.empty(3, dtype=torch.uint8, device="dipu")
    assert torch.dipu.memory_allocated() - base == BLOCK
    del t


def test_peak_tracks_the_high_water_mark_until_reset():
    torch.dipu.reset_peak_memory_stats()
    base = torch.dipu.memory_allocated()
    big = torch.empty(2**20, device="dipu")
    del big
    assert torch.dipu.max_memory_allocated() - base == 4 * 2**20
    torch.dipu.reset_peak_memory_stats()
    assert torch.dipu.max_memory_allocated() == torch.dipu.memory_allocated()


def test_freed_blocks_stay_reserved_until_empty_cache():
    torch.dipu.empty_cache()
    reserved = torch.dipu.memory_reserved()
    t = torch.empty(2**18, device="dipu")
    del t
    assert torch.dipu.memory_reserved() == reserved + 4 * 2**18
    torch.dipu.empty_cache()
    assert torch.dipu.memory_reserved() == reserved


def test_a_model_that_does_not_fit_raises_out_of_memory(python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch, ditorch.dipu
        capacity = torch.dipu.get_device_properties(0).total_memory
        small = torch.nn.Linear(1024, 1024).to("dipu")     # 4 MiB fits
        try:
            torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(5)]).to("dipu")  # 320 MiB does not
        except torch.OutOfMemoryError as error:
            print("OOM", error)
        print("allocated", torch.dipu.memory_allocated(), "capacity", capacity)
    """, DIPU_HOST_PROFILE="small")
    assert result.returncode == 0, result.stderr
    oom_line = next(line for line in result.stdout.splitlines() if line.startswith("OOM"))
    assert "dipu out of memory on device 0: tried to allocate 64.00 MiB (67108864 bytes)" in oom_line
    assert "allocated by tensors" in oom_line and "device capacity 256.00 MiB (268435456 bytes)" in oom_line
    assert "capacity 268435456" in result.stdout


def test_out_of_memory_error_is_catchable_and_the_device_stays_usable(python_in_subprocess):
    result = python_in_subprocess(
        """
        import torch, ditorch.dipu
        try:
            torch.empty(300 * 2**20, dtype=torch.uint8, device="dipu")
        except torch.OutOfMemoryError:
            print("caught")
        x = torch.ones(1000, device="dipu")
        print(float(x.sum()), torch.dipu.memory_stats()["num_ooms"])
    """, DIPU_HOST_PROFILE="small")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["caught", "1000.0", "1"]
