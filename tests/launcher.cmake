add_library(ddpl_test_util STATIC ${CMAKE_CURRENT_SOURCE_DIR}/common/subprocess.cc)
target_include_directories(ddpl_test_util PUBLIC ${PROJECT_SOURCE_DIR})

ddpl_add_test(NAME launcher_unit_test
  SOURCES unit/cli_test.cc unit/supervisor_test.cc unit/worker_spec_test.cc unit/output_test.cc
  LIBS ddpl_launcher ddpl_test_util LABELS unit TIMEOUT 60)
