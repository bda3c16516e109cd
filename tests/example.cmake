# examples/ddp_resnet (issue 5). The drivers are torch-free: they start ddp_resnet (under
# `launch`, torchrun, or alone) and judge what it prints, writes and leaves behind.
ddpl_add_test(NAME example_input_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/example_input_test.cc
  LIBS ddpl_example_core ddpl_test_util nlohmann_json::nlohmann_json LABELS "example;unit;integration" TIMEOUT 90)
add_dependencies(example_input_test ddp_resnet)

ddpl_add_test(NAME example_training_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/example_training_test.cc
  LIBS ddpl_test_util nlohmann_json::nlohmann_json LABELS "example;integration" TIMEOUT 200 PROCESSORS 2 COST 30)
add_dependencies(example_training_test ddp_resnet launch)

ddpl_add_test(NAME example_fault_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fault/example_fault_test.cc
  LIBS ddpl_test_util nlohmann_json::nlohmann_json LABELS "example;fault" TIMEOUT 300 PROCESSORS 2 COST 40)
add_dependencies(example_fault_test ddp_resnet launch)

# The frames of ddp_resnet's error files under launch (issue 33): the throw site, named.
ddpl_add_test(NAME example_error_file_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/example_error_file_test.cc
  LIBS ddpl_test_util nlohmann_json::nlohmann_json LABELS "example;integration" TIMEOUT 240 PROCESSORS 2)
add_dependencies(example_error_file_test ddp_resnet launch)
