# Worker library tests (issue 4). LibTorch TUs reuse ddpl_worker's precompiled header.
ddpl_add_test(NAME worker_unit_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/worker_unit_test.cc
  LIBS ddpl_worker nlohmann_json::nlohmann_json LABELS worker TIMEOUT 120)
target_precompile_headers(worker_unit_test REUSE_FROM ddpl_worker)

# A library without symbols or DWARF on the rank program's stack (error-file frames, issue 18).
add_library(ddpl_test_stripped SHARED ${CMAKE_CURRENT_SOURCE_DIR}/integration/stripped_frames.cc)
target_compile_options(ddpl_test_stripped PRIVATE -fvisibility=hidden)
target_link_options(ddpl_test_stripped PRIVATE -Wl,--strip-all)
set_target_properties(ddpl_test_stripped PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)

# The symboliser alone (torch-free), on frames of its own test program: -g whatever the build
# type, since the test is about what debug information gives.
ddpl_add_test(NAME native_trace_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/native_trace_test.cc
  LIBS ddpl_worker_trace ddpl_test_stripped LABELS worker TIMEOUT 60)
target_compile_options(native_trace_test PRIVATE -g)
target_include_directories(native_trace_test PRIVATE ${PROJECT_SOURCE_DIR})

# The rank program every multi-process test starts (also under torchrun and `launch`).
add_executable(worker_rank ${CMAKE_CURRENT_SOURCE_DIR}/integration/worker_rank_main.cc)
target_link_libraries(worker_rank PRIVATE ddpl_worker ddpl_test_stripped)
target_precompile_headers(worker_rank REUSE_FROM ddpl_worker)
set_target_properties(worker_rank PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)

# Drivers are torch-free: they only start processes and read what they leave.
ddpl_add_test(NAME worker_multiproc_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/worker_multiproc_test.cc
  LIBS ddpl_test_util nlohmann_json::nlohmann_json LABELS "worker;integration" TIMEOUT 240)
target_include_directories(worker_multiproc_test PRIVATE ${PROJECT_SOURCE_DIR})
add_dependencies(worker_multiproc_test worker_rank launch)

ddpl_add_test(NAME worker_fault_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fault/worker_fault_test.cc
  LABELS "worker;fault" TIMEOUT 240)
target_include_directories(worker_fault_test PRIVATE ${PROJECT_SOURCE_DIR})
add_dependencies(worker_fault_test worker_rank)
