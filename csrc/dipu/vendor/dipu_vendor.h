/* DIPU vendor runtime ABI.
 *
 * A vendor is a shared library exporting the functions below with C linkage. The DIPU shim
 * (ditorch/dipu/_C) opens it at run time (DIPU_VENDOR=<name or path>) and talks to the chip
 * only through these entry points, so a new vendor needs no rebuild of the shim.
 *
 * Conventions: every call returns a dipuError_t; device memory is addressed by opaque pointers
 * that the CPU must not dereference unless dipuDeviceProperties_t.host_accessible is set;
 * a NULL dipuStream_t is the device's default stream. Streams execute in order; work on
 * different streams may overlap; events mark a point in a stream.
 */
#ifndef DIPU_VENDOR_H_
#define DIPU_VENDOR_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DIPU_VENDOR_ABI_VERSION 1

typedef enum {
  dipuSuccess = 0,
  dipuErrorInvalidValue = 1,
  dipuErrorInvalidDevice = 2,
  dipuErrorOutOfMemory = 3,
  dipuErrorNotReady = 4,
  dipuErrorInitialization = 5,
  dipuErrorUnknown = 99,
} dipuError_t;

typedef enum {
  dipuMemcpyHostToDevice = 0,
  dipuMemcpyDeviceToHost = 1,
  dipuMemcpyDeviceToDevice = 2,
} dipuMemcpyKind_t;

typedef struct dipuStream_st* dipuStream_t;
typedef struct dipuEvent_st* dipuEvent_t;

typedef struct {
  char name[128];
  uint64_t total_memory; /* bytes of device memory (the capacity) */
  int32_t compute_units;
  int32_t host_accessible; /* 1: the CPU may read and write device pointers directly */
  double relative_speed;   /* kernel throughput relative to the host CPU (1.0 = same) */
  int32_t major;
  int32_t minor;
} dipuDeviceProperties_t;

/* Identity */
const char* dipuVendorName(void);
int32_t dipuVendorAbiVersion(void);
const char* dipuGetErrorString(dipuError_t error);
/* Detail of the last failure on the calling thread, or "" (for example the profile error). */
const char* dipuGetLastErrorMessage(void);

/* Devices */
dipuError_t dipuGetDeviceCount(int32_t* count);
dipuError_t dipuSetDevice(int32_t device);
dipuError_t dipuGetDevice(int32_t* device);
dipuError_t dipuGetDeviceProperties(int32_t device, dipuDeviceProperties_t* properties);
dipuError_t dipuMemGetInfo(int32_t device, size_t* free_bytes, size_t* total_bytes);
dipuError_t dipuDeviceSynchronize(void);

/* Memory: device allocations belong to the current device. */
dipuError_t dipuMalloc(void** ptr, size_t size);
dipuError_t dipuFree(void* ptr);
dipuError_t dipuMallocHost(void** ptr, size_t size);
dipuError_t dipuFreeHost(void* ptr);
/* 1 if ptr lies inside a block from dipuMallocHost, else 0. */
int32_t dipuIsPinnedHostPointer(const void* ptr);
dipuError_t dipuMemset(void* device_ptr, int32_t value, size_t size);
dipuError_t dipuMemcpy(void* dst, const void* src, size_t size, dipuMemcpyKind_t kind);
dipuError_t dipuMemcpyAsync(void* dst, const void* src, size_t size, dipuMemcpyKind_t kind, dipuStream_t stream);

/* Streams */
dipuError_t dipuStreamCreate(dipuStream_t* stream);
dipuError_t dipuStreamDestroy(dipuStream_t stream);
dipuError_t dipuStreamSynchronize(dipuStream_t stream);
dipuError_t dipuStreamQuery(dipuStream_t stream); /* dipuSuccess when idle, else dipuErrorNotReady */
dipuError_t dipuStreamWaitEvent(dipuStream_t stream, dipuEvent_t event);

/* Events */
dipuError_t dipuEventCreate(dipuEvent_t* event);
dipuError_t dipuEventDestroy(dipuEvent_t event);
dipuError_t dipuEventRecord(dipuEvent_t event, dipuStream_t stream);
dipuError_t dipuEventSynchronize(dipuEvent_t event);
dipuError_t dipuEventQuery(dipuEvent_t event);
dipuError_t dipuEventElapsedTime(float* milliseconds, dipuEvent_t start, dipuEvent_t end);

/* Optional: a vendor that emulates a chip's speed on other hardware may export this; the shim looks
 * it up by name, so a vendor without it still loads (same ABI version). How well the emulated kernel
 * times were kept since the device opened: `kernels` paced, the emulated seconds they were meant to
 * take, and the `late_kernels` that finished after their emulated time, late by `overrun_s` in all
 * (the host was too busy to run them in time). */
typedef struct {
  uint64_t kernels;
  uint64_t late_kernels;
  double emulated_s;
  double overrun_s;
} dipuPacingStats_t;
dipuError_t dipuGetPacingStats(dipuPacingStats_t* stats);

/* Optional, looked up by name like dipuGetPacingStats: one line saying what the device is beyond its
 * properties (for OpenCL: platform, device, driver), written into text[size]. */
dipuError_t dipuGetDeviceDescription(int32_t device, char* text, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* DIPU_VENDOR_H_ */
