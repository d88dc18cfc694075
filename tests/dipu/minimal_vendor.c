/* A vendor with the runtime ABI and no DIOPI kernels: one host-accessible device backed by malloc.
 * Built by the tests at run time to show that a new vendor needs no rebuild of the shim and that
 * every operator it lacks runs through the CPU fallback. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dipu_vendor.h"

struct dipuStream_st { int unused; };
struct dipuEvent_st { double ms; };

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

const char* dipuVendorName(void) { return "minimal"; }
int32_t dipuVendorAbiVersion(void) { return DIPU_VENDOR_ABI_VERSION; }
const char* dipuGetErrorString(dipuError_t error) { return error == dipuSuccess ? "success" : "failure"; }
const char* dipuGetLastErrorMessage(void) { return ""; }
dipuError_t dipuGetDeviceCount(int32_t* count) { *count = 1; return dipuSuccess; }
dipuError_t dipuSetDevice(int32_t device) { return device == 0 ? dipuSuccess : dipuErrorInvalidDevice; }
dipuError_t dipuGetDevice(int32_t* device) { *device = 0; return dipuSuccess; }
dipuError_t dipuGetDeviceProperties(int32_t device, dipuDeviceProperties_t* p) {
  memset(p, 0, sizeof(*p));
  strcpy(p->name, "minimal test device");
  p->total_memory = 1ull << 30;
  p->compute_units = 1;
  p->host_accessible = 1;
  p->relative_speed = 1.0;
  return device == 0 ? dipuSuccess : dipuErrorInvalidDevice;
}
dipuError_t dipuMemGetInfo(int32_t device, size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = 1ull << 30;
  return dipuSuccess;
}
dipuError_t dipuDeviceSynchronize(void) { return dipuSuccess; }
dipuError_t dipuMalloc(void** ptr, size_t size) { *ptr = aligned_alloc(64, (size + 63) / 64 * 64); return dipuSuccess; }
dipuError_t dipuFree(void* ptr) { free(ptr); return dipuSuccess; }
dipuError_t dipuMallocHost(void** ptr, size_t size) { return dipuMalloc(ptr, size); }
dipuError_t dipuFreeHost(void* ptr) { free(ptr); return dipuSuccess; }
int32_t dipuIsPinnedHostPointer(const void* ptr) { return 0; }
dipuError_t dipuMemset(void* ptr, int32_t value, size_t size) { memset(ptr, value, size); return dipuSuccess; }
dipuError_t dipuMemcpy(void* dst, const void* src, size_t size, dipuMemcpyKind_t kind) {
  memmove(dst, src, size);
  return dipuSuccess;
}
dipuError_t dipuMemcpyAsync(void* dst, const void* src, size_t size, dipuMemcpyKind_t kind, dipuStream_t s) {
  return dipuMemcpy(dst, src, size, kind);
}
dipuError_t dipuStreamCreate(dipuStream_t* s) { *s = calloc(1, sizeof(**s)); return dipuSuccess; }
dipuError_t dipuStreamDestroy(dipuStream_t s) { free(s); return dipuSuccess; }
dipuError_t dipuStreamSynchronize(dipuStream_t s) { return dipuSuccess; }
dipuError_t dipuStreamQuery(dipuStream_t s) { return dipuSuccess; }
dipuError_t dipuStreamWaitEvent(dipuStream_t s, dipuEvent_t e) { return dipuSuccess; }
dipuError_t dipuEventCreate(dipuEvent_t* e) { *e = calloc(1, sizeof(**e)); return dipuSuccess; }
dipuError_t dipuEventDestroy(dipuEvent_t e) { free(e); return dipuSuccess; }
dipuError_t dipuEventRecord(dipuEvent_t e, dipuStream_t s) { e->ms = now_ms(); return dipuSuccess; }
dipuError_t dipuEventSynchronize(dipuEvent_t e) { return dipuSuccess; }
dipuError_t dipuEventQuery(dipuEvent_t e) { return dipuSuccess; }
dipuError_t dipuEventElapsedTime(float* ms, dipuEvent_t start, dipuEvent_t end) {
  *ms = (float)(end->ms - start->ms);
  return dipuSuccess;
}
