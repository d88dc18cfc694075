"""An in-process Di-PS run for tests: the master and its shard servers as threads of the test process."""

from __future__ import annotations

import contextlib

from h2.core.dips import ClusterSpec, DipsConfig, OuterOptions, check_dips_config
from h2.core.training import TrainConfig
from h2.ps.master import Master
from h2.ps.shard import ShardServer


@contextlib.contextmanager
def running_ps(out_dir, *, clusters=("a", "b"), shards=2, **fields):
    config = DipsConfig(out=str(out_dir), shards=shards, clusters=[ClusterSpec(id=c) for c in clusters],
                        heartbeat_s=0.2, train=TrainConfig(steps=8, checkpoint_every=0), **fields)
    check_dips_config(config, "test")
    master = Master(config, "test.yaml", port=0)
    address = f"127.0.0.1:{master.port}"
    servers = [ShardServer(address, index, "127.0.0.1", 0, 0) for index in range(shards)]
    try:
        yield master, servers, address
    finally:
        for server in servers:
            server.close()
        master.close()


__all__ = ["running_ps", "OuterOptions"]
