add_executable(spawn_floor ${CMAKE_CURRENT_SOURCE_DIR}/spawn_floor.cc)
target_link_libraries(spawn_floor PRIVATE ddpl_common)
# The cost of one heartbeat from C++ (worker/heartbeat.cc is torch-free: built in directly).
add_executable(heartbeat_bench ${CMAKE_CURRENT_SOURCE_DIR}/heartbeat_bench.cc
  ${PROJECT_SOURCE_DIR}/worker/heartbeat.cc)
target_link_libraries(heartbeat_bench PRIVATE ddpl_common)
set_target_properties(heartbeat_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
