add_executable(spawn_floor ${CMAKE_CURRENT_SOURCE_DIR}/spawn_floor.cc)
