"""What a CUDA-written script can use on this machine's vendor once `import ditorch` is its first
line: one small probe per `torch.cuda` API, distributed entry point and torch feature, each written
as a CUDA user writes it and run in its own process (a one-rank job of `h2.core.ranks`, so that
distributed probes get RANK, WORLD_SIZE and a free MASTER_PORT), reporting "works" or the first
line of the error the user sees. `ditorch compat` prints the table.
"""
from __future__ import annotations

import dataclasses
import textwrap
import traceback

from h2.core.ranks import RankFailure, run_ranks

# (area, what a user calls, the code: `import ditorch` is run before it; an exception is a failure)
# A code line too long for this file is split over two adjacent literals: the code run, and the line numbers an
# error reports, stay the same.
PROBES: list[tuple[str, str, str]] = [
    ("torch.cuda", "is_available, device_count, current_device", """
        assert torch.cuda.is_available() and torch.cuda.device_count() >= 1 and torch.cuda.current_device() == 0
    """),
    ("torch.cuda", "set_device(1)", "torch.cuda.set_device(1); assert torch.cuda.current_device() == 1"),
    ("torch.cuda", 'set_device("cuda:1")', 'torch.cuda.set_device("cuda:1"); assert torch.cuda.current_device() == 1'),
    ("torch.cuda", 'set_device(torch.device("cuda", 1))',
     'torch.cuda.set_device(torch.device("cuda", 1)); assert torch.cuda.current_device() == 1'),
    ("torch.cuda", "synchronize()", "torch.cuda.synchronize()"),
    ("torch.cuda", 'synchronize("cuda:0")', 'torch.cuda.synchronize("cuda:0")'),
    ("torch.cuda", "memory_allocated(), max_memory_allocated(), memory_reserved()", """
        x = torch.ones(1024, device="cuda")
        assert torch.cuda.memory_allocated() >= 4096 and torch.cuda.max_memory_allocated() >= 4096
        assert torch.cuda.memory_reserved() >= 4096
    """),
    ("torch.cuda", 'memory_allocated("cuda:0")', 'torch.cuda.memory_allocated("cuda:0")'),
    ("torch.cuda", 'max_memory_allocated(torch.device("cuda:0"))',
     'torch.cuda.max_memory_allocated(torch.device("cuda:0"))'),
    ("torch.cuda", "reset_peak_memory_stats(), empty_cache(), memory_stats()", """
        torch.cuda.reset_peak_memory_stats(); torch.cuda.empty_cache(); """
     """assert isinstance(torch.cuda.memory_stats(), dict)
    """),
    ("torch.cuda", "mem_get_info()", "free, total = torch.cuda.mem_get_info(); assert 0 < free <= total"),
    ("torch.cuda", 'mem_get_info("cuda:0")', 'torch.cuda.mem_get_info("cuda:0")'),
    ("torch.cuda", "get_device_properties(0), get_device_name(), get_device_capability()", """
        assert torch.cuda.get_device_properties(0).total_memory > 0
        result = torch.cuda.get_device_name(); torch.cuda.get_device_capability()
    """),
    ("torch.cuda", 'get_device_properties("cuda:0")', 'torch.cuda.get_device_properties("cuda:0").total_memory'),
    ("torch.cuda", 'get_device_name("cuda:0")', 'torch.cuda.get_device_name("cuda:0")'),
    ("torch.cuda", "is_bf16_supported()", "torch.cuda.is_bf16_supported()"),
    ("torch.cuda", "Stream(), stream(s), current_stream(), default_stream()", """
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.ones(4, device="cuda") * 2
        torch.cuda.current_stream().synchronize(); torch.cuda.default_stream()
    """),
    ("torch.cuda", 'Stream(device="cuda:0")', 'torch.cuda.Stream(device="cuda:0")'),
    ("torch.cuda", 'current_stream("cuda:0")', 'torch.cuda.current_stream("cuda:0")'),
    ("torch.cuda", "Event(enable_timing=True), elapsed_time", """
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda"); b.record(); b.synchronize()
        assert a.elapsed_time(b) >= 0
    """),
    ("torch.cuda", "manual_seed, manual_seed_all, seed, initial_seed", """
        torch.cuda.manual_seed(1); torch.cuda.manual_seed_all(1); torch.cuda.seed(); torch.cuda.initial_seed()
    """),
    ("torch.cuda", "get_rng_state(), set_rng_state()", "torch.cuda.set_rng_state(torch.cuda.get_rng_state())"),
    ("torch.cuda", 'get_rng_state("cuda:0")', 'torch.cuda.get_rng_state("cuda:0")'),
    ("torch.cuda", 'device("cuda:1") context', """
        with torch.cuda.device("cuda:1"):
            assert torch.cuda.current_device() == 1
    """),
    ("torch.cuda", "device(1) context", """
        with torch.cuda.device(1):
            assert torch.cuda.current_device() == 1
    """),
    ("torch.cuda", "CUDA graphs (torch.cuda.CUDAGraph)", "torch.cuda.CUDAGraph()"),
    ("tensors", 'torch.randn(..., device="cuda"), .cuda(), .to("cuda:1"), is_cuda', """
        x = torch.randn(2, device="cuda"); y = torch.ones(2).cuda(); z = y.to("cuda:1")
        assert x.is_cuda and z.device.index == 1; result = str(x.device)
    """),
    ("tensors", 'x.new_zeros(2, device="cuda")', 'assert torch.ones(2).new_zeros(2, device="cuda").is_cuda'),
    ("tensors", 'with torch.device("cuda"): torch.ones(2)', """
        with torch.device("cuda"):
            x = torch.ones(2)
        assert x.is_cuda, x.device
    """),
    ("tensors", 'with torch.device("meta"): nn.Linear(4, 4)', """
        with torch.device("meta"):
            layer = torch.nn.Linear(4, 4)
        assert layer.weight.is_meta, layer.weight.device
    """),
    ("tensors", "pin_memory(), .to(non_blocking=True)", """
        x = torch.ones(8).pin_memory(); assert x.is_pinned(); y = x.to("cuda", non_blocking=True); """
     """torch.cuda.synchronize()
    """),
    ("tensors", 'torch.Generator(device="cuda")', 'torch.Generator(device="cuda").manual_seed(0)'),
    ("tensors", "share_memory_() of a cuda tensor (hogwild)", 'torch.ones(4, device="cuda").share_memory_()'),
    ("modules", "optimizer built before model.cuda() updates the model", """
        model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1); model.cuda()
        before = model.weight.detach().cpu().clone()
        model(torch.ones(2, 4, device="cuda")).sum().backward(); opt.step()
        assert not torch.equal(model.weight.detach().cpu(), before), "the optimizer updated orphaned CPU tensors"
    """),
    ("modules", "tied weights stay tied after model.cuda()", """
        emb = torch.nn.Embedding(10, 4); head = torch.nn.Linear(4, 10, bias=False); head.weight = emb.weight
        model = torch.nn.ModuleList([emb, head]).cuda()
        assert model[0].weight is model[1].weight, "tied weights came apart"
    """),
    ("modules", "nn.Conv2d forward and backward", """
        conv = torch.nn.Conv2d(3, 4, 3).cuda(); conv(torch.randn(1, 3, 8, 8, device="cuda")).sum().backward()
    """),
    ("modules", "nn.LSTM and nn.GRU forward and backward", """
        for cls in (torch.nn.LSTM, torch.nn.GRU):
            rnn = cls(4, 8).cuda(); out, _ = rnn(torch.randn(5, 2, 4, device="cuda")); out.sum().backward()
    """),
    ("modules", "nn.TransformerEncoderLayer equals the CPU bit for bit", """
        torch.manual_seed(0); layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).eval()
        x = torch.randn(5, 2, 16)
        with torch.no_grad():
            expected = layer(x); got = layer.cuda()(x.cuda()).cpu()
        assert torch.equal(expected, got), f"max difference {(expected - got).abs().max().item()}"
    """),
    ("features", "torch.autocast(\"cuda\", dtype=torch.bfloat16)", """
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = torch.ones(4, 4, device="cuda") @ torch.ones(4, 4, device="cuda")
        assert y.dtype == torch.bfloat16
    """),
    ("features", "torch.cuda.amp.autocast()", """
        with torch.cuda.amp.autocast(dtype=torch.bfloat16):
            y = torch.ones(4, 4, device="cuda") @ torch.ones(4, 4, device="cuda")
        assert y.dtype == torch.bfloat16
    """),
    ("features", 'torch.is_autocast_enabled("cuda") inside autocast("cuda")', """
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert torch.is_autocast_enabled("cuda"), 'torch.is_autocast_enabled("cuda") is False'
    """),
    ("features", 'GradScaler("cuda"): scale, step, update', """
        model = torch.nn.Linear(4, 1).cuda(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.ones(2, 4, device="cuda")).float().sum()
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    """),
    ("features", "torch.compile(model)", """
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).cuda()
        x = torch.randn(3, 4, device="cuda")
        assert torch.allclose(torch.compile(model)(x), model(x), rtol=1e-5, atol=1e-6)
    """),
    ("checkpoints", 'torch.save of cuda tensors, torch.load(map_location="cuda")', """
        import io
        buffer = io.BytesIO(); torch.save({"w": torch.ones(3, device="cuda")}, buffer); buffer.seek(0)
        assert torch.load(buffer, map_location="cuda")["w"].is_cuda
    """),
    ("checkpoints", "torch.load of a checkpoint written on a CUDA machine", """
        import io, torch.serialization as serialization
        real_tag = serialization.location_tag
        serialization.location_tag = lambda storage: "cuda:0"  # as a CUDA machine records its tensors
        buffer = io.BytesIO(); torch.save({"w": torch.ones(3)}, buffer); buffer.seek(0)
        serialization.location_tag = real_tag
        w = torch.load(buffer)["w"]; result = str(w.device)
        assert w.is_cuda, w.device
    """),
    ("checkpoints", "torch.distributed.checkpoint save and load of a cuda state dict", """
        import tempfile, torch.distributed.checkpoint as dcp
        folder = tempfile.mkdtemp(); model = torch.nn.Linear(4, 4).cuda()
        dcp.save(model.state_dict(), checkpoint_id=folder)
        loaded = torch.nn.Linear(4, 4).cuda().state_dict(); dcp.load(loaded, checkpoint_id=folder)
        assert torch.equal(loaded["weight"].cpu(), model.weight.detach().cpu())
    """),
    ("distributed", 'init_process_group("nccl"), all_reduce', """
        import torch.distributed as dist
        dist.init_process_group("nccl"); x = torch.ones(2, device="cuda"); dist.all_reduce(x); """
     """result = dist.get_backend()
        dist.destroy_process_group()
    """),
    ("distributed", "init_process_group() with no backend", """
        import torch.distributed as dist
        dist.init_process_group(); x = torch.ones(2, device="cuda"); dist.all_reduce(x); dist.destroy_process_group()
    """),
    ("distributed", 'dist.get_backend() == "nccl"', """
        import torch.distributed as dist
        dist.init_process_group("nccl"); backend = dist.get_backend(); dist.destroy_process_group()
        assert backend == "nccl", f"get_backend() is {backend!r}"
    """),
    ("distributed", "DistributedDataParallel(model, device_ids=[rank])", """
        import torch.distributed as dist
        dist.init_process_group("nccl"); model = torch.nn.Linear(4, 1).cuda()
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
        ddp(torch.ones(2, 4, device="cuda")).sum().backward(); dist.destroy_process_group()
    """),
    ("distributed", 'init_device_mesh("cuda", (1,)) before init_process_group', """
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cuda", (1,)); result = str(mesh.device_type)
    """),
    ("distributed", "FSDP2 fully_shard(model)", """
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        dist.init_process_group("nccl"); torch.cuda.set_device(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)).cuda()
        fully_shard(model); model(torch.ones(2, 4, device="cuda")).sum().backward(); dist.destroy_process_group()
    """),
    ("distributed", "FSDP(model, device_id=torch.cuda.current_device())", """
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel
        dist.init_process_group("nccl"); model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        fsdp = FullyShardedDataParallel(model, device_id=torch.cuda.current_device())
        fsdp(torch.ones(2, 4, device="cuda")).sum().backward(); dist.destroy_process_group()
    """),
    ("distributed", "tensor parallel: parallelize_module(ColwiseParallel, RowwiseParallel)", """
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        dist.init_process_group("nccl"); mesh = init_device_mesh("cuda", (1,))
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).cuda()
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        model(torch.ones(2, 4, device="cuda")).sum().backward(); dist.destroy_process_group()
    """),
    ("distributed", "DTensor: distribute_tensor, random init under the RNG tracker", """
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        dist.init_process_group("nccl"); mesh = init_device_mesh("cuda", (1,))
        d = distribute_tensor(torch.randn(4, 4, device="cuda"), mesh, [Shard(0)])
        torch.nn.init.normal_(d); result = str(d.to_local().device); dist.destroy_process_group()
    """),
]


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    area: str
    api: str
    works: bool
    detail: str  # what it returned (a device, a backend), or the first line of the error


