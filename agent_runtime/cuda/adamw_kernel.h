// The AdamW and squared-norm CUDA kernels (device buffers, float32). Both are
// asynchronous on `stream`; they allocate nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "agent_runtime/adamw.h"

namespace agentrt::cuda {

// The same update as agentrt::AdamWUpdate, element for element.
cudaError_t LaunchAdamW(float* params, const float* grads, float* m, float* v, size_t n,
                        const AdamWScalars& s, cudaStream_t stream);

// Adds the sum of squares of x[0..n) to *out (a device double the caller zeroes).
cudaError_t LaunchSquaredNorm(const float* x, size_t n, double* out, cudaStream_t stream);

}  // namespace agentrt::cuda
