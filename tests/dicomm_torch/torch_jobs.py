"""The dicomm torch.distributed test jobs, and `run_job`/`start_job` that run one on local ranks.

Each rank (h2.core.ranks: RANK, WORLD_SIZE and MASTER_* for env:// rendezvous) runs the job's named
checks and returns {check: None | "error text"}, so a test can assert on each check.
"""
from __future__ import annotations

import datetime
import os
import signal
import time
import traceback

import torch
import torch.distributed as dist

import dicomm  # noqa: F401  (registers the backend)
from dicomm.torch_backend import transport_of
from h2.core.ranks import RankJob, run_ranks, start_ranks

RANK = WORLD = 0  # set by main() in each rank
findings: dict = {}


def check(name):

    def run(fn):
        try:
            fn()
            findings[name] = None
        except Exception as e:  # recorded for the test to report
            findings[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        return fn

    return run


def init(timeout_s: float = 30.0, backend: str = "dicomm") -> None:
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))


def contribution(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """What rank `rank` feeds into a reduction: small integers, exact in every dtype."""
    base = torch.arange(count) % 5 + 1
    if dtype == torch.bool:
        return (base + rank) % 2 == 0
    return (base * (rank + 1) % 7 + 1).to(dtype)


def closed_form(op, count: int, dtype: torch.dtype) -> torch.Tensor:
    parts = [contribution(q, count, dtype) for q in range(WORLD)]
    if dtype == torch.bool:
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.BOR):
            return torch.stack(parts).any(0)
        if op in (dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.BAND):
            return torch.stack(parts).all(0)
        if op == dist.ReduceOp.BXOR:
            return torch.stack(parts).sum(0) % 2 == 1
    wide = torch.stack([p.to(torch.float64) if dtype.is_floating_point else p.to(torch.int64) for p in parts])
    if op == dist.ReduceOp.SUM:
        out = wide.sum(0)
    elif op == dist.ReduceOp.AVG:
        out = wide.mean(0)
    elif op == dist.ReduceOp.PRODUCT:
        out = wide.prod(0)
    elif op == dist.ReduceOp.MIN:
        out = wide.min(0).values
    elif op == dist.ReduceOp.MAX:
        out = wide.max(0).values
    else:
        out = parts[0].to(torch.int64)
        for p in parts[1:]:
            out = {
                dist.ReduceOp.BAND: torch.bitwise_and, dist.ReduceOp.BOR: torch.bitwise_or,
                dist.ReduceOp.BXOR: torch.bitwise_xor
            }[op](out, p.to(torch.int64))
    return out.to(dtype)


def assert_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if actual.dtype != expected.dtype or actual.shape != expected.shape or not torch.equal(actual, expected):
        raise AssertionError(f"{what}: got {actual.flatten()[:8].tolist()} ({actual.dtype}, {tuple(actual.shape)}), "
                             f"expected {expected.flatten()[:8].tolist()} ({expected.dtype}, {tuple(expected.shape)})")


FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]