def run_probe(rank: int, world_size: int, code: str) -> tuple[bool, str]:
    """One probe in this process: `import ditorch`, then the user's code."""
    import torch

    import ditorch  # noqa: F401  the first line of the user's script

    namespace = {"torch": torch}
    try:
        exec(textwrap.dedent(code), namespace)  # noqa: S102  the probe catalogue above, nothing from outside
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # the user would see this error (DCP's CheckpointException is a BaseException)
        return False, describe(error)
    return True, str(namespace.get("result", ""))


def describe(error: BaseException) -> str:
    """The error's type and first line (two when the first only introduces the second); where it
    was raised when it has no message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        frame = traceback.extract_tb(error.__traceback__)[-1]
        return f"{type(error).__name__} raised in {'/'.join(frame.filename.split('/')[-3:])}:{frame.lineno}"
    text = " ".join(lines[:2]) if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    if any(line.startswith("Traceback") for line in lines[1:]):  # an error that carries its cause's traceback
        text += f" ({lines[-1]})"
    return f"{type(error).__name__}: {text}"


def run_probes(probes=PROBES, timeout: float = 120, progress=None) -> list[ProbeResult]:
    results = []
    for index, (area, api, code) in enumerate(probes, start=1):
        try:
            (outcome, ) = run_ranks(run_probe, 1, args=(code, ), timeout=timeout, start_method="forkserver",
                                    preload=("torch", ), env={"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
            works, detail = outcome
        except RankFailure as failure:
            works, detail = False, f"the process died: {str(failure).splitlines()[0]}"
        results.append(ProbeResult(area, api, works, detail))
        if progress:
            progress(index, len(probes), results[-1])
    return results


def format_markdown(results: list[ProbeResult], device: str) -> str:
    lines = ["| area | what the script calls | on " + device + " | what the user sees |", "|---|---|---|---|"]
    for r in results:
        detail = (r.detail if len(r.detail) <= 200 else r.detail[:200] + " ...").replace("|", "\\|")
        lines.append(f"| {r.area} | `{r.api}` | {'works' if r.works else '**fails**'} | {detail} |")
    return "\n".join(lines)
