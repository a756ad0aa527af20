# Install rules and the exported CMake package (included at the end of the top-level
# CMakeLists.txt, once every target exists):
#
#   cmake --install build --prefix /opt/retry-budget
#   # in a worker project: find_package(retrybudget) + retrybudget::client
#
# Installs the server and budgetctl binaries, the client, retry, proto and common libraries,
# their public headers, the generated headers those include, the .proto files, and
# lib/cmake/retrybudget/{retrybudgetConfig,retrybudgetConfigVersion,retrybudgetTargets}.cmake.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(RETRYBUDGET_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/retrybudget)

# ---- binaries ----
install(TARGETS retry-budget-server RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
if(TARGET budgetctl)
  install(TARGETS budgetctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
endif()

# ---- libraries: names in the package are retrybudget::<EXPORT_NAME> ----
set(_rb_exported retrybudget_common retrybudget_proto)
foreach(_t IN ITEMS retrybudget_client retrybudget_client_metrics retrybudget_retry
                    retrybudget_retry_grpc)
  if(TARGET ${_t})
    list(APPEND _rb_exported ${_t})
  endif()
endforeach()
foreach(_t IN LISTS _rb_exported)
  string(REPLACE "retrybudget_" "" _name ${_t})
  set_target_properties(${_t} PROPERTIES EXPORT_NAME ${_name})
endforeach()
# The generated headers live in the build tree; installed, they sit under include/.
target_include_directories(retrybudget_proto PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS ${_rb_exported}
  EXPORT retrybudgetTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# ---- headers ----
install(DIRECTORY ${PROJECT_SOURCE_DIR}/common/include/retrybudget
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.h")
if(TARGET retrybudget_client)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/cpp/include/retrybudget
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.h")
endif()
# retrybudget/client_testing.h includes retrybudget/v1/budget.grpc.pb.h.
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/gen/retrybudget/v1
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/retrybudget COMPONENT dev
  FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/proto/retrybudget/v1
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/retrybudget COMPONENT dev
  FILES_MATCHING PATTERN "*.proto")

# ---- the package ----
install(EXPORT retrybudgetTargets
  NAMESPACE retrybudget::
  DESTINATION ${RETRYBUDGET_INSTALL_CMAKEDIR} COMPONENT dev)
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/retrybudgetConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/retrybudgetConfig.cmake
  INSTALL_DESTINATION ${RETRYBUDGET_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/retrybudgetConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/cmake/retrybudgetConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/retrybudgetConfigVersion.cmake
  DESTINATION ${RETRYBUDGET_INSTALL_CMAKEDIR} COMPONENT dev)
