# Installs the embeddable runtime so that a project outside this tree can do
# `find_package(agentrt)` and link `agentrt::runtime` (see examples/custom_env).
# Modules add themselves to AGENTRT_INSTALL_TARGETS / AGENTRT_INSTALL_HEADER_DIRS
# through agentrt_install_module() below.
include(CMakePackageConfigHelpers)
get_property(_targets GLOBAL PROPERTY AGENTRT_INSTALL_TARGETS)
if(_targets)
  install(TARGETS ${_targets} EXPORT agentrtTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(EXPORT agentrtTargets NAMESPACE agentrt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/agentrt)
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/agentrtConfig.cmake.in
      ${PROJECT_BINARY_DIR}/agentrtConfig.cmake
      INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/agentrt)
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/agentrtConfigVersion.cmake
      COMPATIBILITY SameMajorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/agentrtConfig.cmake ${PROJECT_BINARY_DIR}/agentrtConfigVersion.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/agentrt)
endif()
