#include "launcher/process/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

namespace ddpl::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Without pidfd_open (kernels before 5.3) a child's exit is noticed in slices this long.
constexpr int kExitSliceMs = 10;

void closeFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Above 2, so that moving one descriptor onto 0-2 in the child never overwrites another (launch
// may run with its own 0-2 closed, and then pipe2 hands those numbers out).
int aboveStdio(int fd) {
  if (fd < 0 || fd > 2) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  close(fd);
  return moved;
}

bool cloexecPipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  fds[0] = aboveStdio(fds[0]);
  fds[1] = aboveStdio(fds[1]);
  if (fds[0] >= 0 && fds[1] >= 0) return true;
  closeFd(fds[0]);
  closeFd(fds[1]);
  return false;
}

// In the child. dup2 onto itself would keep O_CLOEXEC, which exec would then honour.
void moveTo(int fd, int target) {
  if (fd == target)
    fcntl(fd, F_SETFD, 0);
  else
    dup2(fd, target);
}

// In the child: closes every descriptor above 2 but those kept, without allocating.
void closeOtherFds(const std::vector<int>& keep, int also_keep) {
  unsigned low = 3;
  while (true) {
    unsigned next = UINT_MAX;  // the lowest kept descriptor at or above `low`
    for (int fd : keep)
      if (fd >= 0 && static_cast<unsigned>(fd) >= low) next = std::min(next, unsigned(fd));
    if (also_keep >= 0 && static_cast<unsigned>(also_keep) >= low)
      next = std::min(next, unsigned(also_keep));
    if (next == UINT_MAX) {
      close_range(low, ~0U, 0);
      return;
    }
    if (next > low) close_range(low, next - 1, 0);
    low = next + 1;
  }
}

void applySetup(const ChildSetup& s, pid_t parent, int also_keep) {
  if (s.group == ProcessGroup::kNew) setpgid(0, 0);
  if (s.group == ProcessGroup::kNewSession) setsid();
  if (s.death_signal > 0) {
    prctl(PR_SET_PDEATHSIG, s.death_signal);
    if (getppid() != parent) _exit(127);  // launch died before the prctl
  }
  if (s.all_signals_default)
    for (int sig = 1; sig < NSIG; ++sig) signal(sig, SIG_DFL);
  for (int sig : s.default_signals) signal(sig, SIG_DFL);
  for (int sig : s.ignored_signals) signal(sig, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (s.close_other_fds) closeOtherFds(s.keep_fds, also_keep);
}

[[noreturn]] void reportExecFailure(int status_fd) {
  int e = errno;
  ssize_t ignored = write(status_fd, &e, sizeof(e));
  (void)ignored;
  _exit(127);
}

// The errno of a failed exec, 0 once it succeeded (the pipe closes on exec).
int awaitExecStatus(int& status_fd) {
  int e = 0;
  ssize_t n;
  do {
    n = read(status_fd, &e, sizeof(e));
  } while (n < 0 && errno == EINTR);
  closeFd(status_fd);
  return n == sizeof(e) ? e : 0;
}

void reap(pid_t pid, int* status) {
  while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
  }
}

std::vector<char*> cStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// One child of runChildren, from fork to reaping.
struct Job {
  const ChildRun* run = nullptr;
  ChildResult result;
  pid_t pid = -1;
  int pidfd = -1;
  int in = -1, out = -1, err = -1;  // launch's ends
  size_t written = 0;
  bool exited = false;
  bool reaped_elsewhere = false;
  bool done = false;
  Clock::time_point deadline;

  bool ownGroup() const { return run->setup.group != ProcessGroup::kInherit; }
};

