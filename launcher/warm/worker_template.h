#pragma once
// The warm template (docs/warm-restarts.md): one Python process per launch that has imported
// the --prewarm modules and started no thread; Python workers, first starts and restarts alike,
// are forked from it instead of started cold. launcher/warm/template.py is its program (embedded
// in launch's binary) and says the protocol.
//
// Threads: one (the agent's loop). The template is launch's child: the agent's wait4(-1) reaps
// it and calls onExited(); a worker it forks is reparented to launch (a child subreaper) before
// its program runs, so launch waits for workers as for those it forked itself.
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ddpl::launcher::warm {

struct TemplateOptions {
  std::string python;                // the interpreter the workers would run under
  std::vector<std::string> modules;  // imported before the first fork
  std::vector<std::string> envp;     // the template's environment ("NAME=value")
  std::string log_path;              // its stdout and stderr (import-time output)
};

// What a forked worker gets; the descriptors stay the caller's (they are copied across).
struct WarmSpawn {
  std::vector<std::string> argv;  // the worker's command, argv[0] the interpreter
  std::vector<std::string> envp;
  std::vector<int> cpus;  // its CPU affinity; empty: the template's
  int stdout_fd = -1, stderr_fd = -1;
  int heartbeat_fd = -1;  // kept open in the worker, its number in `heartbeat_env`
  std::string heartbeat_env;
  int cgroup_procs_fd = -1;  // the worker writes "0" to it first thing
};

class WorkerTemplate {
 public:
  // Starts the template process (its own process group, SIGKILLed with launch). Throws Error
  // when it cannot be started.
  explicit WorkerTemplate(TemplateOptions options);
  // Closes the socket (a template waiting for a request exits) and SIGKILLs its group. The
  // agent reaps it.
  ~WorkerTemplate();
  WorkerTemplate(const WorkerTemplate&) = delete;
  WorkerTemplate& operator=(const WorkerTemplate&) = delete;

  pid_t pid() const { return pid_; }
  // Waits, at most `timeout_sec`, for the template's word after its imports: true when it can
  // fork workers. False with `why` when it cannot (unsafe, failed, died or too slow: the caller
  // starts workers cold); the same answer from then on.
  bool awaitReady(double timeout_sec, std::string* why);
  bool ready() const { return state_ == State::kReady; }
  // Forks one worker: its pid, or nullopt with `why` (the caller starts that worker cold).
  // Bounded by `timeout_sec`; a template that does not answer in time is killed.
  std::optional<pid_t> spawn(const WarmSpawn& request, double timeout_sec, std::string* why);
  // The agent reaped it.
  void onExited() { state_ = State::kDead; }
  bool dead() const { return state_ == State::kDead; }
  // Seconds from the start to its readiness (0 before).
  double importSeconds() const { return import_seconds_; }

 private:
  enum class State { kStarting, kReady, kUnusable, kDead };
  // One message within the time, or nullopt with `why`.
  std::optional<std::string> receive(double timeout_sec, std::string* why);
  void giveUp(const std::string& why);
  TemplateOptions options_;
  pid_t pid_ = -1;
  int sock_ = -1;
  State state_ = State::kStarting;
  std::string why_not_;
  double started_ = 0, import_seconds_ = 0;
};

// The template's program (launcher/warm/template.py), as built into launch.
const char* templateSource();

}  // namespace ddpl::launcher::warm
