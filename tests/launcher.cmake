add_library(ddpl_test_util STATIC ${CMAKE_CURRENT_SOURCE_DIR}/common/subprocess.cc)
target_include_directories(ddpl_test_util PUBLIC ${PROJECT_SOURCE_DIR})

ddpl_add_test(NAME launcher_unit_test
  SOURCES unit/cli_test.cc unit/supervisor_test.cc unit/worker_spec_test.cc unit/output_test.cc
    unit/parse_test.cc unit/numa_test.cc unit/progress_test.cc unit/job_view_test.cc
    unit/etcd_config_test.cc unit/file_io_test.cc unit/rdzv_token_test.cc unit/containment_test.cc
    unit/child_process_test.cc
    unit/event_loop_test.cc unit/hang_responder_test.cc unit/hang_report_test.cc
    unit/stacks_service_test.cc
    unit/checkpoint_tier_test.cc unit/warm_plan_test.cc unit/restart_phases_test.cc
    unit/agent_parts_test.cc
  LIBS ddpl_launcher ddpl_test_util LABELS unit TIMEOUT 60)

# Integration and fault tests run the real `launch` binary.
ddpl_add_test(NAME launcher_integration_test
  SOURCES integration/launcher_test.cc LIBS ddpl_test_util LABELS integration TIMEOUT 120)
add_dependencies(launcher_integration_test launch)
ddpl_add_test(NAME launcher_fault_test
  SOURCES fault/launcher_fault_test.cc LIBS ddpl_test_util LABELS fault TIMEOUT 120)
add_dependencies(launcher_fault_test launch)
ddpl_add_test(NAME launcher_python_test
  SOURCES integration/launcher_python_test.cc LIBS ddpl_test_util LABELS python TIMEOUT 400 PROCESSORS 2)
add_dependencies(launcher_python_test launch)