# ---------------------------------------------------------------------------------------------
def job_collectives(args) -> None:
    init()
    n, r = WORLD, RANK

    @check("barrier_waits_for_the_last_rank")
    def _():
        dist.barrier()  # every rank starts the clock together (they leave init_process_group at different times)
        start = time.monotonic()
        if r == 0:
            time.sleep(0.4)
        dist.barrier()
        if r != 0 and time.monotonic() - start < 0.3:
            raise AssertionError(f"left the barrier after {time.monotonic() - start:.3f} s, before rank 0 arrived")

    @check("all_reduce_every_op_and_dtype_matches_closed_form")
    def _():
        ops = {
            dist.ReduceOp.SUM: ALL_DTYPES, dist.ReduceOp.PRODUCT: [torch.float32, torch.int64],
            dist.ReduceOp.MIN: ALL_DTYPES, dist.ReduceOp.MAX: ALL_DTYPES, dist.ReduceOp.AVG: [
                torch.float32, torch.float64
            ], dist.ReduceOp.BAND: INT_DTYPES + [torch.bool], dist.ReduceOp.BOR: INT_DTYPES + [torch.bool],
            dist.ReduceOp.BXOR: INT_DTYPES + [torch.bool]
        }
        for op, dtypes in ops.items():
            for dtype in dtypes:
                t = contribution(r, 37, dtype)
                dist.all_reduce(t, op=op)
                assert_equal(t, closed_form(op, 37, dtype), f"all_reduce {op} {dtype}")

    @check("all_reduce_large_uneven_buffer_matches_closed_form")
    def _():
        count = 300_007  # 1.2 MB: reduce-scatter + all-gather path, chunks differ by one element
        for dtype in (torch.float32, torch.int64):
            t = contribution(r, count, dtype)
            dist.all_reduce(t)
            assert_equal(t, closed_form(dist.ReduceOp.SUM, count, dtype), f"large all_reduce {dtype}")
        t = contribution(r, count, torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert_equal(t, closed_form(dist.ReduceOp.MAX, count, torch.float64), "large all_reduce max")

    @check("all_reduce_of_non_contiguous_tensor_writes_back_in_place")
    def _():
        base = contribution(r, 60, torch.float32).view(6, 10)
        view = base.t()
        dist.all_reduce(view)
        assert_equal(base, closed_form(dist.ReduceOp.SUM, 60, torch.float32).view(6, 10), "non-contiguous all_reduce")

    @check("all_reduce_of_complex_sums_real_and_imaginary_parts")
    def _():
        t = torch.complex(torch.full((5, ), float(r + 1)), torch.full((5, ), float(-r)))
        dist.all_reduce(t)
        expected = torch.complex(torch.full((5, ), float(sum(range(1, n + 1)))), torch.full((5, ),
                                                                                            float(-sum(range(n)))))
        assert_equal(t, expected, "complex all_reduce")

    @check("async_all_reduce_future_yields_the_result")
    def _():
        t = contribution(r, 1000, torch.float32)
        fut = dist.all_reduce(t, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2).wait()
        assert_equal(doubled, closed_form(dist.ReduceOp.SUM, 1000, torch.float32) * 2, "future of all_reduce")

    @check("coalesced_all_reduces_complete_as_one_work")
    def _():
        tensors = [contribution(r, c, torch.float32) for c in (3, 70_000)]
        with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
            for t in tensors:
                dist.all_reduce(t)
        cm.wait()
        for t, c in zip(tensors, (3, 70_000)):
            assert_equal(t, closed_form(dist.ReduceOp.SUM, c, torch.float32), f"coalesced all_reduce of {c}")

    @check("broadcast_from_each_root_for_each_dtype")
    def _():
        for root in range(n):
            for dtype in ALL_DTYPES:
                t = contribution(r, 33, dtype)
                dist.broadcast(t, src=root)
                assert_equal(t, contribution(root, 33, dtype), f"broadcast from {root} {dtype}")
        big = torch.full((1 << 18, ), float(r))
        dist.broadcast(big, src=n - 1)
        assert_equal(big, torch.full((1 << 18, ), float(n - 1)), "1 MiB broadcast")

    @check("broadcast_into_non_contiguous_tensor")
    def _():
        base = torch.full((4, 6), float(r))
        dist.broadcast(base[:, ::2], src=1)
        expected = torch.full((4, 6), float(r))
        expected[:, ::2] = 1.0
        assert_equal(base, expected, "non-contiguous broadcast")

    @check("all_gather_list_with_non_contiguous_outputs")
    def _():
        outs = [torch.zeros(3, 4).t() for _ in range(n)]
        dist.all_gather(outs, torch.full((4, 3), float(r)))
        for q in range(n):
            assert_equal(outs[q], torch.full((4, 3), float(q)), f"all_gather slot {q}")

    @check("all_gather_into_tensor_stacks_ranks_in_order")
    def _():
        out = torch.empty(n * 5, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.arange(5) + 10 * r)
        assert_equal(out, torch.cat([torch.arange(5) + 10 * q for q in range(n)]), "all_gather_into_tensor")

    @check("reduce_scatter_list_and_tensor_match_closed_form")
    def _():
        count = 1000
        full = contribution(r, n * count, torch.float32)
        expected = closed_form(dist.ReduceOp.SUM, n * count, torch.float32)[r * count:(r + 1) * count]
        out = torch.empty(count)
        dist.reduce_scatter(out, list(full.chunk(n)))
        assert_equal(out, expected, "reduce_scatter")
        out = torch.empty(count)
        dist.reduce_scatter_tensor(out, full)
        assert_equal(out, expected, "reduce_scatter_tensor")
        out = torch.empty(count)
        dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.MAX)
        assert_equal(out,
                     closed_form(dist.ReduceOp.MAX, n * count, torch.float32)[r * count:(r + 1) * count],
                     "reduce_scatter_tensor max")

    @check("all_to_all_list_and_single_with_uneven_splits")
    def _():
        outs = [torch.empty(2) for _ in range(n)]
        dist.all_to_all(outs, [torch.full((2, ), float(10 * r + q)) for q in range(n)])
        for q in range(n):
            assert_equal(outs[q], torch.full((2, ), float(10 * q + r)), f"all_to_all from {q}")
        # rank r sends q + 1 rows to rank q; so it receives r + 1 rows from everyone.
        send = torch.cat([torch.full((q + 1, 2), float(100 * r + q)) for q in range(n)])
        recv = torch.empty(n * (r + 1), 2)
        dist.all_to_all_single(recv, send, output_split_sizes=[r + 1] * n, input_split_sizes=[q + 1 for q in range(n)])
        assert_equal(recv, torch.cat([torch.full((r + 1, 2), float(100 * q + r))
                                      for q in range(n)]), "all_to_all_single uneven")
        even = torch.empty(n * 3, dtype=torch.int32)
        dist.all_to_all_single(even, torch.arange(n * 3, dtype=torch.int32) + 1000 * r)
        assert_equal(even, torch.cat([torch.arange(3 * r, 3 * r + 3, dtype=torch.int32) + 1000 * q
                                      for q in range(n)]), "all_to_all_single even")

    @check("gather_scatter_and_reduce_reach_only_the_root")
    def _():
        root = 1
        gathered = [torch.empty(4) for _ in range(n)] if r == root else None
        dist.gather(torch.full((4, ), float(r)), gathered, dst=root)
        if r == root:
            for q in range(n):
                assert_equal(gathered[q], torch.full((4, ), float(q)), f"gather slot {q}")
        root = n - 1
        out = torch.empty(3, dtype=torch.int64)
        dist.scatter(out, [torch.full((3, ), 7 * q) for q in range(n)] if r == root else None, src=root)
        assert_equal(out, torch.full((3, ), 7 * r), "scatter")
        root = 2 % n
        t = contribution(r, 50, torch.float32)
        dist.reduce(t, dst=root)
        expected = closed_form(dist.ReduceOp.SUM, 50, torch.float32) if r == root else contribution(
            r, 50, torch.float32)
        assert_equal(t, expected, "reduce")

    @check("new_group_with_dicomm_backend_reduces_over_its_members")
    def _():
        members = [1, 3] if n >= 4 else [0, 1]
        group = dist.new_group(members, backend="dicomm")
        if r in members:
            t = torch.full((6, ), float(r))
            dist.all_reduce(t, group=group)
            assert_equal(t, torch.full((6, ), float(sum(members))), "subgroup all_reduce")
            if transport_of(1 - members.index(r), group) != "shm":
                raise AssertionError("local subgroup peers should use shm")

    @check("collective_with_mismatched_sizes_fails_naming_the_op")
    def _():
        # Last: a failed collective leaves the group unusable, as with NCCL.
        t = torch.ones(10 + r)
        try:
            dist.all_gather_into_tensor(torch.empty(n * (10 + r)), t)
        except Exception as e:  # noqa: BLE001
            if "all_gather" not in str(e):
                raise AssertionError(f"error does not name the collective: {e}")
        else:
            raise AssertionError("mismatched all_gather sizes did not fail")


