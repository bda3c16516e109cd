#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launcher/membership/embedded_store.h"
#include "launcher/membership/ports.h"
#include "launcher/membership/rendezvous_handler.h"

namespace ddpl::launcher {

// Static rendezvous, as torchrun's: no agent talks to another. One node: every rank is local and
// MASTER_PORT is a free port picked per attempt unless the user fixed one (then it must be
// free, or we say so). Several nodes (--nnodes=N --node-rank=R): each node computes its ranks
// as R * nproc, so every node must run the same --nproc-per-node, and MASTER_ADDR:MASTER_PORT
// (default 29500) is node 0's.
class LocalRendezvous : public RendezvousHandler {
 public:
  // `store`, when given, is started for the first attempt. `store_env`: its endpoint and
  // token are handed to workers (DDPL_STORE_*, --standalone). When it serves torch's TCPStore
  // protocol (the agent store), MASTER_ADDR:MASTER_PORT is its endpoint and each attempt opens
  // a fresh namespace in it before the attempt's workers start.
  LocalRendezvous(std::string run_id, int local_world_size, std::string master_addr,
                  std::optional<int> master_port, EmbeddedStore* store = nullptr, int node_rank = 0,
                  int nnodes = 1, bool store_env = true);
  // Membership. Static rounds never end under us, no node is fenced or evicted, and no other
  // node waits for this one: nothing to leave early, nobody to tell of a preflight or of a
  // stop before joining (static nodes never meet).
  void startRendezvous(Done done) override;
  void setRoundEndedCallback(RoundEnded) override {}
  std::optional<double> fencedStopWithin(int64_t) override { return std::nullopt; }
  bool roundStillCurrent() override { return true; }
  void leaveEarly() override {}
  void workersStarted() override;
  void publishPreflight(const std::string&) override {}
  void stopBeforeJoining(const std::string&) override {}
  std::string describe() const override;

  // JobOutcome: this node's own count; no other node fails or waits at the end.
  int recordFailure(const std::string&) override { return ++failures_; }
  std::string jobFailure() override { return ""; }
  bool finish(bool) override { return true; }

  // HealthBus and NodeValues: no other node to tell or ask (a request for every node's stacks
  // has id 0: none).
  void publishStatus(const std::string&) override {}
  std::vector<std::string> otherNodesStatus() override { return {}; }
  void setStacksRequestedCallback(StacksRequested) override {}
  int64_t requestStacks(const std::string&) override { return 0; }
  void answerStacks(int64_t, const std::string&) override {}
  StacksAnswers stacksAnswers(int64_t) override { return {}; }
  void publishNodeValue(const std::string&, const std::string&) override {}
  std::optional<std::string> nodeValue(const std::string&, int) override { return std::nullopt; }

  // The world of the next attempt, synchronously (what startRendezvous reports).
  WorldAssignment nextWorld();

 private:
  std::string run_id_;
  int local_world_size_;
  std::string master_addr_;
  std::optional<int> master_port_;
  EmbeddedStore* store_;
  int node_rank_, nnodes_;
  bool store_env_;
  int failures_ = 0;
  int64_t round_ = 0;
  // One node: its rounds are this launch's attempts, numbered from when it started (the fencing
  // epoch, so that a later launch into the same checkpoint directory counts above it). Static
  // nodes count their attempts each on its own: no epoch, no fence.
  int64_t epoch_ms_ = 0;
};

}  // namespace ddpl::launcher
