#pragma once
// The launcher's supervision state machine: pure logic, no processes, no clock of its own. The
// agent (launcher/agent/agent.h) feeds it events and carries out the actions it returns, which
// makes every restart and shutdown path testable deterministically (tests/unit/supervisor_test.cc).
#include <string>
#include <vector>

namespace ddpl::launcher {

// How a process ended, as waitpid tells it.
// launch's exit code when the job ended because a rank hung (made no progress past its
// limit), as timeout(1)'s: a Kubernetes podFailurePolicy can match it.
inline constexpr int kHangExitCode = 124;

struct ExitStatus {
  bool signaled = false;
  int value = 0;      // exit code, or the signal number when signaled
  bool hung = false;  // no exit: launch found the worker hung (value is kHangExitCode)

  static ExitStatus fromWaitStatus(int wstatus);
  bool success() const { return !signaled && value == 0; }
  // The shell's convention: 128+N for signal N.
  int shellCode() const { return signaled ? 128 + value : value; }
  std::string describe() const;  // "exit code 3" / "signal 9 (SIGKILL)"
};

struct WorkerExit {
  int local_rank = 0;
  int pid = 0;
  ExitStatus status;
  double unix_time = 0;        // when it was observed, for the report
  bool stopped_by_us = false;  // exited after the launcher asked the group to stop
};

// kRendezvous: waiting for a world (a round); kRecording: a failure is being published to the
// job (multi-node: every node must learn it) before deciding to restart or give up.
enum class Phase { kIdle, kRendezvous, kRunning, kStopping, kRecording, kDone };
enum class StopReason {
  kNone,
  kWorkerFailed,
  kSignal,
  kMembershipChange,
  kRendezvousFailed,
  kJobFailedElsewhere
};

struct Action {
  enum class Kind {
    kStartRendezvous,   // ask the rendezvous for the next world (async; answer comes as an event)
    kStartGroup,        // value: attempt number (restart count)
    kRecordFailure,     // publish this node's failure; answer comes as onFailureRecorded
    kTerminateAll,      // value: signal to send to every live worker's process group
    kKillAll,           // SIGKILL to every live worker's process group
    kForwardSignal,     // value: signal, sent to every live worker; no state change
    kArmShutdownTimer,  // start the --shutdown-timeout grace period
    kExit,              // value: the launcher's exit code
  };
  Kind kind;
  int value = 0;
  bool operator==(const Action& o) const { return kind == o.kind && value == o.value; }
};

class Supervisor {
 public:
  struct Config {
    int nproc = 1;
    int max_restarts = 0;
    std::vector<int> stop_signals;  // signals that stop the job (others are only forwarded)
  };

  explicit Supervisor(Config config);

  std::vector<Action> start();
  // A world was assigned. `job_restarts` is the job-wide count of worker-group failures so far
  // (the same on every node); more than max_restarts means the job already failed elsewhere.
  std::vector<Action> onRendezvousComplete(int job_restarts);
  std::vector<Action> onRendezvousFailed();
  // The round this node runs in ended (a node died, left, or waits to join): stop and re-join
  // without consuming a restart.
  std::vector<Action> onMembershipChange();
  // Instead of publishing the failure: this node's round had already ended (it was evicted),
  // so the workers died of the membership change. Re-join without using a restart.
  std::vector<Action> onFailureOutlivedRound();
  // The job-wide failure count after this node's failure was published.
  std::vector<Action> onFailureRecorded(int job_restarts);
  std::vector<Action> onWorkerExit(int local_rank, int pid, ExitStatus status, double unix_time);
  // A worker made no progress past its limit: a failure of that worker, as if it had exited
  // with kHangExitCode (it is stopped with the others).
  std::vector<Action> onWorkerHung(int local_rank, int pid, double unix_time);
  std::vector<Action> onSignal(int signo);
  std::vector<Action> onShutdownTimeout();

  Phase phase() const { return phase_; }
  StopReason stopReason() const { return reason_; }
  int restartCount() const { return restart_count_; }
  int liveWorkers() const;
  bool isLive(int local_rank) const { return live_[local_rank]; }
  int exitCode() const { return exit_code_; }
  int stopSignal() const { return stop_signal_; }

  // Failures of every attempt, in the order observed; the first entry of the final attempt
  // whose stopped_by_us is false is the root cause.
  const std::vector<std::vector<WorkerExit>>& failuresByAttempt() const { return failures_; }
  const WorkerExit* rootCause() const;

 private:
  std::vector<Action> finishStopIfIdle();
  void beginAttempt();

  Config config_;
  Phase phase_ = Phase::kIdle;
  StopReason reason_ = StopReason::kNone;
  int stop_signal_ = 0;
  int restart_count_ = 0;
  int exit_code_ = 0;
  std::vector<bool> live_;
  std::vector<std::vector<WorkerExit>> failures_;
};

}  // namespace ddpl::launcher