# ---------------------------------------------------------------------------------------------
def job_p2p(args) -> None:
    init()
    r = RANK
    peer = 1 - r

    @check("send_recv_every_dtype")
    def _():
        for dtype in ALL_DTYPES + [torch.complex64]:
            value = (torch.arange(100) % 2 == 0) if dtype == torch.bool else (torch.arange(100) % 100).to(dtype)
            if r == 0:
                dist.send(value, 1)
            else:
                got = torch.zeros_like(value)
                dist.recv(got, 0)
                assert_equal(got, value, f"recv {dtype}")

    @check("send_recv_non_contiguous_tensors")
    def _():
        value = torch.arange(48, dtype=torch.float32).view(6, 8)
        if r == 0:
            dist.send(value.t(), 1)
            dist.send(value[:, 1::3], 1)
        else:
            got = torch.zeros(6, 8).t()
            dist.recv(got, 0)
            assert_equal(got, value.t(), "non-contiguous recv")
            strided = torch.zeros(6, 9)[:, ::3]
            dist.recv(strided, 0)
            assert_equal(strided, value[:, 1::3], "strided recv")

    @check("tags_select_messages_regardless_of_posting_order")
    def _():
        if r == 0:
            works = [dist.isend(torch.full((4, ), 1.0), 1, tag=1), dist.isend(torch.full((4, ), 2.0), 1, tag=2)]
        else:
            two, one = torch.zeros(4), torch.zeros(4)
            works = [dist.irecv(two, 0, tag=2), dist.irecv(one, 0, tag=1)]
        for w in works:
            w.wait()
        if r == 1:
            assert_equal(one, torch.full((4, ), 1.0), "tag 1")
            assert_equal(two, torch.full((4, ), 2.0), "tag 2")

    for batched in (False, True):
        for size in (16, 1 << 20):

            @check(f"pipeline_exchange_in_opposite_orders_{'batched' if batched else 'unbatched'}_{size}")
            def _():
                out = torch.full((size, ), float(r))
                got = torch.empty(size)
                send = dist.P2POp(dist.isend, out, peer)
                recv = dist.P2POp(dist.irecv, got, peer)
                ops = [send, recv] if r == 0 else [recv, send]
                if batched:
                    works = dist.batch_isend_irecv(ops)
                    if len(works) != 1:
                        raise AssertionError(f"a coalesced batch should be one work, got {len(works)}")
                else:
                    works = [op.op(op.tensor, op.peer) for op in ops]
                for w in works:
                    w.wait()
                assert_equal(got, torch.full((size, ), float(peer)), "exchanged tensor")

    @check("batch_of_many_sends_and_receives_in_rank_specific_order")
    def _():
        outs = [torch.full((k + 1, ), float(100 * r + k)) for k in range(8)]
        ins = [torch.empty(k + 1) for k in range(8)]
        ops = [dist.P2POp(dist.isend, outs[k], peer, tag=k) for k in range(8)]
        ops += [dist.P2POp(dist.irecv, ins[k], peer, tag=k) for k in range(8)]
        ops = ops if r == 0 else ops[::-1]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        for k in range(8):
            assert_equal(ins[k], torch.full((k + 1, ), float(100 * peer + k)), f"batched message {k}")

    @check("irecv_future_yields_the_received_tensor")
    def _():
        if r == 0:
            dist.send(torch.arange(6, dtype=torch.float64), 1)
        else:
            got = torch.zeros(6, dtype=torch.float64)
            value = dist.irecv(got, 0).get_future().wait()
            assert_equal(value[0], torch.arange(6, dtype=torch.float64), "future value")

    @check("wait_with_timeout_raises_then_a_later_wait_succeeds")
    def _():
        if r == 1:
            got = torch.zeros(3)
            work = dist.irecv(got, 0, tag=77)
            started = time.monotonic()
            try:
                work.wait(timeout=datetime.timedelta(milliseconds=300))
            except Exception as e:  # noqa: BLE001
                if "timed out" not in str(e) or "recv from rank 0" not in str(e):
                    raise AssertionError(f"unclear timeout error: {e}")
            else:
                raise AssertionError("wait(timeout) returned although nothing was sent")
            if time.monotonic() - started > 2:
                raise AssertionError("wait(timeout) overran its timeout")
            dist.send(torch.ones(1), 0, tag=78)  # now let rank 0 send
            work.wait()
            assert_equal(got, torch.full((3, ), 5.0), "late message")
        else:
            dist.recv(torch.zeros(1), 1, tag=78)
            dist.send(torch.full((3, ), 5.0), 1, tag=77)

    @check("size_mismatch_fails_naming_peer_and_op")
    def _():
        if r == 0:
            work = dist.isend(torch.ones(1 << 17), 1, tag=9)  # 512 KiB: rendezvous, refused by a small buffer
        else:
            work = dist.irecv(torch.zeros(4), 0, tag=9)
        try:
            work.wait()
        except Exception as e:  # noqa: BLE001
            expected = "send to rank 1" if r == 0 else "recv from rank 0"
            if expected not in str(e):
                raise AssertionError(f"error does not name {expected}: {e}")
        else:
            raise AssertionError("mismatched sizes did not fail")

    @check("object_collectives_carry_python_objects")
    def _():
        gathered = [None, None]
        dist.all_gather_object(gathered, {"rank": r, "payload": "x" * (10 + 1000 * r)})
        if [g["rank"] for g in gathered] != [0, 1] or len(gathered[1]["payload"]) != 1010:
            raise AssertionError(f"all_gather_object gave {[(g['rank'], len(g['payload'])) for g in gathered]}")
        objects = [("from", r), list(range(r + 3))]
        dist.broadcast_object_list(objects, src=1)
        if objects != [("from", 1), [0, 1, 2, 3]]:
            raise AssertionError(f"broadcast_object_list gave {objects}")

    @check("local_peer_uses_shm")
    def _():
        if transport_of(peer) != "shm":
            raise AssertionError(f"transport to the local peer is {transport_of(peer)}")


