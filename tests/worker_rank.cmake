# The rank program every multi-process test starts (also under torchrun and `launch`), and a
# library without symbols or DWARF on its stack (error-file frames, issue 18). Included by
# tests/worker.cmake and, for tests/gpu/run_gpu_checks.sh, by the top-level CMakeLists.txt
# when only the GPU check programs are built.
add_library(ddpl_test_stripped SHARED ${PROJECT_SOURCE_DIR}/tests/integration/stripped_frames.cc)
target_compile_options(ddpl_test_stripped PRIVATE -fvisibility=hidden)
target_link_options(ddpl_test_stripped PRIVATE -Wl,--strip-all)
set_target_properties(ddpl_test_stripped PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)

add_executable(worker_rank ${PROJECT_SOURCE_DIR}/tests/integration/worker_rank_main.cc)
target_link_libraries(worker_rank PRIVATE ddpl_worker ddpl_test_stripped)
target_precompile_headers(worker_rank REUSE_FROM ddpl_worker)
set_target_properties(worker_rank PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
