#pragma once
// One rank of a job started by `launch`, torchrun or mpirun: reads the launcher's variables
// (explicitly, through SessionOptions::fromEnvironment), connects to the store, binds the
// device, creates the process group, and tears all of it down again on every way out.
#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "common/defaults.h"
#include "common/environment.h"
#include "common/torchrun_env.h"

namespace ddpl::worker {

using Environment = ddpl::Environment;

enum class BackendKind { kAuto, kGloo, kNccl };

// Parses "auto|gloo|nccl" (InvalidArgument otherwise).
BackendKind parseBackendKind(const std::string& name);
std::string toString(BackendKind kind);

// Bounded by default so that a dead peer turns into an error, not a 30-minute hang.
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{defaults::kCollectiveTimeout};
inline constexpr std::chrono::milliseconds kDefaultStoreTimeout{defaults::kStoreTimeout};

// ProcessGroupNCCL's error handling switch (it also honours the older NCCL_ASYNC_ERROR_HANDLING),
// and the value SessionOptions::fromEnvironment() gives it when neither is set.
inline constexpr const char* kNcclAsyncErrorHandlingEnv = torchrun_env::kNcclAsyncErrorHandling;
inline constexpr const char kLegacyNcclAsyncErrorHandlingEnv[] = "NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char kDefaultNcclAsyncErrorHandling[] = "1";

struct SessionOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = defaults::kMasterPort;
  // TORCHELASTIC_USE_AGENT_STORE=True: the agent hosts the TCPStore; otherwise rank 0 does.
  bool agent_hosts_store = false;
  int restart_count = 0;
  std::string run_id;
  std::string error_file;
  // DDPL_STORE_ADDR/TOKEN/PREFIX: our gRPC rendezvous store, preferred over the TCPStore.
  std::string store_addr;
  std::string store_token;
  std::string store_prefix;
  // DDPL_STORE_SOCKET (default on): the store's operations on the server's plain socket, a
  // few times faster per round trip than a gRPC stream; 0 keeps them on gRPC.
  bool store_socket = true;

  BackendKind backend = BackendKind::kAuto;
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
  std::chrono::milliseconds store_timeout = kDefaultStoreTimeout;
  // Network interface for Gloo (GLOO_SOCKET_IFNAME); empty: resolve this host's name.
  std::string gloo_interface;
  // Barrier on normal exit so that no rank tears down the group while a peer still uses it.
  bool barrier_on_exit = true;
  // Run cleanup hooks on SIGTERM/SIGINT/SIGHUP from the launcher, then die by that signal.
  bool handle_signals = true;
  // PROCESS-WIDE: keep freed memory in the process. The Session constructor calls glibc's
  // mallopt (no mmap for blocks under 32 MiB, no trimming of the heap under 256 MiB); this
  // changes every allocation of the whole process, not only LibTorch's, and stays in force after
  // the Session is gone. On by default because a C++ training step otherwise returns its
  // activations to the kernel and page-faults them back every step: measured 20-25% of a CPU step
  // on the DDP benchmark (docs/benchmarks.md; a Python process happens not to suffer it). The
  // cost is resident memory: up to 256 MiB of freed heap kept per process. Turn it off when
  // several programs share the process's memory budget tightly, or when the program tunes malloc
  // itself. fromEnvironment reads DDPL_RETAIN_FREED_MEMORY=1|0, and without it turns the tuning
  // off when glibc's own settings are present (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, or
  // the same in GLIBC_TUNABLES), which ours would override. No effect on other C libraries.
  bool retain_freed_memory = true;
  // Set when an MPI launcher (mpirun, srun) started this process without the torchrun
  // variables (worker/mpi_env.h): the session initialises MPI, takes rank and sizes from it,
  // and rank 0 hosts the TCPStore, whose address reaches the others through MPI_Bcast.
  // master_port 0 then means a free port; an empty master_addr, rank 0's host name (127.0.0.1
  // when every rank is on one node). Sizes the launcher does not export are -1 until the
  // session starts (PMIx gives no size; local ranks then come from MPI's node split).
  bool mpi_bootstrap = false;
  std::string mpi_variables;  // the launcher variables read, for messages
  // DDPL_HEARTBEAT_FD from `launch`: where this rank reports its steps (worker/heartbeat.h);
  // -1: none (torchrun, mpirun).
  int heartbeat_fd = -1;
  // Checkpoints in memory (docs/checkpoints.md), from launch: DDPL_CHECKPOINT_MEMORY (the node's
  // memory root; empty: off, as under torchrun or mpirun), DDPL_CHECKPOINT_MEMORY_BUDGET (bytes
  // per rank), DDPL_CHECKPOINT_MEMORY_KEEP, DDPL_CHECKPOINT_DIR (launch's --checkpoint-dir).
  std::string checkpoint_memory;
  uint64_t checkpoint_budget = 0;
  int checkpoint_keep = 1;
  std::string checkpoint_dir;
  // DDPL_ROUND_EPOCH and DDPL_ROUND from launch: the checkpoint fence refuses this rank's writes
  // once a newer round of the job committed (docs/network-faults.md). Epoch 0: no fence.
  int64_t round_epoch = 0;
  int64_t round = 0;

  // Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
  // TORCHELASTIC_*, DDPL_STORE_*, DDPL_CHECKPOINT_*, DDPL_BACKEND, GLOO_SOCKET_IFNAME,
  // DDPL_RETAIN_FREED_MEMORY (and the MALLOC_* / GLIBC_TUNABLES it defers to). Pure: it never
  // changes the process and reads nothing but `env`. Malformed numbers and booleans are an
  // InvalidArgument naming the variable. Without RANK and WORLD_SIZE, an MPI launcher's
  // variables (OMPI_COMM_WORLD_*, PMI_*, PMIX_RANK, SLURM_*; DDPL_BOOTSTRAP=auto|env|mpi)
  // select the MPI bootstrap; RANK without WORLD_SIZE (or the reverse) outside an MPI launch,
  // or values that contradict MPI's, are an InvalidArgument.
  static SessionOptions fromEnvironment(const Environment& env);
  // The same over this process's environment, and the one place the worker library touches it:
  // call it at the top of main, before any thread starts (LibTorch's included). When neither
  // TORCH_NCCL_ASYNC_ERROR_HANDLING nor NCCL_ASYNC_ERROR_HANDLING is set it sets the first to 1,
  // as torchrun and launch do for their workers: ProcessGroupNCCL reads it only from the
  // environment (no Options field in LibTorch 2.9), and with it a timed-out collective aborts
  // the communicator and raises instead of hanging in the kernel. setenv is why "before any
  // thread": it races any concurrent getenv. A program that builds its SessionOptions another
  // way and wants this behaviour under mpirun sets the variable itself.
  static SessionOptions fromEnvironment();
};

// One rank's membership of the job, from construction to destruction (RAII): the store, the
// process group and the device binding, and the cleanup hooks that run on every way out.
//
// Threading contract:
// - Construct, use and destroy a Session on one thread (normally main's). The accessors and
//   barrier() are not synchronised against destruction.
// - With handle_signals (the default) the constructor blocks the stop signals in the calling
//   thread before LibTorch starts any thread, so every thread created afterwards inherits the
//   mask, and starts one watcher thread. Threads the program created BEFORE the Session keep
//   their own masks and may receive those signals instead: create the Session first.
// - On SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 the cleanup hooks run ON THE WATCHER THREAD
//   while the training thread goes on (it may be inside a collective, the optimiser step or a
//   checkpoint write); then the process dies by that signal. Hooks must therefore be safe to run
//   concurrently with the training loop: take the program's own locks, or only set flags and
//   write files that the loop does not write. They run at most once, newest first, whichever
//   of the signal or the destructor comes first; the other then finds nothing left to run.
// - addCleanupHook may be called from any thread at any time; a hook added after cleanup started
//   is not run.
// - The mallopt tuning (SessionOptions::retain_freed_memory) is process-wide and outlives the
//   Session; NCCL's error-handling variable is set by SessionOptions::fromEnvironment(), never
//   by the Session.
class Session {
 public:
  using Hook = std::function<void(Session&)>;

  // setupHooks run once the process group is up, in order.
  explicit Session(SessionOptions options, std::vector<Hook> setupHooks = {});
  // Runs the cleanup hooks (newest first), then barrier (normal exit only), then destroys the
  // process group and flushes logs. Never throws.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const;
  int worldSize() const;
  int localRank() const;
  const SessionOptions& options() const;
  // cuda:LOCAL_RANK for NCCL, cpu for Gloo.
  c10::Device device() const;
  BackendKind backendKind() const;
  const c10::intrusive_ptr<c10d::Backend>& backend() const;
  // The store the group bootstrapped from (prefix-scoped), for the program's own keys.
  const c10::intrusive_ptr<c10d::Store>& store() const;

  void addCleanupHook(std::string name, Hook hook);

  struct Impl;  // opaque; public only so that session.cc's helpers can name it
  // A barrier with the collective timeout.
  void barrier();

 private:
  void teardown(Impl& impl, bool normalExit);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpl::worker
