# ddpl_add_test(NAME name SOURCES ... [LIBS ...] [LABELS ...] [TIMEOUT s] [PROCESSORS n] [COST c]
#               [SERIAL])
# One test binary per component; GoogleTest cases are registered individually so that
# `ctest -j` spreads them over the cores and a failure names the case. Most cases wait (on
# processes, timeouts, sockets) rather than compute, so scripts/test.sh runs more of them at once
# than there are cores: PROCESSORS marks the cases that keep two cores busy (LibTorch training,
# compilers), so that ctest counts them as two slots; SERIAL the cases that judge a process by
# its CPU rate, which other tests' load would change. COST (about the seconds a case takes) makes
# ctest start the long cases first: a clean clone has no timings of earlier runs, and a long case
# started last is the suite's whole tail (wheel_test alone was the last 226 s of 678).
include(GoogleTest)
function(ddpl_add_test)
  cmake_parse_arguments(T "SERIAL" "NAME;TIMEOUT;PROCESSORS;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(NOT T_PROCESSORS)
    set(T_PROCESSORS 1)
  endif()
  if(NOT T_COST)
    set(T_COST 0)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_definitions(${T_NAME} PRIVATE
    DDPL_BIN_DIR="${CMAKE_BINARY_DIR}/bin" DDPL_TEST_BIN_DIR="${CMAKE_BINARY_DIR}/tests"
    DDPL_SOURCE_DIR="${CMAKE_SOURCE_DIR}" DDPL_PYTHON="${DDPL_PYTHON}")
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}" PROCESSORS ${T_PROCESSORS}
    COST ${T_COST} RUN_SERIAL ${T_SERIAL})
endfunction()
