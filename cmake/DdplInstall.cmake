# What `cmake --install` (and `make install`) puts under the prefix, in two components:
#
#   runtime  launch, rdzv-server, and the gRPC and metrics plugins that launch loads from
#            <bin>/../lib (where this build has them: the GPU kit's builds have neither).
#            Only this component goes into the wheel (pyproject.toml: install.components) and
#            the Debian package (cmake/DdplPackage.cmake): neither carries LibTorch.
#   dev      the worker library and the libraries it needs (static archives), the headers a
#            training program includes, and the CMake package `ddplaunch`:
#            find_package(ddplaunch CONFIG) gives ddplaunch::worker. Only with LibTorch.
#
# A plain `cmake --install build --prefix P` installs both.
install(TARGETS launch RUNTIME DESTINATION bin COMPONENT runtime)
foreach(target rdzv-server ddpl_launch_grpc ddpl_launch_metrics)
  if(TARGET ${target})
    # COMPONENT after each kind: it applies to the artifact kind it follows only.
    install(TARGETS ${target} RUNTIME DESTINATION bin COMPONENT runtime
            LIBRARY DESTINATION lib COMPONENT runtime)
  endif()
endforeach()

if(NOT TARGET ddpl_worker)
  return()
endif()

include(CMakePackageConfigHelpers)

# Static archives: the objects a consumer links are the ones our tests ran, with no shared
# library ABI of our own to keep, and a training program is one executable anyway. Their
# dependencies (gRPC, protobuf, abseil, spdlog, fmt, OpenMPI: Debian's) are found again by the
# package config and linked by the consumer. ddpl_proto ships as an archive only: its generated
# headers stay private, as the store client's public header never includes them.
set(DDPL_EXPORTED_LIBS ddpl_worker ddpl_worker_log ddpl_worker_mpi ddpl_worker_trace ddpl_store
  ddpl_common)
if(TARGET ddpl_rdzv_client)
  list(APPEND DDPL_EXPORTED_LIBS ddpl_rdzv_client ddpl_proto)
endif()
foreach(lib IN LISTS DDPL_EXPORTED_LIBS)
  # ddplaunch::worker, ddplaunch::store...: the namespace replaces our internal prefix.
  string(REGEX REPLACE "^ddpl_" "" exported "${lib}")
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${exported})
endforeach()
install(TARGETS ${DDPL_EXPORTED_LIBS} EXPORT ddplaunchTargets
  ARCHIVE DESTINATION lib COMPONENT dev)

# The public headers: what a training program includes (worker/), and what those include in
# turn. Internal headers (backends, MPI bootstrap, pch) stay out. The consumer test
# (tests/integration/consumer_test.sh) includes every one of them from the installed prefix
# alone, so a header that needs one not listed here fails it.
install(FILES
  worker/amp.h worker/auto_batch.h worker/checkpoint_archive.h worker/checkpoint_manager.h worker/ddp.h
  worker/error_report.h worker/heartbeat.h
  worker/log_bridge.h worker/native_trace.h worker/sampler.h worker/session.h
  worker/store_adapter.h
  DESTINATION include/ddplaunch/worker COMPONENT dev)
install(FILES common/checkpoint_format.h common/defaults.h common/environment.h common/errors.h
  common/torchrun_env.h
  DESTINATION include/ddplaunch/common COMPONENT dev)
install(FILES rendezvous/store/store.h DESTINATION include/ddplaunch/rendezvous/store COMPONENT dev)

set(DDPL_CMAKE_DIR lib/cmake/ddplaunch)
install(EXPORT ddplaunchTargets NAMESPACE ddplaunch:: DESTINATION ${DDPL_CMAKE_DIR}
  COMPONENT dev)

# What ddplaunchConfig.cmake needs to find again: how gRPC was found, whether MPI and the NCCL
# backend are in, and the LibTorch this build compiled against (the one absolute path in the
# package, recorded as a default the user can override).
if(TARGET ddpl_rdzv_client)
  set(DDPL_PACKAGE_GRPC ON)
else()
  set(DDPL_PACKAGE_GRPC OFF)
endif()
if(DDPL_GRPCXX STREQUAL "gRPC::grpc++")
  set(DDPL_GRPC_FROM_CONFIG ON)
else()
  set(DDPL_GRPC_FROM_CONFIG OFF)
endif()
configure_package_config_file(cmake/ddplaunchConfig.cmake.in
  ${CMAKE_BINARY_DIR}/ddplaunch-config/ddplaunchConfig.cmake INSTALL_DESTINATION ${DDPL_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ddplaunch-config/ddplaunchConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ddplaunch-config/ddplaunchConfig.cmake
  ${CMAKE_BINARY_DIR}/ddplaunch-config/ddplaunchConfigVersion.cmake cmake/DdplTorch.cmake
  DESTINATION ${DDPL_CMAKE_DIR} COMPONENT dev)
