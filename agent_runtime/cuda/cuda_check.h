// CUDA and NCCL error translation for agent_runtime/cuda/ (one place, keeping
// the call site, as NCCL's NCCLCHECK). Include only from CUDA-built sources.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "common/status.h"

namespace agentrt::cuda {

inline Status CudaStatus(cudaError_t err, const char* call, const char* file, int line,
                         const std::string& where) {
  return Internal(where + ": " + call + " failed at " + file + ":" + std::to_string(line) + ": " +
                  cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

inline Status NcclStatus(ncclResult_t res, const char* call, const char* file, int line,
                         const std::string& where) {
  return Internal(where + ": " + call + " failed at " + file + ":" + std::to_string(line) + ": " +
                  ncclGetErrorString(res));
}

}  // namespace agentrt::cuda

// Returns a Status naming the call, file:line and `where` when `call` fails.
#define AGENTRT_CUDA_CHECK(call, where)                                                        \
  do {                                                                                         \
    const cudaError_t _agentrt_cuda_err = (call);                                              \
    if (_agentrt_cuda_err != cudaSuccess) {                                                    \
      return ::agentrt::cuda::CudaStatus(_agentrt_cuda_err, #call, __FILE__, __LINE__, where); \
    }                                                                                          \
  } while (false)

#define AGENTRT_NCCL_CHECK(call, where)                                                        \
  do {                                                                                         \
    const ncclResult_t _agentrt_nccl_res = (call);                                             \
    if (_agentrt_nccl_res != ncclSuccess && _agentrt_nccl_res != ncclInProgress) {             \
      return ::agentrt::cuda::NcclStatus(_agentrt_nccl_res, #call, __FILE__, __LINE__, where); \
    }                                                                                          \
  } while (false)
