# `cmake --install <build> --prefix <prefix>` installs what a project outside
# this tree needs to embed agentrt (examples/custom_env is the worked example):
#
#   <prefix>/bin/                      agentctl, agent-worker, agentrt-bus
#   <prefix>/lib/                      libagentrt_{common,comms,runtime,envs,learners}.a
#   <prefix>/include/agentrt/<module>/ the public headers, included as "agent_runtime/runtime.h"
#   <prefix>/lib/cmake/agentrt/        agentrtConfig.cmake + agentrtTargets.cmake
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
foreach(module common plan comms runtime envs learners)
  if(TARGET agentrt_${module})
    list(APPEND _agentrt_export_targets agentrt_${module})
  endif()
endforeach()
# NCCL::nccl is an alias of our own interface target (cmake/deps.cmake): an
# alias cannot be exported, so the real target travels in the export set.
if(AGENTRT_HAVE_CUDA AND TARGET agentrt_nccl)
  list(APPEND _agentrt_export_targets agentrt_nccl)
  set_target_properties(agentrt_nccl PROPERTIES EXPORT_NAME nccl)
endif()

install(TARGETS ${_agentrt_export_targets} EXPORT agentrtTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT agentrtTargets NAMESPACE agentrt:: DESTINATION ${AGENTRT_CMAKE_INSTALL_DIR})

# Headers: every module header of the installed libraries, at the same relative
# path as in the source tree, plus the generated protobuf/gRPC headers of comms.
foreach(module common plan comms agent_runtime envs learners)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${module}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/agentrt/${module}
          FILES_MATCHING PATTERN "*.h"
          PATTERN "cuda" EXCLUDE)
endforeach()
install(DIRECTORY ${PROJECT_BINARY_DIR}/comms/proto/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/agentrt/comms/proto
        FILES_MATCHING PATTERN "*.pb.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/comms/proto/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/agentrt/comms/proto
        FILES_MATCHING PATTERN "*.proto")

# Programs: the controller, the default agent and the standalone bus.
foreach(tool agentctl agent-worker agentrt-bus)
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
