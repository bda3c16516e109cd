#pragma once
// The seam between supervision and membership: the agent asks for a world before each attempt.
// One node uses LocalRendezvous; multi-node plugs the gRPC rendezvous client in here.
#include <map>
#include <string>

namespace ddpl::launcher {

struct WorldAssignment {
  std::string run_id;
  int round = 0;
  int group_rank = 0;        // this node's rank among nodes
  int group_world_size = 1;  // number of nodes
  int rank_offset = 0;       // global rank of this node's local rank 0
  int world_size = 1;        // sum of every node's local world size
  std::string master_addr;   // where rank 0's store listens
  int master_port = 0;
  // Added to every worker's environment for this attempt (the store endpoint, for example).
  std::map<std::string, std::string> worker_env;
};

class RendezvousHandler {
 public:
  virtual ~RendezvousHandler() = default;
  // Blocks (bounded by the handler's own timeouts) until this node belongs to a complete world.
  virtual WorldAssignment nextRendezvous(int attempt) = 0;
  virtual std::string describe() const = 0;
};

}  // namespace ddpl::launcher
