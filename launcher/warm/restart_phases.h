#pragma once
// Where a restart's seconds go (docs/warm-restarts.md): from the first failure of a group to the
// first step every rank of the next group completed, split into the phases launch can see; and
// the incident table built on it (issue 48: "where each lost second went"): per restart, what
// ended the group, how long the failure took to be seen, which checkpoint the next group
// restored and from where, how many steps it recomputed and when it was back where it had been.
// Pure: the agent feeds it times (seconds since the epoch) and its ranks' heartbeats; it says
// when a restart is complete and how to report it. tests/unit/restart_phases_test.cc drives it.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddpl::launcher::warm {

// Where a rank's checkpoint came from (common/heartbeat.h, kHeartbeatRestoreSourceOffset).
enum class RestoreSource { kNone = 0, kMemory = 1, kPeer = 2, kDisk = 3 };
// A worker's code (a number it wrote): anything but 1..3 is kNone.
RestoreSource restoreSourceFromCode(uint64_t code);
const char* restoreSourceName(RestoreSource s);  // "none", "memory", "peer", "disk"

// One rank of the current group as its heartbeat reads.
struct RankSteps {
  uint64_t steps = 0;     // the step count it reported (0: none yet)
  uint64_t restored = 0;  // the step it restored plus one (0: none restored)
  RestoreSource source = RestoreSource::kNone;
};

struct RestartRecord {
  int restart = 0;         // 1 for the first restart of the run
  std::string cause;       // what ended the group, as launch saw it (short)
  double failed = 0;       // the group's first failure (a worker's exit, or a hang) was seen
  double detect = -1;      // seconds from this node's last step to `failed` (< 0: no step seen)
  double stopped = 0;      // every worker of that group had exited
  double formed = 0;       // the rendezvous gave the next group its world
  double started = 0;      // every worker of the next group was running its program
  double first_step = 0;   // every rank of the next group had completed a step (0: none did)
  double restore = 0;      // of that: the longest any rank spent reading its checkpoint
  int warm = 0, cold = 0;  // how the next group's workers started
  uint64_t before = 0;     // the failed group's highest global step on this node
  std::optional<uint64_t> restored;  // the step the next group restored (none: from scratch)
  RestoreSource source = RestoreSource::kNone;  // the farthest any rank read from
  double back = 0;   // the next group's global step reached `before` again (0: not yet)
  double ended = 0;  // the next group ended (or failed) before that: the row is "not back"

  // "stop 0.01s, re-form 0.02s, start 0.03s (4 warm), first step 0.41s (checkpoint read
  // 0.05s): 0.47s in all".
  std::string describe() const;
  double total() const { return (first_step > 0 ? first_step : started) - failed; }
  // Steps done before the failure that the next group did again.
  uint64_t recomputed() const;
  // The row is final: back, or its group ended first.
  bool complete() const { return back > 0 || ended > 0; }
  // detect + from the failure to `back` (or, not back, to where the row ended: a lower bound).
  double lost() const;
};

class RestartClock {
 public:
  // Rows kept for the table (the oldest dropped past it; the totals count them all).
  static constexpr size_t kMaxKept = 1000;
  static constexpr size_t kMaxCauseBytes = 96;

  // The group failed (only the first failure of a group counts); `cause` says how.
  void onFailure(double t, std::string cause = "");
  // Every worker of the failed group exited.
  void onStopped(double t);
  // The next group's world is known.
  void onFormed(double t);
  // The next group's workers all started; a first start (no failure before) opens nothing.
  void onStarted(double t, int warm, int cold);
  // The current group's ranks, by local rank, read at `t` (every --monitor-interval, whatever
  // the stage: the last step and the highest step are followed all along), and the longest
  // time one spent restoring from a checkpoint. Returns the restart whose next group just
  // completed its first step (every rank stepped at least once since the group started), once.
  //
  // A rank's global step: its restored step plus the count it reported in this attempt, unless
  // it reports absolute steps itself (ddplaunch.step(n) with the step it resumed at plus one:
  // docs/checkpoints.md's loop). Which of the two is decided once per rank and group, at its
  // first reading with a step: a count above the restored step is absolute (a loop resumed at
  // R reports R+1 first; one counting from 1 would have had to make more than R steps within a
  // --monitor-interval of its restore to look the same).
  std::optional<RestartRecord> onReadings(double t, const std::vector<RankSteps>& ranks,
                                          double restore_seconds = 0);
  // The group in progress ended (the run's end, at `t`): a restart whose group had not stepped
  // is complete with no first step (returned once, or nullopt when none was open); a row not
  // back yet stays "not back".
  std::optional<RestartRecord> onGroupEnded(double t = 0);

  // A restarted group has started and not every rank has stepped yet.
  bool awaitingFirstStep() const { return stage_ == Stage::kStarted; }
  // The first group's start (0: none yet): the run's wall time counts from it.
  double firstStarted() const { return first_started_; }
  const std::deque<RestartRecord>& completed() const { return done_; }
  // A row was added or completed since the last call.
  bool takeChanged() { return std::exchange(changed_, false); }
  // One line for the end-of-run summary: each restart's phases, or "" when none happened.
  std::string summary() const;
  // The incident table (header, a row per restart, the totals), "" when none happened; the
  // newest `max_rows` rows at most, with a line for the rest. `wall_seconds` > 0: the totals
  // say which share of it was lost.
  std::string incidentTable(double wall_seconds = 0, size_t max_rows = kMaxKept) const;

 private:
  enum class Stage { kNone, kFailed, kStopped, kFormed, kStarted };
  void startGroup();
  void push(const RestartRecord& r);
  void trackGroup(double t, const std::vector<RankSteps>& ranks);
  // Local rank i's global step as its reading `k` says, by the rule onReadings describes (its
  // mode decided).
  uint64_t globalStep(size_t i, const RankSteps& k) const;
  void endBackWait(double t);

  Stage stage_ = Stage::kNone;
  RestartRecord open_;
  int restarts_ = 0;
  std::deque<RestartRecord> done_;
  size_t dropped_ = 0;         // rows dropped past kMaxKept
  double dropped_lost_ = 0;    // their lost seconds
  bool dropped_open_ = false;  // one of them was never back
  bool back_open_ = false;     // done_.back() waits for its group to be back
  bool changed_ = false;
  double first_started_ = 0;
  // The current group, by local rank: the last count read, and how its steps count (0: not
  // decided yet, 1: absolute, 2: from the restored step).
  std::vector<uint64_t> last_count_;
  std::vector<int> mode_;
  double last_step_ = 0;  // a reading found a rank's count changed (0: none in this group)
  uint64_t highest_ = 0;  // the group's highest global step
};

}  // namespace ddpl::launcher::warm