# ---------------------------------------------------------------------------------------------
def job_training(args) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    init(backend="cpu:dicomm")  # the per-device form, as ditorch's "cpu:gloo,dipu:dicomm"
    gloo = dist.new_group(backend="gloo")

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def batches():
        g = torch.Generator().manual_seed(100 + RANK)
        return [(torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)) for _ in range(4)]

    def train(group, zero: bool):
        net = DDP(model(), process_group=group, bucket_cap_mb=0.0001)  # several buckets
        if zero:
            opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, lr=0.01,
                                          process_group=group)
        else:
            opt = torch.optim.Adam(net.parameters(), lr=0.01)
        for x, y in batches():
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in net.parameters()]

    reference = train(gloo, zero=False)

    @check("ddp_with_dicomm_matches_gloo")
    def _():
        ours = train(None, zero=False)
        for a, b in zip(ours, reference):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        if torch.equal(ours[0], model()[0].weight):
            raise AssertionError("training did not change the parameters")

    @check("zero_redundancy_optimizer_with_dicomm_matches_plain_adam_over_gloo")
    def _():
        ours = train(None, zero=True)
        for a, b in zip(ours, reference):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
def expect_failure(name: str, wait, since: float, otherwise: str) -> None:
    """`wait()` must raise: its first line and the seconds since `since` go to findings as `name`'s."""
    try:
        wait()
    except Exception as e:  # noqa: BLE001
        findings[f"{name}_error"] = str(e).splitlines()[0]
        findings[f"{name}_seconds"] = time.monotonic() - since
    else:
        raise AssertionError(otherwise)