void start(Job& job) {
  const ChildRun& run = *job.run;
  ChildResult& r = job.result;
  if (run.argv.empty()) {
    r.error = "no program to run";
    job.done = true;
    return;
  }
  // Everything the child touches is made before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv = cStrings(run.argv);
  std::vector<char*> envp = run.env ? cStrings(*run.env) : std::vector<char*>();
  int out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1}, status[2] = {-1, -1};
  int devnull = aboveStdio(open("/dev/null", O_RDWR | O_CLOEXEC));
  bool ok = devnull >= 0 && cloexecPipe(out) && cloexecPipe(status) &&
            (run.stderr_to != ChildRun::Stderr::kCapture || cloexecPipe(err)) &&
            (!run.input || cloexecPipe(in));
  pid_t parent = getpid();
  pid_t pid = ok ? fork() : -1;
  if (pid == 0) {
    moveTo(run.input ? in[0] : devnull, STDIN_FILENO);
    moveTo(out[1], STDOUT_FILENO);
    if (run.stderr_to == ChildRun::Stderr::kCapture)
      moveTo(err[1], STDERR_FILENO);
    else if (run.stderr_to == ChildRun::Stderr::kIntoStdout)
      dup2(STDOUT_FILENO, STDERR_FILENO);
    else
      moveTo(devnull, STDERR_FILENO);
    applySetup(run.setup, parent, status[1]);
    if (run.env)
      execvpe(argv[0], argv.data(), envp.data());
    else
      execvp(argv[0], argv.data());
    reportExecFailure(status[1]);
  }
  int e = errno;
  for (int* fd : {&in[0], &out[1], &err[1], &status[1], &devnull}) closeFd(*fd);
  job.in = in[1];
  job.out = out[0];
  job.err = err[0];
  if (pid < 0) {
    r.error = std::string(ok ? "cannot fork: " : "cannot make pipes: ") + std::strerror(e);
    for (int* fd : {&job.in, &job.out, &job.err, &status[0]}) closeFd(*fd);
    job.done = true;
    return;
  }
  if (int exec_errno = awaitExecStatus(status[0])) {
    reap(pid, nullptr);
    r.exec_errno = exec_errno;
    r.error = "cannot run '" + run.argv[0] + "': " + std::strerror(exec_errno);
    for (int* fd : {&job.in, &job.out, &job.err}) closeFd(*fd);
    job.done = true;
    return;
  }
  r.started = true;
  job.pid = pid;
  job.pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));  // O_CLOEXEC by definition
  for (int fd : {job.in, job.out, job.err})
    if (fd >= 0) fcntl(fd, F_SETFL, O_NONBLOCK);
  if (job.in >= 0 && run.input->empty()) closeFd(job.in);
}

// Whether the child is still ours to signal and reap: not yet exited, or a zombie only we
// can reap. ECHILD: someone else reaped it (a waitpid(-1) on another thread, against the
// contract); its pid may then be another process's already, so nothing more is sent to it.
// When it has exited, its status is kept here from the siginfo, while it is still known.
bool stillOurs(Job& job) {
  siginfo_t si{};
  int r;
  do {
    r = waitid(P_PID, static_cast<id_t>(job.pid), &si, WEXITED | WNOHANG | WNOWAIT);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    job.reaped_elsewhere = true;
    job.exited = true;
    return false;
  }
  if (si.si_pid == job.pid) {
    job.exited = true;
    job.result.exit_code = si.si_code == CLD_EXITED ? si.si_status : -1;
    job.result.term_signal = si.si_code == CLD_EXITED ? 0 : si.si_status;
  }
  return true;
}

// Kills what is left (at the deadline the child and its group; after a clean exit whatever
// the child left running in its group) and reaps the child. The group is killed while the
// child is still unreaped: its pid, and so the group's id, cannot have been reused yet.
void finish(Job& job, bool timed_out) {
  job.result.timed_out = timed_out;
  if (job.reaped_elsewhere || !stillOurs(job)) {
    if (job.result.exit_code < 0 && job.result.term_signal == 0)
      job.result.error = "reaped by another waiter: its exit status is unknown";
  } else {
    if (job.ownGroup())
      kill(-job.pid, SIGKILL);
    else if (timed_out)
      kill(job.pid, SIGKILL);
    int status = 0;
    reap(job.pid, &status);
    job.result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    job.result.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
  for (int* fd : {&job.in, &job.out, &job.err, &job.pidfd}) closeFd(*fd);
  job.done = true;
}

void checkExited(Job& job) {
  stillOurs(job);
  if (job.exited) {
    closeFd(job.in);  // nobody reads it any more
    closeFd(job.pidfd);
  }
}

void readInto(int& fd, std::string& text, bool& truncated, size_t bound) {
  char buf[65536];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      closeFd(fd);
      return;
    }
    size_t keep = std::min(static_cast<size_t>(n), bound - std::min(bound, text.size()));
    text.append(buf, keep);
    if (keep < static_cast<size_t>(n)) truncated = true;
  }
}

void writeInput(Job& job) {
  const std::string& input = *job.run->input;
  while (job.written < input.size()) {
    ssize_t n = write(job.in, input.data() + job.written, input.size() - job.written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0) break;  // EPIPE: the child does not read it
    job.written += static_cast<size_t>(n);
  }
  closeFd(job.in);
}

