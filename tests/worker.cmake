# Worker library tests (issue 4). LibTorch TUs reuse ddpl_worker's precompiled header.
ddpl_add_test(NAME worker_unit_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/worker_unit_test.cc
  LIBS ddpl_worker nlohmann_json::nlohmann_json LABELS worker TIMEOUT 120)
target_precompile_headers(worker_unit_test REUSE_FROM ddpl_worker)
ddpl_add_test(NAME worker_checkpoints_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/worker_checkpoints_test.cc
  LIBS ddpl_worker LABELS worker TIMEOUT 120)
target_precompile_headers(worker_checkpoints_test REUSE_FROM ddpl_worker)
# Issue 28: LibTorch's own TCPStore client against our server's TCPStore protocol and torch's.
if(TARGET ddpl_rdzv_server)
  ddpl_add_test(NAME tcpstore_cpp_client_test
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/tcpstore_cpp_client_test.cc
    LIBS ddpl_worker ddpl_rdzv_server LABELS worker TIMEOUT 120)
  target_precompile_headers(tcpstore_cpp_client_test REUSE_FROM ddpl_worker)
endif()

# worker_rank, the rank program every multi-process test starts, and the stripped library on
# its stack: in a file of their own, as the GPU checks build them without the suite.
include(${CMAKE_CURRENT_LIST_DIR}/worker_rank.cmake)

# The symboliser alone (torch-free), on frames of its own test program: -g whatever the build
# type, since the test is about what debug information gives.
ddpl_add_test(NAME native_trace_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/native_trace_test.cc
  LIBS ddpl_worker_trace ddpl_test_stripped LABELS worker TIMEOUT 60)
target_compile_options(native_trace_test PRIVATE -g)
target_include_directories(native_trace_test PRIVATE ${PROJECT_SOURCE_DIR})


# Drivers are torch-free: they only start processes and read what they leave.
ddpl_add_test(NAME worker_multiproc_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/worker_multiproc_test.cc
  LIBS ddpl_test_util nlohmann_json::nlohmann_json LABELS "worker;integration" TIMEOUT 240 PROCESSORS 2)
target_include_directories(worker_multiproc_test PRIVATE ${PROJECT_SOURCE_DIR})
add_dependencies(worker_multiproc_test worker_rank launch)

ddpl_add_test(NAME worker_fault_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fault/worker_fault_test.cc
  LABELS "worker;fault" TIMEOUT 240 PROCESSORS 2)
target_include_directories(worker_fault_test PRIVATE ${PROJECT_SOURCE_DIR})
add_dependencies(worker_fault_test worker_rank)

# Issue 45: LibTorch programs link on a toolchain whose C++ runtime is static (the lent GPU host's
# GCC 13), with one runtime in the process and throw sites still recorded. Builds a small program
# twice (about 20 s).
add_test(NAME cxx_runtime_test
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cxx_runtime/run_test.sh ${PROJECT_SOURCE_DIR}
          ${CMAKE_BINARY_DIR}/cxx_runtime_test ${DDPL_PYTHON})
set_tests_properties(cxx_runtime_test PROPERTIES TIMEOUT 300 LABELS "worker;integration"
  PROCESSORS 2 COST 40)
