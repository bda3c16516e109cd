# ddpl_add_test(NAME name SOURCES ... [LIBS ...] [LABELS ...] [TIMEOUT s] [GTEST])
# One test binary per component; GoogleTest cases are registered individually so that
# `ctest -j` spreads them over the cores and a failure names the case.
include(GoogleTest)
function(ddpl_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_definitions(${T_NAME} PRIVATE
    DDPL_BIN_DIR="${CMAKE_BINARY_DIR}/bin" DDPL_TEST_BIN_DIR="${CMAKE_BINARY_DIR}/tests"
    DDPL_SOURCE_DIR="${CMAKE_SOURCE_DIR}" DDPL_PYTHON="${DDPL_PYTHON}")
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()
