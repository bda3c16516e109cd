#pragma once
// Recognises a process started by an MPI launcher from the variables it sets, and decides how
// a worker bootstraps. Torch-free and MPI-free (tests/unit/mpi_env_test.cc runs it on plain
// maps); the MPI calls themselves live in worker/mpi_bootstrap.cc.
//
//   OpenMPI's mpirun    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   MPICH's hydra (PMI) PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   PMIx (prterun, srun --mpi=pmix)  PMIX_RANK (the size comes from MPI_Comm_size)
//   Slurm's srun        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (only inside a job step:
//                       SLURM_STEP_ID set, so a batch script's own process is not a rank)
#include "common/environment.h"
#include <map>
#include <optional>
#include <string>

namespace ddpl::worker {

using Environment = ddpl::Environment;

// DDPL_BOOTSTRAP: auto (default: the torchrun variables when present, else MPI when an MPI
// launcher started us), env (never MPI), mpi (an MPI launch is required).
enum class BootstrapMode { kAuto, kEnv, kMpi };
BootstrapMode parseBootstrapMode(const std::string& name);

struct MpiLaunch {
  std::string source;  // "OpenMPI", "PMI", "PMIx" or "Slurm": whose variables were read
  int rank = 0;
  std::optional<int> world_size;  // unknown with PMIx alone: MPI_Comm_size tells
  std::optional<int> local_rank;  // unknown: computed from MPI's shared-memory split
  std::optional<int> local_world_size;
  // The variables read, for messages: "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 ...".
  std::string variables;
};

// The MPI launch described by `env`, or nullopt when no MPI launcher's variables are present.
// A partial or inconsistent set (a rank without a size, rank >= size, a local rank outside
// the local size, a non-number) is an InvalidArgument naming the variables.
std::optional<MpiLaunch> detectMpiLaunch(const Environment& env);

}  // namespace ddpl::worker
