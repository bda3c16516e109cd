#pragma once
// What both multi-node backends (grpc_rendezvous.h, etcd/etcd_rendezvous.h) read to form rounds
// and to carry the job's outcome; each backend's own settings extend it.
#include <chrono>
#include <string>

#include "common/defaults.h"

namespace ddpl::launcher {

struct RoundsConfig {
  std::string run_id;
  std::string node_id;     // unique per agent (host name and pid)
  std::string local_addr;  // empty: the address of the interface that reaches the endpoint
  int local_world_size = 1;
  int min_nodes = 1;
  int max_nodes = 1;
  // Once the job-wide failure count passes this, the job has failed: no node joins again.
  int max_restarts = 0;
  std::chrono::milliseconds join_timeout{defaults::kJoinTimeout};
  std::chrono::milliseconds last_call_timeout{defaults::kLastCallTimeout};
  std::chrono::milliseconds read_timeout{std::chrono::seconds(60)};  // connect + store calls
  std::chrono::milliseconds exit_barrier_timeout{std::chrono::seconds(300)};
};

}  // namespace ddpl::launcher
