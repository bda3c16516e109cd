#pragma once
// The agent's hang handling: HangWatch (below) finds ranks of this node that make no progress
// past their limits; HangResponder is what the agent then does: says which ones and where every
// rank stands, has every node's stacks saved (StacksService), names the likely culprit
// (hang_report.h: from the stacks and torch's flight recorder), and hands the loop the failures to
// record, culprits first. It changes nothing of the loop's: the loop records the failures and
// asks the supervisor to stop the group.
//
// Threads: the agent's loop thread only (both classes).
#include <sys/types.h>

#include <functional>
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

// The agent's hang handling (issue 18), beside the responder it starts: each monitor tick it
// feeds the HangDetector (health/progress.h) what the loop read of every live rank; when ranks
// pass their limits, the loop marks them and calls respond(), which has every node's stacks
// saved (StacksService, on its own thread) and hands the loop the failures to record. It asks
// the supervisor nothing: the loop does, with what found() gives it.
//
// Threads: the agent's loop thread only; the stacks' results come back on it (EventLoop::post).
class HangWatch {
 public:
  // One live rank as a monitor tick reads it.
  struct Sample {
    int local_rank = 0;
    pid_t pid = -1;
    uint64_t step = 0;               // its heartbeat's (0: none yet, or no heartbeat)
    uint64_t output_bytes = 0;       // written so far (OutputRouter::bytesFrom)
    bool finished_stepping = false;  // HeartbeatChannel::finishedStepping
  };
  // What the loop is told of a response, on the loop thread. Neither call comes once `ended`
  // says the run is over: what the stacks thread still hands back changes nothing then.
  struct Hooks {
    std::function<bool()> ended;
    std::function<void(const std::string& text)> saved;     // this node's stacks, saved
    std::function<void(std::vector<FailureDetail>)> found;  // culprits first
  };

  HangWatch(HangOptions options, std::string host);

  // Hang detection is on (not --hang-timeout=0) and no response is waiting for stacks (the
  // group is about to stop then: no second response).
  bool watching() const;
  void startGroup(int nproc, double now);
  void onExit(int local_rank);
  // The ranks past their limits at `now`, from this tick's samples of the live ranks; CPU time
  // is read only with --hang-timeout (it counts for ranks without steps).
  std::vector<Hang> check(const std::vector<Sample>& live, double now);
  // Starts the response to `hangs` (HangResponder::begin's arguments), the stacks taken by
  // `stacks`.
  void respond(const std::vector<Hang>& hangs, double now, std::vector<WorkerState> workers,
               std::string attempt_dir, int group_rank, const ProgressTracker& progress,
               web::MetricsEndpoint* metrics, StacksService& stacks, Hooks hooks);

 private:
  HangOptions options_;
  HangDetector detector_;
  HangResponder responder_;
  std::vector<uint64_t> output_seen_;  // bytes of each local rank's output at the last tick
};

}  // namespace ddpl::launcher
