# `cmake --install <build> --prefix <prefix>` installs what a project outside
# this tree needs to embed agentrt (examples/custom_env is the worked example):
#
#   <prefix>/bin/                      agentctl, agent-worker, agentrt-bus, agentrt-exec-rank,
#                                      agentrt-preflight
#   <prefix>/lib/                      libagentrt_{common,plan,comms,checkpoint,device,runtime,
#                                      envs,learner_config,learners}.a
#   <prefix>/include/agentrt/<module>/ the public headers (AGENTRT_PUBLIC_HEADERS below),
#                                      included as "agent_runtime/runtime.h"
#   <prefix>/lib/cmake/agentrt/        agentrtConfig.cmake + agentrtTargets.cmake
#   <prefix>/lib/libagentrt_c.so       the C API (include/agentrt/capi/agentrt_c.h)
#   <prefix>/lib/libagentrt_cuda.so    GPU support (CUDA builds), loaded when a GPU is used
#   <prefix>/lib/agentrt/python/       the Python package `agentrt` over it; agentctl
#                                      puts it on the PYTHONPATH of the agents it starts
#
# and then, from the other project:
#
#   find_package(agentrt REQUIRED)     # CMAKE_PREFIX_PATH=<prefix>
#   target_link_libraries(my_trainer PRIVATE agentrt::runtime agentrt::envs)
#
# The export set holds every agentrt target the installed libraries link (the
# static libraries carry their link interface); third-party dependencies are
# found again by agentrtConfig.cmake.
include(CMakePackageConfigHelpers)

set(AGENTRT_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/agentrt)

# Libraries, in dependency order. learners (the reference PPO) is optional for
# embedders but installed so a custom trainer can reuse it.
set(_agentrt_export_targets)
foreach(module common plan comms checkpoint device runtime envs learner_config learners)
  if(TARGET agentrt_${module})
    list(APPEND _agentrt_export_targets agentrt_${module})
  endif()
endforeach()
install(TARGETS ${_agentrt_export_targets} EXPORT agentrtTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT agentrtTargets NAMESPACE agentrt:: DESTINATION ${AGENTRT_CMAKE_INSTALL_DIR})

# Headers: only what an embedder uses: the runtime and its
# checkpointer, group and signals, the bus client, the env interface and pool,
# the plan and agent environment they expose, and the reference PPO for a
# custom trainer. Internal headers (group_internal.h, mpi_group.h, broker.h,
# the CUDA code, the scheduler) are not installed. Each header below is
# self-contained against this set (tests/examples/custom_env_test.sh checks).
set(AGENTRT_PUBLIC_HEADERS
    common/status.h common/clock.h common/group_backend.h
    plan/agent_env.h plan/config.h plan/plan.h plan/records.h plan/run_dir.h
    comms/auth.h comms/bus_client.h comms/bus_types.h comms/telemetry.h comms/weight_stream.h
    agent_runtime/runtime.h agent_runtime/checkpointer.h agent_runtime/group.h
    agent_runtime/signals.h agent_runtime/sharded_adam.h agent_runtime/adamw.h
    agent_runtime/flight_recorder.h agent_runtime/bandwidth.h
    envs/env.h envs/space.h envs/rng.h envs/params.h envs/env_pool.h envs/chunk_runner.h
    envs/multi_agent_env_pool.h envs/registry.h envs/world_sides.h
    envs/single_agent_view.h
    learners/ppo.h learners/ppo_config.h learners/ppo_trainer.h learners/policy_snapshot.h learners/actor_critic.h
    learners/obs_normalizer.h)
foreach(header ${AGENTRT_PUBLIC_HEADERS})
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/agentrt/${dir})
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/comms/proto/bus.pb.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/agentrt/comms/proto)
install(FILES ${PROJECT_SOURCE_DIR}/comms/proto/bus.proto
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/agentrt/comms/proto)

# The C API and the Python package over it (python/CMakeLists.txt).
if(TARGET agentrt_c)
  install(TARGETS agentrt_c LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/capi/agentrt_c.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/agentrt/capi)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/agentrt
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/agentrt/python
          FILES_MATCHING PATTERN "*.py" PATTERN "*.pyi" PATTERN "py.typed"
          PATTERN "__pycache__" EXCLUDE)
endif()

# GPU support: the static libraries link neither CUDA nor NCCL; the runtime
# loads this library (beside the program, ../lib, or the linker's path).
if(TARGET agentrt_cuda)
  install(TARGETS agentrt_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

# Programs: the controller, the default agent and the standalone bus.
foreach(tool agentctl agent-worker agentrt-bus agentrt-exec-rank agentrt-preflight)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/agentrtConfig.cmake.in
    ${PROJECT_BINARY_DIR}/agentrtConfig.cmake
    INSTALL_DESTINATION ${AGENTRT_CMAKE_INSTALL_DIR}
    PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/agentrtConfigVersion.cmake
    COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/agentrtConfig.cmake ${PROJECT_BINARY_DIR}/agentrtConfigVersion.cmake
        DESTINATION ${AGENTRT_CMAKE_INSTALL_DIR})