def job_killed_peer(args) -> None:
    init(timeout_s=60)
    dist.barrier()
    if RANK == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    recv = dist.irecv(torch.zeros(4), 1)
    reduce = dist.all_reduce(torch.ones(4), async_op=True)
    started = time.monotonic()
    for name, work in (("recv", recv), ("all_reduce", reduce)):

        @check(f"{name}_fails_when_the_peer_dies")
        def _():
            expect_failure(name, work.wait, started, "completed although the peer was killed")


def job_timeout(args) -> None:
    init(timeout_s=args["timeout_s"])
    dist.barrier()
    if RANK == 1:
        time.sleep(args["timeout_s"] * 3)  # alive but silent
        return
    for name, start in (("recv", lambda: dist.irecv(torch.zeros(4), 1)),
                        ("all_reduce", lambda: dist.all_reduce(torch.ones(4), async_op=True))):

        @check(f"{name}_fails_after_the_timeout")
        def _():
            expect_failure(name, lambda: start().wait(), time.monotonic(),
                           "completed although the peer never took part")


def job_dipu_p2p(args) -> None:
    """dipu tensors (the host vendor's discrete profile) through dist.send/recv, counting the vendor's
    copies by kind around the transfers; args["staged"] names the copies expected (none when
    device-direct)."""
    from ditorch.dipu import memory_ipc
    init()
    sizes = [1024, 1 << 18]  # float32 elements: 4 KiB and 1 MiB
    sources = [torch.arange(n, dtype=torch.float32).to("dipu") for n in sizes]
    targets = [torch.zeros(n, dtype=torch.float32, device="dipu") for n in sizes]
    dist.barrier()
    before = memory_ipc.copy_counts()
    for source, target in zip(sources, targets):
        if RANK == 0:
            dist.send(source, 1)
        else:
            dist.recv(target, 0)
    copies = {kind: count - before[kind] for kind, count in memory_ipc.copy_counts().items()}

    @check("dipu_tensors_arrive_intact")
    def _():
        if RANK == 1:
            for target, n in zip(targets, sizes):
                assert_equal(target.cpu(), torch.arange(n, dtype=torch.float32), f"{n} elements")

    @check("vendor_copies_are_the_expected_ones")
    def _():
        staged = {"host_to_device": 0, "device_to_host": 0}
        if args["staged"]:
            staged["device_to_host" if RANK == 0 else "host_to_device"] = len(sizes)
        got = {kind: copies[kind] for kind in staged}
        assert got == staged, f"rank {RANK}: staging copies {got}, expected {staged} (all copies: {copies})"


