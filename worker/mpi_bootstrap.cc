#include "worker/mpi_bootstrap.h"

// C bindings only: OpenMPI's and MPICH's deprecated C++ bindings are not used.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "common/errors.h"

namespace ddpl::worker::mpi {
namespace {

std::mutex gMu;
bool gOwnsMpi = false;  // we called MPI_Init, so we finalize
std::atomic<bool> gEndedNormally{false};

std::string errorText(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

void check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw BackendError(std::string(call) + " failed: " + errorText(code));
}

void finalizeAtExit() {
  if (!gEndedNormally.load()) return;  // a rank failed: leave without MPI_Finalize, mpirun ends the job
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

World initialize() {
  std::lock_guard<std::mutex> lock(gMu);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw BackendError("MPI was already finalized in this process: an MPI-launched worker bootstraps its "
                       "sessions before MPI_Finalize");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // Sessions may be created on any thread, one at a time.
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    gOwnsMpi = true;
    std::atexit(finalizeAtExit);
  }
  gEndedNormally.store(false);
  // Errors come back as codes (and become exceptions) instead of aborting the job on the spot.
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  World world;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &world.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &world.size), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  check(MPI_Comm_rank(node, &world.local_rank), "MPI_Comm_rank(node)");
  check(MPI_Comm_size(node, &world.local_size), "MPI_Comm_size(node)");
  MPI_Comm_free(&node);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS)
    world.processor_name.assign(name, static_cast<size_t>(len));
  return world;
}

std::string broadcastFromRoot(const std::string& value) {
  long long size = static_cast<long long>(value.size());
  check(MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD), "MPI_Bcast(length)");
  std::vector<char> buffer(value.begin(), value.end());
  buffer.resize(static_cast<size_t>(size));
  if (size > 0) {
    check(MPI_Bcast(buffer.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast(value)");
  }
  return std::string(buffer.begin(), buffer.end());
}

void sessionEnded(bool normally) {
  std::lock_guard<std::mutex> lock(gMu);
  if (gOwnsMpi) gEndedNormally.store(normally);
}

}  // namespace ddpl::worker::mpi
