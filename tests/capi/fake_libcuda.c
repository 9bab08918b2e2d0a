/* An empty libcuda.so.1: where it loads, agentrt takes the machine for one
 * with an NVIDIA driver (device::DriverPresent) and loads its device API,
 * here fake_cuda_library.cc's. */
int agentrt_fake_libcuda;
