#pragma once
// What the agent does when ranks of this node make no progress past their limits: says which
// ones and where every rank stands, has every node's stacks saved (StacksService), names the
// likely culprit (hang_report.h: from the stacks and torch's flight recorder), and hands the
// loop the failures to record, culprits first. It changes nothing of the loop's: the loop
// records the failures and asks the supervisor to stop the group.
//
// Threads: the agent's loop thread only.
#include <string>
#include <vector>

#include "launcher/agent/error_report.h"
#include "launcher/agent/stacks_service.h"
#include "launcher/agent/worker_state.h"
#include "launcher/health/progress.h"
#include "web/metrics.h"

namespace ddpl::launcher {

class HangResponder {
 public:
  explicit HangResponder(std::string host) : host_(std::move(host)) {}

  // Whether a response waits for stacks: hang checks wait for it, as the group stops after it.
  bool busy() const { return busy_; }
  // Starts a response: logs the hung ranks and every rank's last step, and returns what the
  // other nodes are told when asked for their stacks.
  std::string begin(const std::vector<Hang>& hangs, double now, std::vector<WorkerState> workers,
                    std::string attempt_dir, int group_rank, const ProgressTracker& progress,
                    web::MetricsEndpoint* metrics);
  // This node's stacks are saved: logs the likely culprit and each rank's innermost frames.
  void onStacksSaved(const HangStacks& stacks);
  // Every node's stacks are in: logs the other nodes' answers and returns the failures to
  // record, one per hung rank, likely culprits first (the first is the report's root cause).
  std::vector<FailureDetail> finish(const HangStacks& stacks);

 private:
  std::string stacksFile(int local_rank) const;
  int globalRank(int local_rank) const;

  std::string host_;
  bool busy_ = false;
  std::vector<Hang> hangs_;
  double now_ = 0;
  std::vector<WorkerState> workers_;  // by local rank, as they were when the hang was found
  std::string attempt_dir_;
  std::vector<int> outside_;  // local ranks the report names as likely culprits (hang_report.h)
};

}  // namespace ddpl::launcher
