#include "launcher/membership/local_rendezvous.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/errors.h"
#include "launcher/cli/options.h"
#include "launcher/membership/ports.h"

namespace ddpl::launcher {
LocalRendezvous::LocalRendezvous(std::string run_id, int local_world_size, std::string master_addr,
                                 std::optional<int> master_port, EmbeddedStore* store,
                                 int node_rank, int nnodes, bool store_env)
    : run_id_(std::move(run_id)),
      local_world_size_(local_world_size),
      master_addr_(std::move(master_addr)),
      master_port_(master_port),
      store_(store),
      node_rank_(node_rank),
      nnodes_(nnodes),
      store_env_(store_env) {
  if (nnodes_ == 1)
    epoch_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
}

void LocalRendezvous::startRendezvous(Done done) {
  try {
    done(nextWorld(), "");
  } catch (const std::exception& e) {
    done(std::nullopt, e.what());
  }
}

WorldAssignment LocalRendezvous::nextWorld() {
  // The same place the multi-node backends fill, here from the static layout: every node has
  // local_world_size workers.
  rdzv::round_rules::NodePlace place;
  place.round = round_++;
  place.epoch_ms = epoch_ms_;
  place.group_rank = node_rank_;
  place.group_world_size = nnodes_;
  place.rank_offset = node_rank_ * local_world_size_;
  place.world_size = local_world_size_ * nnodes_;
  WorldAssignment w;
  static_cast<rdzv::round_rules::NodePlace&>(w) = place;
  w.run_id = run_id_;
  w.restart_count = failures_;
  w.master_addr = master_addr_;
  if (store_ && store_->tcpstore()) {
    store_->beginAttempt(w.round);
    w.agent_store = true;
    w.master_addr = store_->host();
    w.master_port = store_->port();
  } else if (nnodes_ > 1) {
    w.master_port = master_port_.value_or(kDefaultMasterPort);  // node 0's, maybe elsewhere
  } else if (master_port_) {
    checkPortFree(master_addr_, *master_port_);
    w.master_port = *master_port_;
  } else {
    w.master_port = pickFreePort(master_addr_);
  }
  if (store_ && store_env_) w.worker_env = store_->workerEnv(run_id_, static_cast<int>(w.round));
  return w;
}

std::string LocalRendezvous::describe() const {
  if (store_ && store_->tcpstore())
    return fmt::format("static (node {}/{}, {} workers, agent store on {})", node_rank_, nnodes_,
                       local_world_size_, store_->endpoint());
  return fmt::format("static (node {}/{}, {} workers, MASTER_ADDR {})", node_rank_, nnodes_,
                     local_world_size_, master_addr_);
}

void LocalRendezvous::workersStarted() {
  if (store_) store_->startServing();
}

}  // namespace ddpl::launcher
