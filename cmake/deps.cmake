# Every third-party dependency of agentrt is found here, and only here.
# Debian 12 package names are given next to each; `scripts/setup.sh` installs them.

find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

# gRPC + Protobuf: libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
find_package(Protobuf REQUIRED)
pkg_check_modules(GRPCPP REQUIRED IMPORTED_TARGET grpc++)
find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

# ZeroMQ: libzmq3-dev cppzmq-dev
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
find_path(CPPZMQ_INCLUDE_DIR zmq.hpp REQUIRED)

# yaml-cpp: libyaml-cpp-dev
find_package(yaml-cpp REQUIRED)
if(NOT TARGET yaml-cpp::yaml-cpp)
  add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)
endif()

# Open MPI: libopenmpi-dev openmpi-bin
find_package(MPI REQUIRED COMPONENTS CXX)

# JSON, command lines, formatting, linear algebra:
# nlohmann-json3-dev libcli11-dev libfmt-dev libeigen3-dev
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)

# simdjson (metrics.jsonl read without a JSON document per line: the dashboard's curves, export): libsimdjson-dev
find_package(simdjson REQUIRED)

# ISA-L (the one CRC32C, common/crc32c.h: checkpoints, the bus log, large payloads; SSE4.2/AVX-512 dispatched): libisal-dev
pkg_check_modules(ISAL REQUIRED IMPORTED_TARGET libisal)

# zstd (weight streams' delta versions, comms/weight_stream.cc): libzstd-dev
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)

# cpp-httplib (the dashboard's HTTP server): libcpp-httplib-dev
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

# OpenSSL (HMAC for bus credentials): libssl-dev, pulled in by libgrpc++-dev
find_package(OpenSSL REQUIRED)

# Catch2 v2 (Debian 12): catch2
if(AGENTRT_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()

# CUDA + NCCL: optional, looked for under /usr/local/cuda. GPU code is compiled
# whenever both are found, whether or not this machine has a GPU.
set(AGENTRT_HAVE_CUDA OFF)
if(AGENTRT_WITH_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS /usr/local/cuda/lib /usr/local/cuda/lib64)
  if(CMAKE_CUDA_COMPILER AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)   # Hopper (H100/H200); PTX JIT covers newer parts
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    add_library(agentrt_nccl INTERFACE)
    target_include_directories(agentrt_nccl SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(agentrt_nccl INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
    add_library(NCCL::nccl ALIAS agentrt_nccl)
    set(AGENTRT_HAVE_CUDA ON)
    message(STATUS "agentrt: CUDA ${CMAKE_CUDA_COMPILER_VERSION} and NCCL found; GPU code is built")
  else()
    message(STATUS "agentrt: CUDA/NCCL not found; GPU code is not built")
  endif()
endif()