def job_mixed_vendor_p2p(args) -> None:
    """Each rank's dipu device on its own vendor (args["vendors"][rank], chosen before the device opens):
    dipu tensors through dist.send/recv on the dicomm backend, staged through host memory."""
    os.environ["DIPU_VENDOR"] = args["vendors"][RANK]
    import ditorch.dipu as dipu
    from ditorch.dipu import memory_ipc

    dipu.use_vendor(args["vendors"][RANK])
    init()
    sizes = [1024, 1 << 16]
    sources = [torch.arange(n, dtype=torch.float32).to("dipu") for n in sizes]
    targets = [torch.zeros(n, dtype=torch.float32, device="dipu") for n in sizes]
    dist.barrier()
    before = memory_ipc.copy_counts()
    for source, target in zip(sources, targets):
        if RANK == 0:
            dist.send(source, 1)
        else:
            dist.recv(target, 0)
    after = memory_ipc.copy_counts()

    @check("each_rank_runs_its_vendor")
    def _():
        assert dipu.vendor_name() == args["vendors"][RANK], dipu.vendor_name()

    @check("dipu_tensors_arrive_intact")
    def _():
        if RANK == 1:
            for target, n in zip(targets, sizes):
                assert_equal(target.cpu(), torch.arange(n, dtype=torch.float32), f"{n} elements")

    @check("the_host_vendor_rank_staged_its_sends")
    def _():
        if args["vendors"][RANK] == "host":
            staged = after["device_to_host"] - before["device_to_host"]
            assert staged == len(sizes), f"rank {RANK}: {staged} device-to-host copies, expected {len(sizes)}"


def main(rank: int, world_size: int, job: str, args: dict) -> dict:
    """One rank of `job`; its findings. (The rank exits at once after returning: a dead or silent
    peer cannot make the exit wait for its pending operations.)"""
    global RANK, WORLD
    RANK, WORLD = rank, world_size
    globals()[f"job_{job}"](args)
    if job not in ("killed_peer", "timeout"):
        dist.destroy_process_group()
    return findings


def run_job(job: str, world_size: int, timeout: float = 90, env: dict | None = None, **args) -> list[dict]:
    """Each rank's findings, in rank order; `env`: extra environment variables of every rank."""
    return run_ranks(main, world_size, (job, args), env={"OMP_NUM_THREADS": "1", **(env or {})}, timeout=timeout)


def start_job(job: str, world_size: int, **args) -> RankJob:
    """The job's ranks, for a test in which a rank dies on purpose; use it in a `with` block."""
    return start_ranks(main, world_size, (job, args), env={"OMP_NUM_THREADS": "1"})


def assert_passed_on_every_rank(ranks: list[dict], name: str) -> None:
    """Every rank ran the check `name`, and it passed."""
    for rank, findings in enumerate(ranks):
        assert name in findings, f"rank {rank} did not run {name}"
        assert findings[name] is None, f"rank {rank}: {findings[name]}"
