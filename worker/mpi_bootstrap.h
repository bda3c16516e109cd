#pragma once
// The MPI side of a worker's bootstrap (worker/session.cc uses it when mpirun or srun started
// the process): MPI_Init once per process, the world as MPI sees it, and a string broadcast
// from rank 0. Torch-free, and <mpi.h> stays in the .cc. Built only with DDPL_WITH_MPI.
#include <string>

namespace ddpl::worker::mpi {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks on this node (MPI_COMM_TYPE_SHARED, in world-rank order)
  int local_size = 1;
  std::string processor_name;
};

// Initialises MPI unless the program already did (then its MPI is used as it is) and returns
// MPI_COMM_WORLD's shape. Throws BackendError naming the MPI error when MPI cannot start or
// was already finalized in this process.
World initialize();

// Rank 0's `value` on every rank: a collective over MPI_COMM_WORLD.
std::string broadcastFromRoot(const std::string& value);

// Called when a session that bootstrapped through MPI ends. After a normal end, MPI is
// finalized at process exit (when we initialised it); after a failure it is not, the process
// leaves without MPI_Finalize and mpirun ends the whole job instead of letting the healthy ranks
// wait for the dead one.
void sessionEnded(bool normally);

}  // namespace ddpl::worker::mpi
