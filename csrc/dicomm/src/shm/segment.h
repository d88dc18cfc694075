// Named POSIX shared memory left in /dev/shm by DiComm builds older than the anonymous segments
// (shm/anonymous_segment.h): those named their rings and doorbells /dicomm-<pid>-..., and a process
// killed during setup left them behind.
#pragma once

namespace dicomm {

// Removes this user's /dev/shm/dicomm-<pid>-* segments whose creating process no longer exists.
// Returns how many it removed.
int removeSegmentsOfDeadProcesses();

}  // namespace dicomm
