/* DIPU vendor runtime ABI, optional part: device memory another process or a NIC can reach.
 *
 * A vendor exports these with C linkage when its device memory can be shared; a vendor that
 * cannot leaves them out (callers look them up with dlsym and fall back to host staging), or
 * returns dipuErrorNotSupported for the allocations it cannot share.
 *
 * - A memory handle (like CUDA IPC) names a byte range of one live allocation. Another process
 *   on the same host opens it and gets a device pointer of its own to that range, which the
 *   vendor's copies accept (dipuMemcpy with dipuMemcpyDeviceToDevice, ...to host, ...from host).
 *   Opening verifies the handle: it must come from `expected_owner` (a process id; -1: any),
 *   name memory of that process that is still allocated, and lie inside that allocation. Any
 *   other handle is refused with dipuErrorInvalidValue and a one-line dipuGetLastErrorMessage().
 *   Copies through the opened pointer are bounded by the range the handle names.
 * - A dma-buf descriptor (fd + offset, as ibv_reg_dmabuf_mr takes them) lets an RDMA NIC
 *   register the range. The caller owns (and closes) the returned fd.
 */
#ifndef DIPU_VENDOR_IPC_H_
#define DIPU_VENDOR_IPC_H_

#include "dipu_vendor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DIPU_IPC_HANDLE_BYTES 64
#define dipuErrorNotSupported ((dipuError_t)6)

typedef struct {
  uint8_t reserved[DIPU_IPC_HANDLE_BYTES];
} dipuIpcMemHandle_t;

/* A handle to [device_ptr, device_ptr + size), which must lie inside one allocation. */
dipuError_t dipuIpcGetMemHandle(dipuIpcMemHandle_t* handle, void* device_ptr, size_t size);
/* Opens a handle from process `expected_owner` (-1: any): *device_ptr addresses the range in this
 * process, *size is its length. */
dipuError_t dipuIpcOpenMemHandle(void** device_ptr, size_t* size, const dipuIpcMemHandle_t* handle,
                                 int64_t expected_owner);
dipuError_t dipuIpcCloseMemHandle(void* device_ptr);
/* A dma-buf style descriptor of [device_ptr, device_ptr + size): *fd (the caller closes it) and the
 * range's *offset inside it. */
dipuError_t dipuMemGetDmaBuf(void* device_ptr, size_t size, int* fd, uint64_t* offset);

#ifdef __cplusplus
}
#endif

#endif /* DIPU_VENDOR_IPC_H_ */
