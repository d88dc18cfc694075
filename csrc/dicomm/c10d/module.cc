// dicomm._dicomm_c10d: creates the "dicomm" Backend for torch.distributed (the Python side
// registers it in dicomm/torch_backend.py).
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <utility>

#include "process_group.h"

namespace py = pybind11;

namespace {

dicomm::ProcessGroupDiComm& asDiComm(const c10::intrusive_ptr<c10d::Backend>& backend) {
  auto* dicomm_backend = dynamic_cast<dicomm::ProcessGroupDiComm*>(backend.get());
  TORCH_CHECK(dicomm_backend, "expected a dicomm backend, got ", backend->getBackendName());
  return *dicomm_backend;
}

}  // namespace

PYBIND11_MODULE(_dicomm_c10d, m) {
  m.doc() = "The dicomm torch.distributed backend (c10d Backend over the DiComm engine)";
  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
         const std::map<int, std::pair<double, double>>& peer_links,
         std::optional<std::map<std::string, uintptr_t>> device_memory) {
        std::map<int, dicomm::LinkShape> shapes;
        for (const auto& [peer, link] : peer_links) shapes[peer] = dicomm::LinkShape{link.first, link.second};
        auto memory = device_memory ? dicomm::DeviceMemory::fromAddresses(*device_memory) : nullptr;
        py::gil_scoped_release release;
        return c10::intrusive_ptr<c10d::Backend>(c10::make_intrusive<dicomm::ProcessGroupDiComm>(
            store, rank, size,
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_s)),
            std::move(shapes), std::move(memory)));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
      py::arg("peer_links") = std::map<int, std::pair<double, double>>(), py::arg("device_memory") = py::none(),
      "Joins rank `rank` of `size` through `store`; blocks until every peer is connected or `timeout_s` passes. "
      "`peer_links`: {group rank: (bytes per second, one-way latency in seconds)} of emulated links. "
      "`device_memory`: the functions reaching PrivateUse1 tensors' memory (device-direct point-to-point).");
  m.def(
      "transport_of",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, int peer) { return asDiComm(backend).transportOf(peer); },
      py::arg("backend"), py::arg("peer"), "The transport (shm, tcp, ibverbs) a dicomm backend uses to reach `peer`.");
}
