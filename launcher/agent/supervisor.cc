#include "launcher/agent/supervisor.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>

#include "common/signals.h"

namespace ddpl::launcher {

ExitStatus ExitStatus::fromWaitStatus(int wstatus) {
  if (WIFSIGNALED(wstatus)) return {true, WTERMSIG(wstatus)};
  return {false, WEXITSTATUS(wstatus)};
}

std::string ExitStatus::describe() const {
  if (hung) return "hung (no progress within its limit)";
  if (!signaled) return fmt::format("exit code {}", value);
  return describeSignal(value);
}

Supervisor::Supervisor(Config config) : config_(std::move(config)) {
  live_.assign(static_cast<size_t>(config_.nproc), false);
}

int Supervisor::liveWorkers() const {
  return static_cast<int>(std::count(live_.begin(), live_.end(), true));
}

void Supervisor::beginAttempt() {
  std::fill(live_.begin(), live_.end(), true);
  failures_.emplace_back();
  phase_ = Phase::kRunning;
  reason_ = StopReason::kNone;
}

std::vector<Action> Supervisor::start() {
  phase_ = Phase::kRendezvous;
  return {{Action::Kind::kStartRendezvous, 0}};
}

std::vector<Action> Supervisor::onRendezvousComplete(int job_restarts) {
  if (phase_ != Phase::kRendezvous) return {};
  if (job_restarts > config_.max_restarts) {
    phase_ = Phase::kDone;
    reason_ = StopReason::kJobFailedElsewhere;
    exit_code_ = 1;
    return {{Action::Kind::kExit, exit_code_}};
  }
  restart_count_ = job_restarts;
  beginAttempt();
  return {{Action::Kind::kStartGroup, restart_count_}};
}

std::vector<Action> Supervisor::onRendezvousFailed() {
  if (phase_ != Phase::kRendezvous) return {};
  phase_ = Phase::kDone;
  reason_ = StopReason::kRendezvousFailed;
  exit_code_ = 1;
  return {{Action::Kind::kExit, exit_code_}};
}

std::vector<Action> Supervisor::onMembershipChange() {
  if (phase_ != Phase::kRunning) return {};
  phase_ = Phase::kStopping;
  reason_ = StopReason::kMembershipChange;
  return {{Action::Kind::kTerminateAll, SIGTERM}, {Action::Kind::kArmShutdownTimer, 0}};
}

std::vector<Action> Supervisor::onFailureOutlivedRound() {
  if (phase_ != Phase::kRecording) return {};
  phase_ = Phase::kRendezvous;
  reason_ = StopReason::kMembershipChange;
  // The exits were the round's end, not failures: none may become a root cause later.
  for (auto& f : failures_.back()) f.stopped_by_us = true;
  return {{Action::Kind::kStartRendezvous, 0}};
}

std::vector<Action> Supervisor::onFailureRecorded(int job_restarts) {
  if (phase_ != Phase::kRecording) return {};
  if (job_restarts > config_.max_restarts) {
    phase_ = Phase::kDone;
    const WorkerExit* root = rootCause();
    exit_code_ = root ? root->status.shellCode() : 1;
    if (exit_code_ == 0) exit_code_ = 1;
    return {{Action::Kind::kExit, exit_code_}};
  }
  phase_ = Phase::kRendezvous;
  return {{Action::Kind::kStartRendezvous, 0}};
}

const WorkerExit* Supervisor::rootCause() const {
  for (auto it = failures_.rbegin(); it != failures_.rend(); ++it)
    for (const auto& f : *it)
      if (!f.stopped_by_us) return &f;
  return nullptr;
}

std::vector<Action> Supervisor::onWorkerExit(int local_rank, int pid, ExitStatus status,
                                             double unix_time) {
  if (local_rank < 0 || local_rank >= config_.nproc || !live_[local_rank]) return {};
  live_[local_rank] = false;
  if (phase_ == Phase::kRunning) {
    if (status.success()) {
      if (liveWorkers() > 0) return {};
      phase_ = Phase::kDone;
      exit_code_ = 0;
      return {{Action::Kind::kExit, 0}};
    }
    failures_.back().push_back({local_rank, pid, status, unix_time, false});
    reason_ = StopReason::kWorkerFailed;
    phase_ = Phase::kStopping;
    if (liveWorkers() == 0) return finishStopIfIdle();
    return {{Action::Kind::kTerminateAll, SIGTERM}, {Action::Kind::kArmShutdownTimer, 0}};
  }
  if (phase_ == Phase::kStopping) {
    if (!status.success()) failures_.back().push_back({local_rank, pid, status, unix_time, true});
    return finishStopIfIdle();
  }
  return {};
}

std::vector<Action> Supervisor::onWorkerHung(int local_rank, int pid, double unix_time) {
  if (phase_ != Phase::kRunning || local_rank < 0 || local_rank >= config_.nproc ||
      !live_[local_rank])
    return {};
  failures_.back().push_back(
      {local_rank, pid, ExitStatus{false, kHangExitCode, true}, unix_time, false});
  reason_ = StopReason::kWorkerFailed;
  phase_ = Phase::kStopping;
  return {{Action::Kind::kTerminateAll, SIGTERM}, {Action::Kind::kArmShutdownTimer, 0}};
}

std::vector<Action> Supervisor::finishStopIfIdle() {
  if (liveWorkers() > 0) return {};
  if (reason_ == StopReason::kWorkerFailed) {
    // Whether to restart is the job's decision, made on the job-wide count.
    phase_ = Phase::kRecording;
    return {{Action::Kind::kRecordFailure, 0}};
  }
  if (reason_ == StopReason::kMembershipChange) {
    phase_ = Phase::kRendezvous;
    return {{Action::Kind::kStartRendezvous, 0}};
  }
  phase_ = Phase::kDone;
  if (reason_ == StopReason::kSignal) {
    exit_code_ = 128 + stop_signal_;
  } else {
    const WorkerExit* root = rootCause();
    exit_code_ = root ? root->status.shellCode() : 1;
    if (exit_code_ == 0) exit_code_ = 1;
  }
  return {{Action::Kind::kExit, exit_code_}};
}

std::vector<Action> Supervisor::onSignal(int signo) {
  bool stops = std::find(config_.stop_signals.begin(), config_.stop_signals.end(), signo) !=
               config_.stop_signals.end();
  if (phase_ == Phase::kRunning) {
    if (!stops) return {{Action::Kind::kForwardSignal, signo}};
    phase_ = Phase::kStopping;
    reason_ = StopReason::kSignal;
    stop_signal_ = signo;
    return {{Action::Kind::kTerminateAll, signo}, {Action::Kind::kArmShutdownTimer, 0}};
  }
  if (phase_ == Phase::kRendezvous || phase_ == Phase::kRecording) {
    // No worker runs: a stop request ends the launcher now.
    if (!stops) return {};
    phase_ = Phase::kDone;
    reason_ = StopReason::kSignal;
    stop_signal_ = signo;
    exit_code_ = 128 + signo;
    return {{Action::Kind::kExit, exit_code_}};
  }
  if (phase_ == Phase::kStopping) {
    if (!stops) return {{Action::Kind::kForwardSignal, signo}};
    if (reason_ == StopReason::kSignal) {
      // A second stop request while stopping: the user does not want to wait out the grace.
      return {{Action::Kind::kKillAll, 0}};
    }
    // Stopping after a failure, now asked to stop: no restart, and the signal decides the code.
    reason_ = StopReason::kSignal;
    stop_signal_ = signo;
    return {{Action::Kind::kForwardSignal, signo}};
  }
  return {};
}

std::vector<Action> Supervisor::onShutdownTimeout() {
  if (phase_ != Phase::kStopping || liveWorkers() == 0) return {};
  return {{Action::Kind::kKillAll, 0}};
}

}  // namespace ddpl::launcher
