# Rendezvous benchmarks (issue 3); bench/rdzv_bench.sh runs them next to TCPStore.
if(TARGET ddpl_rdzv_server)
  add_executable(rdzv_store_bench ${CMAKE_CURRENT_SOURCE_DIR}/rdzv_store_bench.cc)
  target_link_libraries(rdzv_store_bench PRIVATE ddpl_rdzv_client ddpl_rdzv_server)
  add_executable(rdzv_scale_bench ${CMAKE_CURRENT_SOURCE_DIR}/rdzv_scale_bench.cc)
  target_link_libraries(rdzv_scale_bench PRIVATE ddpl_rdzv_client ddpl_rdzv_server)
  # The floor of a gRPC round trip here, with three server designs (docs/bench-rendezvous.md §7).
  add_executable(grpc_floor_bench ${CMAKE_CURRENT_SOURCE_DIR}/grpc_floor_bench.cc)
  target_link_libraries(grpc_floor_bench PRIVATE ddpl_proto)
endif()
# Process-group bootstrap through c10d with our store and with TCPStore (issue 17). Its log
# set-up is a library of its own: spdlog's headers and LibTorch's (own fmt) do not mix.
if(TARGET ddpl_rdzv_server AND TARGET ddpl_worker)
  add_library(rdzv_bootstrap_log STATIC ${CMAKE_CURRENT_SOURCE_DIR}/rdzv_bootstrap_log.cc)
  target_link_libraries(rdzv_bootstrap_log PRIVATE ddpl_common)
  add_executable(rdzv_bootstrap_bench ${CMAKE_CURRENT_SOURCE_DIR}/rdzv_bootstrap_bench.cc)
  target_link_libraries(rdzv_bootstrap_bench PRIVATE rdzv_bootstrap_log ddpl_worker ddpl_rdzv_client
                                                     ddpl_rdzv_server)
endif()
