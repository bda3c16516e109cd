# Tests for rendezvous/ (issue 3). Included from tests/CMakeLists.txt.
ddpl_add_test(NAME rdzv_state_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/rdzv_state_test.cc
              LIBS ddpl_rdzv_core LABELS unit)
ddpl_add_test(NAME rdzv_round_rules_test
              SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/rdzv_round_rules_test.cc
              LIBS ddpl_rdzv_core LABELS unit)
ddpl_add_test(NAME rdzv_kv_space_test
              SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/rdzv_kv_space_test.cc
              LIBS ddpl_rdzv_core LABELS unit)
if(TARGET ddpl_rdzv_server)
  ddpl_add_test(NAME store_conformance_test
                SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/store_conformance_test.cc
                LIBS ddpl_rdzv_client ddpl_rdzv_server LABELS unit)
endif()
if(TARGET ddpl_rdzv_server)
  ddpl_add_test(NAME rdzv_store_service_test
                SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/rdzv_store_service_test.cc
                LIBS ddpl_rdzv_client ddpl_rdzv_server ddpl_proto LABELS integration)
endif()
if(TARGET ddpl_rdzv_server)
  ddpl_add_test(NAME rdzv_membership_test
                SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/rdzv_membership_test.cc
                LIBS ddpl_rdzv_client ddpl_rdzv_server ddpl_proto LABELS integration)
endif()
if(TARGET ddpl_rdzv_server)
  ddpl_add_test(NAME rdzv_fault_test
                SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fault/rdzv_fault_test.cc
                LIBS ddpl_rdzv_client ddpl_rdzv_server ddpl_test_util LABELS fault)
  add_dependencies(rdzv_fault_test rdzv-server)
endif()
if(TARGET ddpl_rdzv_server)
  ddpl_add_test(NAME rdzv_store_session_test
                SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/rdzv_store_session_test.cc
                LIBS ddpl_rdzv_client ddpl_rdzv_server ddpl_proto LABELS integration)
endif()
if(TARGET ddpl_rdzv_server)
  # Issue 11: hostile clients and a long uptime, against real rdzv-server processes.
  ddpl_add_test(NAME rdzv_hostile_test
                SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fault/rdzv_hostile_test.cc
                LIBS ddpl_rdzv_client ddpl_rdzv_server ddpl_proto ddpl_test_util
                LABELS fault TIMEOUT 240)
  add_dependencies(rdzv_hostile_test rdzv-server launch)
  # Issue 17: the store's socket transport under hostile clients (raw sockets).
  ddpl_add_test(NAME rdzv_socket_hostile_test
                SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fault/rdzv_socket_hostile_test.cc
                LIBS ddpl_rdzv_client ddpl_rdzv_server ddpl_proto ddpl_test_util
                LABELS fault TIMEOUT 180)
  add_dependencies(rdzv_socket_hostile_test rdzv-server)
endif()
if(TARGET ddpl_rdzv_server)
  # Issue 28: torch's TCPStore protocol (its parser; the server under raw-socket clients).
  ddpl_add_test(NAME rdzv_tcpstore_hostile_test
                SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fault/rdzv_tcpstore_hostile_test.cc
                LIBS ddpl_rdzv_server ddpl_test_util LABELS fault TIMEOUT 120)
endif()
if(TARGET ddpl_rdzv_server)
  # Issue 33: bounds per connection and in total, against real rdzv-server processes. Alone
  # (SERIAL): each case judges a server by its memory and by how soon it ends a flooding
  # connection. Beside three other cases the parked-calls one failed 2 suite runs in 4 (no
  # end within 20 s of what takes 2 s alone); never alone, under busy loops or under compiles.
  ddpl_add_test(NAME rdzv_stream_bounds_test
                SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fault/rdzv_stream_bounds_test.cc
                LIBS ddpl_rdzv_client ddpl_rdzv_server ddpl_proto ddpl_test_util
                LABELS fault TIMEOUT 120 SERIAL)
  add_dependencies(rdzv_stream_bounds_test rdzv-server)
endif()
