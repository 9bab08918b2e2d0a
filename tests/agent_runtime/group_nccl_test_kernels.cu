// A kernel that holds a stream until the host sets a flag: it makes a
// collective queued behind it "never complete" for the abort-path test.
#include <cuda_runtime.h>

namespace agentrt::testing {

__global__ void SpinUntil(volatile int* flag) {
  while (*flag == 0) {
    __nanosleep(1000);
  }
}

cudaError_t LaunchSpinUntil(volatile int* device_flag, cudaStream_t stream) {
  SpinUntil<<<1, 1, 0, stream>>>(device_flag);
  return cudaGetLastError();
}

}  // namespace agentrt::testing
