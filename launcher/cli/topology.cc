#include <fmt/format.h>

#include "launcher/cli/cli.h"
#include "launcher/cli/values.h"

namespace ddpl::launcher {
using cli::checkRunId;
using cli::endpointPort;

void validateTopology(LaunchOptions& o) {
  if (o.elastic() && !o.rdzv_endpoint.empty() && o.rdzv_endpoint.find(',') == std::string::npos &&
      o.rdzv_endpoint.find("://") == std::string::npos &&
      endpointPort("--rdzv-endpoint", o.rdzv_endpoint) == 0) {
    // torchrun binds a free port for HOST:0; only a job of one node can use it, as no other
    // node could learn the port. That job is --standalone's: its own rendezvous, a free port.
    if (o.rdzv_backend == "etcd")
      throw UsageError(
          fmt::format("--rdzv-endpoint {}: port 0 picks a free port, which only "
                      "works for c10d on one node; give etcd's port",
                      o.rdzv_endpoint));
    if (o.nnodes_max != 1)
      throw UsageError(fmt::format(
          "--rdzv-endpoint {}: port 0 picks a free port on this node, which the other nodes of "
          "--nnodes={}:{} could not find; give a fixed port (default {})",
          o.rdzv_endpoint, o.nnodes_min, o.nnodes_max, kDefaultRdzvPort));
    o.rdzv_backend = "static";
    o.rdzv_endpoint.clear();
    o.standalone = true;
  }
  if (!o.rdzv_id.empty()) checkRunId("--rdzv-id", o.rdzv_id);  // also one Slurm's defaults made
  if (o.elastic()) {
    if (o.rdzv_endpoint.empty())
      throw UsageError(
          fmt::format("--rdzv-backend={} needs --rdzv-endpoint HOST[:PORT] (the node "
                      "that hosts the rendezvous, or an rdzv-server)",
                      o.rdzv_backend));
    if (o.standalone)
      throw UsageError(
          "--standalone picks its own rendezvous: drop --rdzv-backend/--rdzv-endpoint");
    return;
  }
  if (!o.rdzv_endpoint.empty() && !o.standalone)
    throw UsageError(
        "--rdzv-endpoint is for --rdzv-backend=c10d (or ddpl); the static backend "
        "uses --master-addr/--master-port");
  if (o.nnodes_min != o.nnodes_max)
    throw UsageError(
        fmt::format("--nnodes={}:{} is elastic: add --rdzv-backend=c10d "
                    "--rdzv-endpoint HOST[:PORT] (static jobs have a fixed size)",
                    o.nnodes_min, o.nnodes_max));
  if (o.node_rank >= o.nnodes_max)
    throw UsageError(fmt::format("--node-rank={} but the job has {} node(s): node ranks are 0..{}",
                                 o.node_rank, o.nnodes_max, o.nnodes_max - 1));
}

}  // namespace ddpl::launcher
