#include "launcher/agent/process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/errors.h"
#include "launcher/process/child_process.h"
#include "launcher/warm/worker_template.h"

namespace ddpl::launcher {
namespace {
constexpr int kMpolBind = 2;  // <numaif.h>'s MPOL_BIND, without libnuma

// clone3's arguments (<linux/sched.h>'s struct clone_args, whose header clashes with glibc's).
struct CloneArgs {
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
      set_tid_size, cgroup;
};
constexpr uint64_t kCloneIntoCgroup = 0x200000000ULL;

// fork(), but born in the cgroup of `cgroup_dir_fd` when there is one: moving a running process
// into a cgroup waits for an RCU grace period (about 8 ms each here, the bulk of a 4-worker
// start), being born there costs nothing. The child runs only async-signal-safe code before
// exec, so skipping glibc's fork handlers is safe. Kernels before 5.7 refuse: then fork, and the
// child joins through cgroup.procs.
pid_t forkInto(int cgroup_dir_fd, bool* in_cgroup) {
  *in_cgroup = false;
#ifdef SYS_clone3
  if (cgroup_dir_fd >= 0) {
    CloneArgs args{};
    args.flags = kCloneIntoCgroup;
    args.exit_signal = SIGCHLD;
    args.cgroup = static_cast<uint64_t>(cgroup_dir_fd);
    long r = syscall(SYS_clone3, &args, sizeof(args));
    if (r >= 0) {
      *in_cgroup = true;
      return static_cast<pid_t>(r);
    }
  }
#endif
  return fork();
}

// fds[0]: what launch reads; fds[1]: what the worker writes to. Both close-on-exec here (dup2
// gives the worker its own copy). A terminal passes output through untranslated (no OPOST:
// '\n' stays '\n').
bool openStream(bool terminal, int fds[2], const winsize& size) {
  if (!terminal) return pipe2(fds, O_CLOEXEC) == 0;
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) return false;
  char name[128];
  if (grantpt(master) != 0 || unlockpt(master) != 0 || ptsname_r(master, name, sizeof(name)) != 0) {
    close(master);
    return false;
  }
  int slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) {
    close(master);
    return false;
  }
  termios t{};
  if (tcgetattr(slave, &t) == 0) {
    t.c_oflag &= ~static_cast<tcflag_t>(OPOST);
    t.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    tcsetattr(slave, TCSANOW, &t);
  }
  ioctl(slave, TIOCSWINSZ, &size);
  fds[0] = master;
  fds[1] = slave;
  return true;
}
// A worker's stdout and stderr as the options ask (pipes or terminals), and, with `status`, the
// pipe that reports its exec. Throws Error with nothing left open when one cannot be made.
void openWorkerStreams(const SpawnOptions& options, int out[2], int err[2], int* status) {
  winsize size{};
  size.ws_col = options.columns;
  size.ws_row = options.rows;
  if (!openStream(options.stdout_terminal, out, size) ||
      !openStream(options.stderr_terminal, err, size) ||
      (status && pipe2(status, O_CLOEXEC) != 0)) {
    int e = errno;
    for (int fd :
         {out[0], out[1], err[0], err[1], status ? status[0] : -1, status ? status[1] : -1})
      if (fd >= 0) close(fd);
    throw Error(std::string("cannot create pipes for a worker: ") + std::strerror(e));
  }
}

}  // namespace

void becomeSubreaper() { prctl(PR_SET_CHILD_SUBREAPER, 1); }

SpawnedProcess spawnProcess(const std::vector<std::string>& argv,
                            const std::vector<std::string>& envp, const SpawnOptions& options) {
  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  openWorkerStreams(options, out, err, status);

  // Everything the child touches is prepared before fork: after fork only async-signal-safe
  // calls are allowed.
  std::vector<char*> cargv, cenvp;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envp) cenvp.push_back(const_cast<char*>(e.c_str()));
  cenvp.push_back(nullptr);
  pid_t parent = getpid();
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : options.cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &cpus);
  unsigned long nodemask[16] = {0};  // 1024 NUMA nodes
  const unsigned long kMaxNode = sizeof(nodemask) * 8;
  for (int n : options.mem_nodes)
    if (n >= 0 && static_cast<unsigned long>(n) < kMaxNode)
      nodemask[n / (8 * sizeof(unsigned long))] |= 1UL << (n % (8 * sizeof(unsigned long)));

  ChildSetup setup;
  setup.group = ProcessGroup::kNew;
  setup.death_signal = SIGKILL;
  setup.all_signals_default = true;

  bool started_in_cgroup = false;
  pid_t pid = forkInto(options.cgroup_dir_fd, &started_in_cgroup);
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1]}) close(fd);
    throw Error(std::string("fork failed: ") + std::strerror(e));
  }
  if (pid == 0) {
    // Its own group, dead with the launcher (exits 127 if the launcher died before the prctl),
    // no signal state of the launcher's.
    applyChildSetup(setup, parent);
    // Into the run's cgroup before anything else can fork: every descendant stays there.
    if (!started_in_cgroup && options.cgroup_procs_fd >= 0) {
      ssize_t ignored = write(options.cgroup_procs_fd, "0", 1);
      (void)ignored;
    }
    if (options.inherit_fd >= 0) fcntl(options.inherit_fd, F_SETFD, 0);
    if (!options.cpus.empty()) sched_setaffinity(0, sizeof(cpus), &cpus);
    if (!options.mem_nodes.empty()) syscall(SYS_set_mempolicy, kMpolBind, nodemask, kMaxNode + 1);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execve(cargv[0], cargv.data(), cenvp.data());
    int e = errno;
    ssize_t ignored = write(status[1], &e, sizeof(e));
    (void)ignored;
    _exit(127);
  }
  // Also here, so that a signal to the group cannot race the child's own setpgid.
  setpgid(pid, pid);
  close(out[1]);
  close(err[1]);
  close(status[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  return {pid, out[0], err[0], status[0]};
}

SpawnedProcess spawnFromTemplate(warm::WorkerTemplate& tmpl, const std::vector<std::string>& argv,
                                 const std::vector<std::string>& envp,
                                 const std::string& heartbeat_env, const SpawnOptions& options,
                                 double timeout_sec, std::string* why) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  openWorkerStreams(options, out, err, nullptr);
  warm::WarmSpawn req;
  req.argv = argv;
  req.envp = envp;
  req.cpus = options.cpus;
  req.stdout_fd = out[1];
  req.stderr_fd = err[1];
  req.heartbeat_fd = options.inherit_fd;
  req.heartbeat_env = heartbeat_env;
  req.cgroup_procs_fd = options.cgroup_procs_fd;
  auto pid = tmpl.spawn(req, timeout_sec, why);
  close(out[1]);
  close(err[1]);
  if (!pid) {
    close(out[0]);
    close(err[0]);
    return {};
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  return {*pid, out[0], err[0], -1};
}

int awaitExec(SpawnedProcess& p) {
  if (p.exec_status_fd < 0) return 0;
  int e = 0;
  ssize_t n;
  do {
    n = read(p.exec_status_fd, &e, sizeof(e));
  } while (n < 0 && errno == EINTR);
  close(p.exec_status_fd);
  p.exec_status_fd = -1;
  return n == sizeof(e) ? e : 0;
}

}  // namespace ddpl::launcher
