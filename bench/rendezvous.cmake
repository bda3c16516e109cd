# Rendezvous benchmarks (issue 3); bench/rdzv_bench.sh runs them next to TCPStore.
if(TARGET ddpl_rdzv_server)
  add_executable(rdzv_store_bench ${CMAKE_CURRENT_SOURCE_DIR}/rdzv_store_bench.cc)
  target_link_libraries(rdzv_store_bench PRIVATE ddpl_rdzv_client ddpl_rdzv_server)
  add_executable(rdzv_scale_bench ${CMAKE_CURRENT_SOURCE_DIR}/rdzv_scale_bench.cc)
  target_link_libraries(rdzv_scale_bench PRIVATE ddpl_rdzv_client ddpl_rdzv_server)
endif()
