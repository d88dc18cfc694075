// Built when the libibverbs/librdmacm headers were missing: ibverbs is reported as absent.
#include "dicomm/transport.h"

namespace dicomm {

IbverbsProbe probeIbverbs() {
  IbverbsProbe probe;
  probe.message = "ibverbs: not compiled in (libibverbs/librdmacm headers were missing at build time)";
  return probe;
}

std::unique_ptr<Transport> makeIbverbsTransport(const Options&) { throw CommError(probeIbverbs().message); }

}  // namespace dicomm
