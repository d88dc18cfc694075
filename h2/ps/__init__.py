"""Di-PS (runtime layer, a sibling of heteropp): asynchronous training of one model by several
clusters through a parameter server split into a master (control flow over gRPC: clusters, tickets,
heartbeats, the penalty's verdict, no model bytes) and shard servers (data flow over ZeroMQ: the
global model's layers and their outer optimizer, one thread per layer), plus the cluster's client
and the outer-loop simulator at the paper's scale.

Owns: penalty (the pseudo-gradient penalty's arithmetic), outer (the outer optimizer), layout (layers
and their wire form), wire (data-flow frames), auth (the run's secret, participants' credentials, signed
calls, CURVE keys), rpc (signed control-flow calls), datapath (ZeroMQ push/pull over CURVE),
shard, master, client, supervisor (the local launcher's process keeper), simulator.
May import h2.core, h2.model and h2.data; never h2.train, h2.cli or heteropp.
"""
