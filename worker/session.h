#pragma once
// One rank of a job started by `launch`, torchrun or mpirun: reads the launcher's variables
// (explicitly, through SessionOptions::fromEnvironment), connects to the store, binds the
// device, creates the process group, and tears all of it down again on every way out.
#include "common/environment.h"
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace ddpl::worker {

using Environment = ddpl::Environment;

enum class BackendKind { kAuto, kGloo, kNccl };

// Parses "auto|gloo|nccl" (InvalidArgument otherwise).
BackendKind parseBackendKind(const std::string& name);
std::string toString(BackendKind kind);

// Bounded by default so that a dead peer turns into an error, not a 30-minute hang.
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{std::chrono::minutes(5)};
inline constexpr std::chrono::milliseconds kDefaultStoreTimeout{std::chrono::minutes(5)};

struct SessionOptions {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  // TORCHELASTIC_USE_AGENT_STORE=True: the agent hosts the TCPStore; otherwise rank 0 does.
  bool agentHostsStore = false;
  int restartCount = 0;
  std::string runId;
  std::string errorFile;
  // DDPL_STORE_ADDR/TOKEN/PREFIX: our gRPC rendezvous store, preferred over the TCPStore.
  std::string storeAddr;
  std::string storeToken;
  std::string storePrefix;

  BackendKind backend = BackendKind::kAuto;
  std::chrono::milliseconds collectiveTimeout = kDefaultCollectiveTimeout;
  std::chrono::milliseconds storeTimeout = kDefaultStoreTimeout;
  // Network interface for Gloo (GLOO_SOCKET_IFNAME); empty: resolve this host's name.
  std::string glooInterface;
  // Barrier on normal exit so that no rank tears down the group while a peer still uses it.
  bool barrierOnExit = true;
  // Run cleanup hooks on SIGTERM/SIGINT/SIGHUP from the launcher, then die by that signal.
  bool handleSignals = true;
  // Keep freed tensor memory in the process (glibc mallopt: no mmap for blocks under 32 MiB,
  // no trimming under 256 MiB). With glibc's defaults a C++ training step returns its
  // activations to the kernel and page-faults them back every step: measured 20-25% of a CPU
  // step on the DDP benchmark (docs/benchmarks.md). A Python process happens not to suffer it.
  bool retainFreedMemory = true;
  // Set when an MPI launcher (mpirun, srun) started this process without the torchrun
  // variables (worker/mpi_env.h): the session initialises MPI, takes rank and sizes from it,
  // and rank 0 hosts the TCPStore, whose address reaches the others through MPI_Bcast.
  // masterPort 0 then means a free port; an empty masterAddr, rank 0's host name (127.0.0.1
  // when every rank is on one node). Sizes the launcher does not export are -1 until the
  // session starts (PMIx gives no size; local ranks then come from MPI's node split).
  bool mpiBootstrap = false;
  std::string mpiVariables;  // the launcher variables read, for messages
  // DDPL_HEARTBEAT_FD from `launch`: where this rank reports its steps (worker/heartbeat.h);
  // -1: none (torchrun, mpirun).
  int heartbeatFd = -1;

  // Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
  // TORCHELASTIC_*, DDPL_STORE_*, DDPL_BACKEND, GLOO_SOCKET_IFNAME. Malformed numbers are an
  // InvalidArgument naming the variable. Without RANK and WORLD_SIZE, an MPI launcher's
  // variables (OMPI_COMM_WORLD_*, PMI_*, PMIX_RANK, SLURM_*; DDPL_BOOTSTRAP=auto|env|mpi)
  // select the MPI bootstrap; RANK without WORLD_SIZE (or the reverse) outside an MPI launch,
  // or values that contradict MPI's, are an InvalidArgument.
  static SessionOptions fromEnvironment(const Environment& env);
  // The same over this process's environment; call it in main, not in libraries.
  static SessionOptions fromEnvironment();
};


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
