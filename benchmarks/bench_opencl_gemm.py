"""CLBlast SGEMM through dipu on the OpenCL vendor against torch.mm on the CPU, from one run.

    DIPU_VENDOR=opencl .venv/bin/python benchmarks/bench_opencl_gemm.py [--sizes 256,512,1024,2048] [--repeats 5]

For each square size N: the median wall time of `a @ b` on dipu (CLBlast's SGEMM on the OpenCL device,
synchronized) and of torch.mm on the CPU (MKL/oneDNN with torch's threads), their GFLOP/s and the ratio
dipu/CPU (> 1: OpenCL slower), plus the largest relative difference of the results. The first dipu call
of each size is left out (CLBlast compiles its kernels per process; pocl compiles each one once and
caches it under ~/.cache/pocl). The machine's load is printed before and after: the numbers are only as
good as the cores were idle. On pocl, what limits the ratio is pocl's code generation for CLBlast's
generic (untuned for this device) kernels against torch's hand-tuned AVX-512 GEMM, on the same cores.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def load() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,512,1024,2048")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import ditorch.dipu as dipu

    if dipu.vendor_name() != "opencl":
        raise SystemExit("bench_opencl_gemm: run with DIPU_VENDOR=opencl")
    print(f"device: {torch.dipu.get_device_properties(0).name}; torch threads {torch.get_num_threads()}; "
          f"load before {load()}")
    print(f"{'N':>6} {'dipu s':>10} {'cpu s':>10} {'dipu GF/s':>10} {'cpu GF/s':>10} {'ratio':>7} {'max rel diff':>13}")
    for n in (int(s) for s in args.sizes.split(",")):
        a, b = torch.randn(n, n), torch.randn(n, n)
        da, db = a.to("dipu"), b.to("dipu")
        result = (da @ db).cpu()  # compiles (first call of this size in this process)
        expected = torch.mm(a, b)
        difference = float(((result - expected).abs() / (expected.abs() + 1)).max())

        def on_dipu():
            da @ db
            torch.dipu.synchronize()

        dipu_s = median_seconds(on_dipu, args.repeats)
        cpu_s = median_seconds(lambda: torch.mm(a, b), args.repeats)
        flops = 2.0 * n**3
        print(f"{n:>6} {dipu_s:>10.4f} {cpu_s:>10.4f} {flops / dipu_s / 1e9:>10.2f} {flops / cpu_s / 1e9:>10.2f} "
              f"{dipu_s / cpu_s:>7.2f} {difference:>13.2e}")
    print(f"load after {load()}")


if __name__ == "__main__":
    main()
