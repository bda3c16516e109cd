# DDP benchmark program (issue 4); bench/ddp_bench.sh runs it against Python DDP.
add_executable(ddp_bench ${CMAKE_CURRENT_SOURCE_DIR}/ddp_bench.cc)
target_link_libraries(ddp_bench PRIVATE ddpl_worker)
target_precompile_headers(ddp_bench REUSE_FROM ddpl_worker)
set_target_properties(ddp_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)

# The cost of symbolised error files (issue 18): describeException for a LibTorch error.
add_executable(error_trace_bench ${CMAKE_CURRENT_SOURCE_DIR}/error_trace_bench.cc)
target_link_libraries(error_trace_bench PRIVATE ddpl_worker)
target_precompile_headers(error_trace_bench REUSE_FROM ddpl_worker)
set_target_properties(error_trace_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
