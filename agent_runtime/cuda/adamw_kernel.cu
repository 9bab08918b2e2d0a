#include <cstdint>

#include "agent_runtime/cuda/adamw_kernel.h"

namespace agentrt::cuda {
namespace {

constexpr int kThreads = 256;

// The grid-stride loop: body(i) for each of this thread's indices in [0, n).
template <typename Body>
__device__ __forceinline__ void ForEachIndex(size_t n, Body body) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    body(i);
  }
}

__device__ __forceinline__ void AdamWOne(float& p, float g, float& m, float& v,
                                         const AdamWScalars& s, float decay) {
  g *= s.grad_scale;
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float denom = sqrtf(v) * s.inv_bias_corr2_sqrt + s.eps;
  p = p * decay - s.step_size * m / denom;
}

// Four elements per thread through 16-byte loads; the caller guarantees alignment.
__global__ void AdamWVec4(float4* __restrict__ p, const float4* __restrict__ g,
                          float4* __restrict__ m, float4* __restrict__ v, size_t n4,
                          AdamWScalars s) {
  const float decay = 1.0f - s.lr * s.weight_decay;
  ForEachIndex(n4, [&](size_t i) {
    float4 pp = p[i];
    const float4 gg = g[i];
    float4 mm = m[i];
    float4 vv = v[i];
    AdamWOne(pp.x, gg.x, mm.x, vv.x, s, decay);
    AdamWOne(pp.y, gg.y, mm.y, vv.y, s, decay);
    AdamWOne(pp.z, gg.z, mm.z, vv.z, s, decay);
    AdamWOne(pp.w, gg.w, mm.w, vv.w, s, decay);
    p[i] = pp;
    m[i] = mm;
    v[i] = vv;
  });
}

__global__ void AdamWScalar(float* __restrict__ p, const float* __restrict__ g,
                            float* __restrict__ m, float* __restrict__ v, size_t n,
                            AdamWScalars s) {
  const float decay = 1.0f - s.lr * s.weight_decay;
  ForEachIndex(n, [&](size_t i) { AdamWOne(p[i], g[i], m[i], v[i], s, decay); });
}

__global__ void SquaredNormKernel(const float* __restrict__ x, size_t n, double* out) {
  __shared__ double partial[kThreads];
  double acc = 0.0;
  ForEachIndex(n, [&](size_t i) {
    const double xi = x[i];
    acc += xi * xi;
  });
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}

int GridFor(size_t work) {
  // Enough blocks to fill the device several times over; the loops stride the rest.
  static int max_blocks = [] {
    int device = 0;
    int sms = 132;
    if (cudaGetDevice(&device) == cudaSuccess) {
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    }
    return sms * 8;
  }();
  const size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < static_cast<size_t>(max_blocks) ? (blocks > 0 ? blocks : 1)
                                                                   : max_blocks);
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

cudaError_t LaunchAdamW(float* params, const float* grads, float* m, float* v, size_t n,
                        const AdamWScalars& s, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  size_t head = 0;
  if (Aligned16(params) && Aligned16(grads) && Aligned16(m) && Aligned16(v)) {
    const size_t n4 = n / 4;
    if (n4 > 0) {
      AdamWVec4<<<GridFor(n4), kThreads, 0, stream>>>(
          reinterpret_cast<float4*>(params), reinterpret_cast<const float4*>(grads),
          reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v), n4, s);
    }
    head = n4 * 4;
  }
  if (head < n) {
    AdamWScalar<<<GridFor(n - head), kThreads, 0, stream>>>(params + head, grads + head, m + head,
                                                            v + head, n - head, s);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSquaredNorm(const float* x, size_t n, double* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SquaredNormKernel<<<GridFor(n), kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

}  // namespace agentrt::cuda
