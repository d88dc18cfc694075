// Run-time probe: is there an RDMA device with an active port?
#include <infiniband/verbs.h>

#include "dicomm/transport.h"

namespace dicomm {

IbverbsProbe probeIbverbs() {
  IbverbsProbe probe;
  probe.compiled = true;
  int count = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  if (!devices || count == 0) {
    if (devices) ibv_free_device_list(devices);
    probe.message = "ibverbs: no RDMA device found (libibverbs lists none); falling back to shm/tcp";
    return probe;
  }
  for (int i = 0; i < count && !probe.available; ++i) {
    ibv_context* context = ibv_open_device(devices[i]);
    if (!context) continue;
    ibv_device_attr attr{};
    if (ibv_query_device(context, &attr) == 0) {
      for (uint8_t port = 1; port <= attr.phys_port_cnt; ++port) {
        ibv_port_attr port_attr{};
        if (ibv_query_port(context, port, &port_attr) == 0 && port_attr.state == IBV_PORT_ACTIVE) {
          probe.available = true;
          probe.device = ibv_get_device_name(devices[i]);
          break;
        }
      }
    }
    ibv_close_device(context);
  }
  probe.message = probe.available ? "ibverbs: using device " + probe.device
                                  : "ibverbs: " + std::to_string(count) +
                                        " RDMA device(s) but no active port; falling back to shm/tcp";
  ibv_free_device_list(devices);
  return probe;
}

}  // namespace dicomm
