#pragma once
// Where a restart's seconds go (docs/warm-restarts.md): from the first failure of a group to the
// first step every rank of the next group completed, split into the phases launch can see.
// Pure: the agent feeds it times (seconds since the epoch) and step counts; it says when a
// restart is complete and how to report it. tests/unit/restart_phases_test.cc drives it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddpl::launcher::warm {

struct RestartRecord {
  int restart = 0;         // 1 for the first restart of the run
  double failed = 0;       // the group's first failure (a worker's exit, or a hang) was seen
  double stopped = 0;      // every worker of that group had exited
  double formed = 0;       // the rendezvous gave the next group its world
  double started = 0;      // every worker of the next group was running its program
  double first_step = 0;   // every rank of the next group had completed a step (0: none did)
  double restore = 0;      // of that: the longest any rank spent reading its checkpoint
  int warm = 0, cold = 0;  // how the next group's workers started

  // "stop 0.01s, re-form 0.02s, start 0.03s (4 warm), first step 0.41s (checkpoint read
  // 0.05s): 0.47s in all".
  std::string describe() const;
  double total() const { return (first_step > 0 ? first_step : started) - failed; }
};

class RestartClock {
 public:
  // The group failed (only the first failure of a group counts).
  void onFailure(double t);
  // Every worker of the failed group exited.
  void onStopped(double t);
  // The next group's world is known.
  void onFormed(double t);
  // The next group's workers all started; a first start (no failure before) opens nothing.
  void onStarted(double t, int warm, int cold);
  // The step counts of the current group's ranks, read at `t`, and the longest time one spent
  // restoring from a checkpoint. Returns the restart that just completed (every rank stepped at
  // least once since the group started), once.
  std::optional<RestartRecord> onSteps(double t, const std::vector<uint64_t>& steps,
                                       double restore_seconds = 0);
  // The group in progress ended before all of its ranks stepped: its restart is complete with no
  // first step (returned once, or nullopt when none was open).
  std::optional<RestartRecord> onGroupEnded();

  // A restarted group has started and not every rank has stepped yet: onSteps has work to do.
  bool awaitingFirstStep() const { return stage_ == Stage::kStarted; }
  const std::vector<RestartRecord>& completed() const { return done_; }
  // One line for the end-of-run summary: each restart's phases, or "" when none happened.
  std::string summary() const;

 private:
  enum class Stage { kNone, kFailed, kStopped, kFormed, kStarted };
  Stage stage_ = Stage::kNone;
  RestartRecord open_;
  int restarts_ = 0;
  std::vector<RestartRecord> done_;
};

}  // namespace ddpl::launcher::warm