add_executable(store_client_program integration/programs/store_client.cc)
target_link_libraries(store_client_program PRIVATE ddpl_rdzv_client)
set_target_properties(store_client_program PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
add_dependencies(launcher_integration_test store_client_program)

# Jobs of several agents whose workers import torch: minutes under a sanitizer on two cores and
# no C++ that the other suites leave unexercised (scripts/test_sanitized.sh), so the sanitized
# trees do not build them at all.
if(NOT DDPL_SANITIZED_SUBSET)
  ddpl_add_test(NAME multinode_test
    SOURCES integration/multinode_test.cc LIBS ddpl_test_util LABELS integration TIMEOUT 300
    COST 30)
  add_dependencies(multinode_test launch rdzv-server ddpl_launch_grpc)

  # Issue 28: the agent store under unchanged Python scripts (torch's own client and server).
  ddpl_add_test(NAME agent_store_test
    SOURCES integration/agent_store_test.cc LIBS ddpl_test_util LABELS python TIMEOUT 600
    PROCESSORS 2 COST 30)
  add_dependencies(agent_store_test launch ddpl_launch_grpc)

  # Issue 29: checkpoints in memory under launch, C++ (worker_rank) and Python DDP.
  ddpl_add_test(NAME memory_checkpoint_test
    SOURCES integration/memory_checkpoint_test.cc LIBS ddpl_test_util LABELS "python;fault"
    TIMEOUT 400 PROCESSORS 2 COST 40)
  add_dependencies(memory_checkpoint_test launch worker_rank ddpl_test_slow_disk)
  # A slow disk for one directory (LD_PRELOAD): launch's background copies lag the training.
  add_library(ddpl_test_slow_disk SHARED slow_disk/slow_disk.c)
  set_target_properties(ddpl_test_slow_disk PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/slow_disk)
  target_link_libraries(ddpl_test_slow_disk PRIVATE ${CMAKE_DL_LIBS})

  # Issue 30: workers forked from the warm template (--prewarm) against cold ones.
  ddpl_add_test(NAME warm_worker_test
    SOURCES integration/warm_worker_test.cc LIBS ddpl_test_util nlohmann_json::nlohmann_json
    LABELS python TIMEOUT 400 PROCESSORS 2 COST 30)
  add_dependencies(warm_worker_test launch)

  # --rdzv-backend=etcd against real etcd servers the test starts (skipped without etcd).
  ddpl_add_test(NAME etcd_rendezvous_test
    SOURCES integration/etcd_rendezvous_test.cc LIBS ddpl_test_util LABELS integration TIMEOUT 600
    COST 25)
  add_dependencies(etcd_rendezvous_test launch)

  # ddplaunch.checkpoint (python/ddplaunch/checkpoint/) against the memory tier's contract
  # (docs/checkpoints.md): the commit protocol, keep, budget, disk layout, agreement over a real
  # TCPStore, DCP on gloo. launch's side is in checkpoint_tier_test.cc.
  add_test(NAME python_checkpoint_test
    COMMAND ${DDPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/unit/python_checkpoint_test.py)
  set_tests_properties(python_checkpoint_test PROPERTIES TIMEOUT 180 LABELS "unit;python" PROCESSORS 2
    COST 25 SKIP_RETURN_CODE 77)
endif()
# Issue 46: checkpoint format 1 byte for byte (docs/checkpoints.md). The C++ side against the
# golden vectors in tests/golden/checkpoint; the Python module against the same vectors, and each
# side reading what the other wrote through checkpoint_tool (common/checkpoint_files.h as a
# command line).
ddpl_add_test(NAME checkpoint_golden_test SOURCES unit/checkpoint_golden_test.cc
  LIBS ddpl_common ddpl_test_util nlohmann_json::nlohmann_json LABELS unit TIMEOUT 60)
add_executable(checkpoint_tool integration/programs/checkpoint_tool.cc)
target_link_libraries(checkpoint_tool PRIVATE ddpl_common nlohmann_json::nlohmann_json)
set_target_properties(checkpoint_tool PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
add_test(NAME python_checkpoint_golden_test
  COMMAND ${DDPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/unit/python_checkpoint_golden_test.py
    $<TARGET_FILE:checkpoint_tool>)
set_tests_properties(python_checkpoint_golden_test PROPERTIES TIMEOUT 120 LABELS "unit;python"
  SKIP_RETURN_CODE 77)

ddpl_add_test(NAME etcd_client_test
  SOURCES integration/etcd_client_test.cc LIBS ddpl_etcd_client ddpl_test_util LABELS integration TIMEOUT 120)

# deploy/: manifests agree with the binaries' flags.
add_test(NAME deploy_manifests_test
  COMMAND ${DDPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/deploy_manifests_test.py ${CMAKE_BINARY_DIR}/bin)
set_tests_properties(deploy_manifests_test PROPERTIES TIMEOUT 60 LABELS integration
  SKIP_RETURN_CODE 77)

# The Python package's progress calls (python/ddplaunch/progress.py): the bytes ddplaunch.step()
# leaves where launch reads a heartbeat, and no write or error without launch.
add_test(NAME python_progress_test
  COMMAND ${DDPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/unit/python_progress_test.py)
set_tests_properties(python_progress_test PROPERTIES TIMEOUT 60 LABELS unit SKIP_RETURN_CODE 77)

# launch under a real one-host Slurm cluster that the test starts (skipped, saying why, where
# it cannot start one).
add_test(NAME slurm_test
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/slurm_test.sh ${CMAKE_BINARY_DIR}/bin ${PROJECT_SOURCE_DIR})
set_tests_properties(slurm_test PROPERTIES TIMEOUT 240 LABELS integration SKIP_RETURN_CODE 77
  RUN_SERIAL TRUE)

# Three hosts with their own addresses (network namespaces the test makes), a real Gloo job.
add_test(NAME netns_test
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/netns_test.sh ${CMAKE_BINARY_DIR}/bin ${PROJECT_SOURCE_DIR} ${DDPL_PYTHON})
set_tests_properties(netns_test PROPERTIES TIMEOUT 180 LABELS integration SKIP_RETURN_CODE 77)

# The Python wheel (make wheel): built, installed into a fresh venv, used without activating it.
add_test(NAME wheel_test
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/wheel_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(wheel_test PROPERTIES TIMEOUT 900 LABELS integration PROCESSORS 2
  COST 300)

# A fake NVML (tests/fake_nvml/fake_nvml.c) so that the GPU paths run without a driver:
# libnvidia-ml.so.1 in a directory of its own (never build/lib, where a program could find it by
# its run path), complete and sparse (an older driver's missing functions).
foreach(variant fake_nvml fake_nvml_sparse)
  add_library(${variant} SHARED fake_nvml/fake_nvml.c)
  set_target_properties(${variant} PROPERTIES OUTPUT_NAME nvidia-ml SOVERSION 1
    C_VISIBILITY_PRESET hidden LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/${variant})
  target_link_libraries(${variant} PRIVATE Threads::Threads)
endforeach()
target_compile_definitions(fake_nvml_sparse PRIVATE FAKE_NVML_SPARSE)

ddpl_add_test(NAME launcher_nvml_test
  SOURCES unit/nvml_test.cc LIBS ddpl_launcher ddpl_test_util ${CMAKE_DL_LIBS} LABELS unit TIMEOUT 60)
add_dependencies(launcher_nvml_test fake_nvml fake_nvml_sparse)
target_compile_definitions(launcher_nvml_test PRIVATE
  FAKE_NVML="$<TARGET_FILE:fake_nvml>" FAKE_NVML_SPARSE="$<TARGET_FILE:fake_nvml_sparse>")

# The metrics endpoint, scraped over HTTP on loopback.
ddpl_add_test(NAME launcher_metrics_test
  SOURCES integration/metrics_test.cc LIBS ddpl_web_server ddpl_launcher ddpl_test_util LABELS integration TIMEOUT 90)
add_dependencies(launcher_metrics_test fake_nvml launch)
target_compile_definitions(launcher_metrics_test PRIVATE FAKE_NVML="$<TARGET_FILE:fake_nvml>")

# The dashboard's model and server (launch --dashboard); a real job in a browser:
# tests/dashboard/dashboard_test.py.
if(TARGET ddpl_web_server)
  ddpl_add_test(NAME launcher_dashboard_test
    SOURCES unit/dashboard_test.cc LIBS ddpl_web_server ddpl_web ddpl_test_util
    LABELS unit TIMEOUT 60)
  add_test(NAME dashboard_test
    COMMAND ${DDPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/dashboard/dashboard_test.py
      ${CMAKE_BINARY_DIR}/bin)
  set_tests_properties(dashboard_test PROPERTIES TIMEOUT 240 LABELS "integration;python"
    PROCESSORS 2 COST 40 SKIP_RETURN_CODE 77)
endif()

# launch doctor: checks against the fake NVML, fake /proc and /sys roots and a fake Python.
ddpl_add_test(NAME launcher_doctor_test
  SOURCES unit/doctor_test.cc LIBS ddpl_launcher ddpl_test_util LABELS unit TIMEOUT 90)
add_dependencies(launcher_doctor_test fake_nvml launch)
target_compile_definitions(launcher_doctor_test PRIVATE FAKE_NVML="$<TARGET_FILE:fake_nvml>")

# Issue 33: what a worker, another user or a bad command line could do to launch.
ddpl_add_test(NAME launcher_hardening_test
  SOURCES fault/launcher_hardening_test.cc LIBS ddpl_test_util LABELS fault TIMEOUT 240)
add_dependencies(launcher_hardening_test launch rdzv-server)

# Issue 33: --hang-timeout for Python Gloo ranks that report no steps, judged by their CPU rate.
ddpl_add_test(NAME launcher_idle_hang_test
  SOURCES integration/idle_hang_test.cc LIBS ddpl_test_util LABELS python TIMEOUT 180 SERIAL)
add_dependencies(launcher_idle_hang_test launch)

# Issue 48: the hang report names the culprit and the collective, for six injected hangs of a
# 3-rank Gloo job (tests/python/hang_kinds.py), one test each (about 10 s each here).
ddpl_add_test(NAME launcher_hang_report_test
  SOURCES integration/hang_report_test.cc LIBS ddpl_test_util LABELS python TIMEOUT 150 SERIAL)
add_dependencies(launcher_hang_report_test launch)

# The job-outcome protocol of both multi-node backends (membership/multi_node_rendezvous.cc,
# which lives in the gRPC plugin) over an in-memory JobKv.
ddpl_add_test(NAME job_outcome_test
  SOURCES unit/job_outcome_test.cc ${PROJECT_SOURCE_DIR}/launcher/membership/multi_node_rendezvous.cc
  LIBS ddpl_launcher ddpl_test_util LABELS unit TIMEOUT 60)

# Issue 44: who owns the other end of a connection (common/peer_uid.h), as the kernel says.
ddpl_add_test(NAME peer_uid_test
  SOURCES unit/peer_uid_test.cc LIBS ddpl_common LABELS unit TIMEOUT 60)

# Issue 44: another user on the machine against a one-node job's store (torch's protocol, gRPC,
# the store socket) and its page; the stranger is a child running as nobody (root needed).
if(TARGET ddpl_rdzv_server)
  ddpl_add_test(NAME launcher_stranger_test
    SOURCES fault/stranger_test.cc LIBS ddpl_rdzv_client ddpl_rdzv_server ddpl_test_util
    LABELS fault TIMEOUT 120)
  add_dependencies(launcher_stranger_test launch ddpl_launch_grpc)
  if(TARGET ddpl_launch_metrics)
    add_dependencies(launcher_stranger_test ddpl_launch_metrics)
  endif()
endif()

# Issue 44: reporting parts (dashboard, live view, summary, manifest) never end a job: the real
# launch with --dashboard, and the agent in-process with parts that throw.
ddpl_add_test(NAME launcher_reporting_test
  SOURCES integration/reporting_test.cc LIBS ddpl_launcher ddpl_test_util LABELS integration
  TIMEOUT 120)
add_dependencies(launcher_reporting_test launch)