// One poll over every open descriptor of every job, at most until the nearest deadline.
void pollOnce(std::vector<Job>& jobs) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Job*, int*>> owner;
  auto now = Clock::now();
  auto wait = std::chrono::milliseconds(INT_MAX);
  for (auto& job : jobs) {
    if (job.done) continue;
    wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(
                              job.deadline - now + std::chrono::microseconds(999)));
    if (!job.exited && job.pidfd < 0)
      wait = std::min(wait, std::chrono::milliseconds(kExitSliceMs));
    for (int* fd : {&job.in, &job.out, &job.err, &job.pidfd}) {
      if (*fd < 0) continue;
      fds.push_back({*fd, static_cast<short>(fd == &job.in ? POLLOUT : POLLIN), 0});
      owner.push_back({&job, fd});
    }
  }
  int r = poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait.count())));
  if (r < 0) return;  // EINTR: the caller loops
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    auto [job, fd] = owner[i];
    if (*fd < 0) continue;  // closed by an earlier event of the same job
    ChildResult& res = job->result;
    if (fd == &job->out)
      readInto(job->out, res.out, res.out_truncated, job->run->max_output_bytes);
    else if (fd == &job->err)
      readInto(job->err, res.err, res.err_truncated, job->run->max_output_bytes);
    else if (fd == &job->in)
      writeInput(*job);
    else
      checkExited(*job);
  }
}

// Writing the input of a child that stopped reading raises SIGPIPE in this thread; it is held
// and dropped, so that a caller that does not ignore SIGPIPE does not die of a child's choice.
class HoldSigpipe {
 public:
  HoldSigpipe() {
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old_);
  }
  ~HoldSigpipe() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe_only;
      sigemptyset(&pipe_only);
      sigaddset(&pipe_only, SIGPIPE);
      timespec zero{};
      sigtimedwait(&pipe_only, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  HoldSigpipe(const HoldSigpipe&) = delete;
  HoldSigpipe& operator=(const HoldSigpipe&) = delete;

 private:
  sigset_t old_;
  bool was_pending_ = false;
};

}  // namespace

void applyChildSetup(const ChildSetup& setup, pid_t parent) { applySetup(setup, parent, -1); }

pid_t forkChild(const ChildSetup& setup, const std::function<int()>& body) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    applySetup(setup, parent, -1);
    _exit(body());
  }
  return pid;
}

pid_t startDetached(const std::vector<std::string>& args, const ChildSetup& setup) {
  std::vector<char*> argv = cStrings(args);
  int status[2] = {-1, -1};
  int devnull = aboveStdio(open("/dev/null", O_RDWR | O_CLOEXEC));
  if (devnull < 0 || args.empty() || !cloexecPipe(status)) {
    int e = args.empty() ? EINVAL : errno;
    closeFd(devnull);
    errno = e;
    return -1;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    for (int target : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) moveTo(devnull, target);
    applySetup(setup, parent, status[1]);
    execv(argv[0], argv.data());
    reportExecFailure(status[1]);
  }
  int e = errno;
  closeFd(devnull);
  closeFd(status[1]);
  if (pid < 0) {
    closeFd(status[0]);
    errno = e;
    return -1;
  }
  if (int exec_errno = awaitExecStatus(status[0])) {
    reap(pid, nullptr);
    errno = exec_errno;
    return -1;
  }
  return pid;
}

ChildSetup ChildRun::defaultSetup() {
  ChildSetup s;
  s.group = ProcessGroup::kNew;
  s.default_signals = {SIGPIPE};
  s.close_other_fds = true;
  return s;
}

int ChildResult::status() const {
  if (!started) return -1;
  if (timed_out) return 124;
  if (term_signal) return 128 + term_signal;
  return exit_code;
}

std::vector<ChildResult> runChildren(const std::vector<ChildRun>& runs) {
  HoldSigpipe hold;
  std::vector<Job> jobs(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    jobs[i].run = &runs[i];
    jobs[i].deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(
                                          std::clamp(runs[i].timeout_sec, 0.0, 1e9) * 1e6));
    start(jobs[i]);
  }
  while (true) {
    bool any = false;
    auto now = Clock::now();
    for (auto& job : jobs) {
      if (job.done) continue;
      if (!job.exited && job.pidfd < 0) checkExited(job);
      if (job.exited && job.out < 0 && job.err < 0)
        finish(job, false);
      else if (now >= job.deadline)
        finish(job, true);
      any = any || !job.done;
    }
    if (!any) break;
    pollOnce(jobs);
  }
  std::vector<ChildResult> results;
  for (auto& job : jobs) results.push_back(std::move(job.result));
  return results;
}

ChildResult runChild(const ChildRun& run) { return std::move(runChildren({run}).front()); }

}  // namespace ddpl::launcher
