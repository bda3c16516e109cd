# The MPI launch (issue 7): included by tests/CMakeLists.txt when DDPL_WITH_MPI (OpenMPI found).
# Cases that run mpirun skip themselves when it is not in PATH.

# launch --launcher=mpi without running anything: hostfile, --mpi-args, the mpirun command.
ddpl_add_test(NAME mpi_launch_unit_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/mpi_launch_unit_test.cc
  LIBS ddpl_launcher LABELS "mpi;unit" TIMEOUT 60)

if(TARGET ddpl_worker_mpi)
  # Recognising an MPI launch from its variables (torch-free).
  ddpl_add_test(NAME mpi_env_unit_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/mpi_env_unit_test.cc
    LIBS ddpl_worker_mpi LABELS "mpi;unit" TIMEOUT 60)
endif()

if(TARGET ddpl_worker AND TARGET worker_rank)
  # The rank program: the same binary under launch, mpirun and launch --launcher=mpi.
  add_executable(mpi_rank ${CMAKE_CURRENT_SOURCE_DIR}/integration/mpi_rank_main.cc)
  target_link_libraries(mpi_rank PRIVATE ddpl_worker)
  target_precompile_headers(mpi_rank REUSE_FROM ddpl_worker)
  set_target_properties(mpi_rank PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)

  # Torch-free driver: starts mpirun and launch, compares what the ranks leave.
  ddpl_add_test(NAME mpi_job_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/mpi_job_test.cc
    LIBS ddpl_test_util nlohmann_json::nlohmann_json LABELS "mpi;integration" TIMEOUT 300 PROCESSORS 2)
  add_dependencies(mpi_job_test mpi_rank worker_rank launch)
  if(TARGET ddp_resnet)
    add_dependencies(mpi_job_test ddp_resnet)
  endif()
endif()
