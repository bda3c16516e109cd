add_executable(spawn_floor ${CMAKE_CURRENT_SOURCE_DIR}/spawn_floor.cc)
target_link_libraries(spawn_floor PRIVATE ddpl_common)
