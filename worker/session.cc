#include "worker/session.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/checkpoint_format.h"
#include "common/errors.h"
#include "common/heartbeat.h"
#include "common/parse.h"
#include "common/torchrun_env.h"
#include "ddpl/config.h"
#include "worker/backends.h"
#include "worker/build_config.h"
#include "worker/heartbeat.h"
#include "worker/log_bridge.h"
#include "worker/mpi_env.h"
#include "worker/store_adapter.h"
#if DDPL_WORKER_GRPC_STORE
#include "rendezvous/client/grpc_store.h"
#endif
#if DDPL_WITH_MPI
#include "worker/mpi_bootstrap.h"
#endif

namespace ddpl::worker {
namespace {

std::string lookup(const Environment& env, const std::string& name, const std::string& fallback) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? fallback : it->second;
}

int parseInt(const Environment& env, const std::string& name, int fallback) {
  const std::string text = lookup(env, name, "");
  if (text.empty()) return fallback;
  try {
    size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw InvalidArgument("environment variable " + name + "='" + text + "' is not an integer");
}

bool parseBool(const std::string& text) {
  return text == "1" || text == "True" || text == "true" || text == "TRUE" || text == "yes";
}

bool isSet(const Environment& env, const std::string& name) {
  return !lookup(env, name, "").empty();
}

// An MPI launcher started us (worker/mpi_env.h): rank and sizes come from its variables, and any
// torchrun variable also present (`launch --launcher=mpi` exports WORLD_SIZE) must agree.
void applyMpiLaunch(SessionOptions& o, const Environment& env) {
  const BootstrapMode mode = parseBootstrapMode(lookup(env, envvar::kBootstrap, "auto"));
  const bool hasRank = isSet(env, torchrun_env::kRank),
             hasWorld = isSet(env, torchrun_env::kWorldSize);
  std::optional<MpiLaunch> launch;
  // Both torchrun variables win over MPI's: `launch` or torchrun may itself run under mpirun.
  if (mode == BootstrapMode::kMpi || (mode == BootstrapMode::kAuto && !(hasRank && hasWorld))) {
    launch = detectMpiLaunch(env);
  }
  if (!launch) {
    if (mode == BootstrapMode::kMpi) {
      throw InvalidArgument(
          "DDPL_BOOTSTRAP=mpi but no MPI launcher started this process (none of "
          "OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, or SLURM_PROCID in a job step is set)");
    }
    if (hasRank != hasWorld) {
      throw InvalidArgument(
          std::string(hasRank ? torchrun_env::kRank : torchrun_env::kWorldSize) + " is set but " +
          (hasRank ? torchrun_env::kWorldSize : torchrun_env::kRank) +
          " is not: a partial launcher environment; set both, or start the program with "
          "launch, torchrun or mpirun");
    }
    return;
  }
  const std::string from = " but the " + launch->source + " launch says ";
  const std::string vars = " (" + launch->variables + ")";
  auto agree = [&](const char* name, int value, std::optional<int> mpiValue, const char* what) {
    if (isSet(env, name) && mpiValue && value != *mpiValue) {
      throw InvalidArgument(std::string(name) + "=" + std::to_string(value) + from + what + " " +
                            std::to_string(*mpiValue) + vars +
                            ": inconsistent launcher environment");
    }
  };
  agree(torchrun_env::kRank, o.rank, launch->rank, "rank");
  agree(torchrun_env::kWorldSize, o.world_size, launch->world_size, "world size");
  agree(torchrun_env::kLocalRank, o.local_rank, launch->local_rank, "local rank");
  agree(torchrun_env::kLocalWorldSize, o.local_world_size, launch->local_world_size,
        "local world size");
  o.mpi_bootstrap = true;
  o.mpi_variables = launch->source + ": " + launch->variables;
  o.rank = launch->rank;
  o.world_size = launch->world_size.value_or(-1);
  o.local_rank = launch->local_rank.value_or(-1);
  o.local_world_size = launch->local_world_size.value_or(-1);
  o.master_addr = lookup(env, torchrun_env::kMasterAddr, "");
  o.master_port = parseInt(env, torchrun_env::kMasterPort, 0);
}

// The launcher's stop signals, and SIGUSR1/2, which `launch --signals-to-handle` may forward.
constexpr int kExtraHandledSignals[] = {SIGUSR1, SIGUSR2};

}  // namespace

BackendKind parseBackendKind(const std::string& name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "gloo") return BackendKind::kGloo;
  if (name == "nccl") return BackendKind::kNccl;
  throw InvalidArgument("unknown backend '" + name + "' (expected auto, gloo or nccl)");
}

std::string toString(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kGloo:
      return "gloo";
    case BackendKind::kNccl:
      return "nccl";
  }
  return "?";
}

SessionOptions SessionOptions::fromEnvironment() {
  const Environment env = processEnvironment();
  SessionOptions o = fromEnvironment(env);
  // ProcessGroupNCCL reads its error handling from the environment only (LibTorch 2.9 has no
  // Options field for it), so the default has to be put there, once, in main before any thread
  // reads the environment: setenv racing a getenv in another thread is undefined behaviour.
  // Async error handling makes a timed-out collective abort the communicator and raise instead
  // of hanging in the kernel (pytorch#111646); 1 is what torchrun and launch export. A value the
  // user or launcher chose, under either name, is kept.
  if (!env.count(kNcclAsyncErrorHandlingEnv) && !env.count(kLegacyNcclAsyncErrorHandlingEnv)) {
    ::setenv(kNcclAsyncErrorHandlingEnv, kDefaultNcclAsyncErrorHandling, 0);
  }
  return o;
}

SessionOptions SessionOptions::fromEnvironment(const Environment& env) {
  SessionOptions o;
  o.rank = parseInt(env, torchrun_env::kRank, 0);
  o.world_size = parseInt(env, torchrun_env::kWorldSize, 1);
  o.local_rank = parseInt(env, torchrun_env::kLocalRank, 0);
  o.local_world_size = parseInt(env, torchrun_env::kLocalWorldSize, 1);
  o.heartbeat_fd = parseInt(env, kHeartbeatFdEnv, -1);
  o.master_addr = lookup(env, torchrun_env::kMasterAddr, o.master_addr);
  o.master_port = parseInt(env, torchrun_env::kMasterPort, o.master_port);
  applyMpiLaunch(o, env);
  o.agent_hosts_store = parseBool(lookup(env, torchrun_env::kUseAgentStore, "False"));
  o.restart_count = parseInt(env, torchrun_env::kRestartCount, 0);
  o.run_id = lookup(env, torchrun_env::kRunId, "");
  o.error_file = lookup(env, torchrun_env::kErrorFile, "");
  o.store_addr = lookup(env, envvar::kStoreAddr, "");
  o.store_token = lookup(env, envvar::kStoreToken, "");
  o.store_prefix = lookup(env, envvar::kStorePrefix, "");
  {
    const std::string v = lookup(env, envvar::kStoreSocket, "1");
    o.store_socket =
        !(v == "0" || v == "false" || v == "False" || v == "FALSE" || v == "no" || v == "off");
  }
  o.backend = parseBackendKind(lookup(env, envvar::kBackend, "auto"));
  o.checkpoint_memory = lookup(env, ckpt::kMemoryEnv, "");
  o.checkpoint_budget =
      static_cast<uint64_t>(parseInteger(ckpt::kBudgetEnv, lookup(env, ckpt::kBudgetEnv, "0")));
  o.checkpoint_keep = parseInt(env, ckpt::kKeepEnv, 1);
  if (o.checkpoint_keep < 1)
    throw InvalidArgument(std::string(ckpt::kKeepEnv) + "=" + std::to_string(o.checkpoint_keep) +
                          ": at least 1");
  o.checkpoint_dir = lookup(env, ckpt::kDirEnv, "");
  o.round_epoch = parseInteger(envvar::kRoundEpoch, lookup(env, envvar::kRoundEpoch, "0"));
  o.round = parseInteger(envvar::kRound, lookup(env, envvar::kRound, "0"));
  if (o.round_epoch < 0 || o.round < 0)
    throw InvalidArgument(std::string(envvar::kRoundEpoch) + "/" + envvar::kRound +
                          ": not negative numbers expected");
  o.gloo_interface = lookup(env, "GLOO_SOCKET_IFNAME", "");
  // glibc's own malloc settings (MALLOC_*_ env or GLIBC_TUNABLES) are the user's choice: ours
  // would override them, so they turn the tuning off unless DDPL_RETAIN_FREED_MEMORY says on.
  const std::string tunables = lookup(env, "GLIBC_TUNABLES", "");
  const bool userMallocSettings =
      isSet(env, "MALLOC_MMAP_THRESHOLD_") || isSet(env, "MALLOC_TRIM_THRESHOLD_") ||
      tunables.find("glibc.malloc.mmap_threshold") != std::string::npos ||
      tunables.find("glibc.malloc.trim_threshold") != std::string::npos;
  const std::string retain = lookup(env, envvar::kRetainFreedMemory, "");
  o.retain_freed_memory =
      retain.empty() ? !userMallocSettings : ddpl::parseBool(envvar::kRetainFreedMemory, retain);
  if (o.world_size < 1 && !o.mpi_bootstrap) {
    throw InvalidArgument("WORLD_SIZE must be >= 1, got " + std::to_string(o.world_size));
  }
  if (o.rank < 0 || (o.world_size >= 1 && o.rank >= o.world_size)) {
    throw InvalidArgument("RANK " + std::to_string(o.rank) +
                          " outside [0, WORLD_SIZE=" + std::to_string(o.world_size) + ")");
  }
  // A program run on its own (one rank, no launcher) needs no agreed port: a fixed default such
  // as 29500 would make two such runs on one machine collide. Port 0 lets the kernel choose.
  const bool alone = o.world_size == 1 && !o.mpi_bootstrap && !env.count(torchrun_env::kMasterPort);
  if (alone) o.master_port = 0;
  if (o.master_port < (o.mpi_bootstrap || alone ? 0 : 1) || o.master_port > 65535) {
    throw InvalidArgument("MASTER_PORT " + std::to_string(o.master_port) + " is not a port");
  }
  return o;
}

struct Session::Impl {
  SessionOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  BackendKind kind = BackendKind::kGloo;
  c10::Device device{c10::kCPU};

  std::mutex cleanup_mu;
  bool cleaned_up = false;
  std::vector<std::pair<std::string, Hook>> cleanup_hooks;

  bool signals_blocked = false;
  sigset_t previous_mask{};
  std::atomic<bool> stopping{false};
  std::thread signal_thread;
};

namespace {

c10::intrusive_ptr<c10d::Store> connectStore(const SessionOptions& o) {
  if (!o.store_addr.empty()) {
#if DDPL_WORKER_GRPC_STORE
    rdzv::GrpcStoreOptions grpc;
    grpc.endpoint = o.store_addr;
    grpc.token = o.store_token;
    grpc.prefix = o.store_prefix;
    grpc.socket = o.store_socket;
    grpc.default_timeout = std::chrono::duration_cast<rdzv::Duration>(o.store_timeout);
    std::shared_ptr<rdzv::Store> client = rdzv::connectGrpcStore(grpc);
    wlog::info("store: ddplaunch rendezvous store at " + o.store_addr);
    return c10::make_intrusive<RdzvC10dStore>(std::move(client), o.store_timeout);
#else
    throw InvalidArgument("DDPL_STORE_ADDR=" + o.store_addr +
                          " is set but this build has no gRPC store client (ddpl_rdzv_client)");
#endif
  }
  c10d::TCPStoreOptions tcp;
  tcp.port = static_cast<uint16_t>(o.master_port);
  tcp.isServer = o.rank == 0 && !o.agent_hosts_store;
  tcp.numWorkers = o.world_size;
  // Gloo's own rendezvous synchronises the ranks; rank 0 need not block here.
  tcp.waitWorkers = false;
  tcp.multiTenant = true;
  tcp.timeout = o.store_timeout;
  wlog::info("store: TCPStore " + o.master_addr + ":" + std::to_string(o.master_port) +
             (tcp.isServer ? " (hosted by this rank)" : " (client)"));
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, tcp);
  } catch (const std::exception& e) {
    throw NetworkError("cannot reach TCPStore at " + o.master_addr + ":" +
                       std::to_string(o.master_port) + ": " + e.what());
  }
  if (o.agent_hosts_store) {
    // torch.distributed's env:// rendezvous scopes each restart attempt the same way.
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::to_string(o.restart_count), store);
  }
  return store;
}

// mpirun or srun started this rank (SessionOptions::mpi_bootstrap): no launcher and no separate
// rendezvous server. MPI supplies rank, world and local rank; rank 0 hosts a TCPStore on a free
// port (or MASTER_PORT) and MPI_Bcast tells every rank where it is. Gloo and NCCL (its unique
// id) then bootstrap from that store exactly as under `launch`.
c10::intrusive_ptr<c10d::Store> connectStoreThroughMpi(SessionOptions& o) {
  auto host = [&](const std::string& advertised, const std::string& local) {
    c10d::TCPStoreOptions tcp;
    tcp.port = static_cast<uint16_t>(o.master_port);
    tcp.isServer = true;
    tcp.numWorkers = o.world_size;
    tcp.waitWorkers = false;
    tcp.multiTenant = true;
    tcp.timeout = o.store_timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(local, tcp);
    return std::make_pair(store, advertised + ":" + std::to_string(store->getPort()));
  };
#if DDPL_WITH_MPI
  const mpi::World world = mpi::initialize();
  if (o.rank != world.rank || (o.world_size >= 1 && o.world_size != world.size)) {
    throw BackendError(
        "MPI_COMM_WORLD has rank " + std::to_string(world.rank) + " of " +
        std::to_string(world.size) + " but the launcher's variables say rank " +
        std::to_string(o.rank) + " of " +
        (o.world_size >= 1 ? std::to_string(o.world_size) : std::string("?")) + " (" +
        o.mpi_variables +
        "): the ranks were not started as one MPI job (under Slurm: srun --mpi=pmix)");
  }
  o.world_size = world.size;
  if (o.local_rank < 0 || o.local_world_size < 0) {
    o.local_rank = world.local_rank;
    o.local_world_size = world.local_size;
  } else if (o.local_rank != world.local_rank) {
    wlog::warn("local rank " + std::to_string(o.local_rank) + " from the launcher (" +
               o.mpi_variables + ") differs from MPI's node split (" +
               std::to_string(world.local_rank) + "): using the launcher's");
  }
  std::string endpoint;
  c10::intrusive_ptr<c10d::Store> store;
  if (o.rank == 0) {
    // Every rank on this node: loopback. Otherwise the name peers resolve, as torchrun's default.
    std::string advertised = o.master_addr;
    if (advertised.empty())
      advertised = world.local_size == world.size ? "127.0.0.1" : world.processor_name;
    try {
      auto [server, address] = host(advertised, "127.0.0.1");
      store = server;
      endpoint = address;
    } catch (const std::exception& e) {
      // The others are already waiting in MPI_Bcast: tell them why nothing comes.
      endpoint = std::string("error:") + e.what();
    }
  }
  endpoint = mpi::broadcastFromRoot(endpoint);
  if (endpoint.rfind("error:", 0) == 0) {
    throw NetworkError(
        "rank 0 could not host the TCPStore" +
        (o.master_port ? " on port " + std::to_string(o.master_port) : std::string()) + ": " +
        endpoint.substr(6));
  }
  const auto colon = endpoint.rfind(':');
  o.master_addr = endpoint.substr(0, colon);
  o.master_port = parsePort("TCPStore endpoint from rank 0", endpoint.substr(colon + 1));
  wlog::info("store: TCPStore " + endpoint +
             (o.rank == 0 ? " (hosted by this rank)" : " (client)") +
             ", address shared through MPI; " + o.mpi_variables);
  if (store) return store;
  c10d::TCPStoreOptions tcp;
  tcp.port = static_cast<uint16_t>(o.master_port);
  tcp.isServer = false;
  tcp.numWorkers = o.world_size;
  tcp.waitWorkers = false;
  tcp.timeout = o.store_timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(o.master_addr, tcp);
  } catch (const std::exception& e) {
    throw NetworkError("cannot reach rank 0's TCPStore at " + endpoint +
                       " (address shared through MPI): " + e.what());
  }
#else
  if (o.world_size != 1) {
    throw InvalidArgument(
        "started by an MPI launcher (" + o.mpi_variables +
        ") but this build of ddpl_worker has no MPI support (configure with OpenMPI "
        "installed and DDPL_WITH_MPI=ON), or start the program with launch or torchrun");
  }
  // mpirun -np 1: a world of one needs no peer, only its own store.
  o.local_rank = 0;
  o.local_world_size = 1;
  auto [server, address] = host("127.0.0.1", "127.0.0.1");
  o.master_addr = "127.0.0.1";
  o.master_port = server->getPort();
  wlog::info("store: TCPStore " + address + " for a one-rank MPI launch (this build has no MPI)");
  return server;
#endif
}

void runCleanup(Session& session, Session::Impl& impl, bool normalExit) {
  std::vector<std::pair<std::string, Session::Hook>> hooks;
  {
    std::lock_guard<std::mutex> lock(impl.cleanup_mu);
    if (impl.cleaned_up) return;
    impl.cleaned_up = true;
    hooks.swap(impl.cleanup_hooks);
  }
  for (auto it = hooks.rbegin(); it != hooks.rend(); ++it) {
    try {
      it->second(session);
    } catch (const std::exception& e) {
      wlog::error("cleanup hook '" + it->first + "' failed: " + e.what());
    }
  }
  if (normalExit && impl.options.barrier_on_exit && impl.backend && impl.options.world_size > 1) {
    // Only on a normal exit: after a failure the peers may be gone and the barrier would just
    // wait for its timeout.
    try {
      c10d::BarrierOptions barrier;
      barrier.timeout = impl.options.collective_timeout;
      impl.backend->barrier(barrier)->wait(impl.options.collective_timeout);
    } catch (const std::exception& e) {
      wlog::warn(std::string("exit barrier failed: ") + e.what());
    }
  }
}

}  // namespace

Session::Session(SessionOptions options, std::vector<Hook> setupHooks)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  const SessionOptions& o = impl_->options;
  wlog::init(o.rank);
  heartbeat::open(o.heartbeat_fd);
  if (o.retain_freed_memory) {
    // Process-wide and never undone (SessionOptions::retain_freed_memory says why).
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest allowed value on 64-bit
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  }

  if (o.handle_signals) {
    // Block the launcher's signals in this thread before any LibTorch thread exists, so they
    // inherit the mask and only our watcher receives them (cleanup cannot run in a handler).
    sigset_t set;
    sigemptyset(&set);
    for (int sig : defaults::kStopSignals) sigaddset(&set, sig);
    for (int sig : kExtraHandledSignals) sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, &impl_->previous_mask);
    impl_->signals_blocked = true;
    impl_->signal_thread = std::thread([this, set] {
      int sig = 0;
      while (sigwait(&set, &sig) == 0) {
        if (impl_->stopping.load()) return;
        wlog::warn("received signal " + std::to_string(sig) + " (" + strsignal(sig) +
                   "): running cleanup hooks");
        runCleanup(*this, *impl_, /*normalExit=*/false);
        wlog::flush();
        // Die by the same signal so that the launcher reports what happened.
        ::signal(sig, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
        ::raise(sig);
        std::_Exit(128 + sig);
      }
    });
  }

  try {
    impl_->store = o.mpi_bootstrap ? connectStoreThroughMpi(impl_->options) : connectStore(o);
    detail::BackendSpec spec;
    spec.store = c10::make_intrusive<c10d::PrefixStore>("default_pg", impl_->store);
    spec.rank = o.rank;
    spec.world_size = o.world_size;
    spec.local_rank = o.local_rank;
    spec.timeout = o.collective_timeout;
    spec.gloo_interface = o.gloo_interface;
    BackendKind kind = o.backend;
    if (kind == BackendKind::kAuto) {
      kind = detail::ncclCompiledIn() && detail::cudaAvailable() ? BackendKind::kNccl
                                                                 : BackendKind::kGloo;
    }
    if (kind == BackendKind::kNccl) {
      impl_->backend = detail::makeNcclBackend(spec);
      impl_->device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(o.local_rank));
    } else {
      impl_->backend = detail::makeGlooBackend(spec);
    }
    impl_->kind = kind;
    wlog::info("process group up: backend " + toString(kind) + ", rank " + std::to_string(o.rank) +
               "/" + std::to_string(o.world_size) + ", local rank " + std::to_string(o.local_rank) +
               ", device " + impl_->device.str());
    for (auto& hook : setupHooks) hook(*this);
  } catch (...) {
    // The destructor will not run for a half-built object; undo the signal watcher here.
    impl_->cleaned_up = true;
    teardown(*impl_, /*normalExit=*/false);
    throw;
  }
}

void Session::teardown(Impl& impl, bool normalExit) {
  // Past its last step: the hooks, the process group's end and the exit are teardown, not a hang.
  if (normalExit) heartbeat::finished();
  runCleanup(*this, impl, normalExit);
  impl.backend.reset();
  impl.store.reset();
#if DDPL_WITH_MPI
  // After a failure MPI is not finalized: mpirun sees the rank leave and ends the whole job.
  if (impl.options.mpi_bootstrap) mpi::sessionEnded(normalExit);
#endif
  if (impl.signal_thread.joinable()) {
    impl.stopping.store(true);
    pthread_kill(impl.signal_thread.native_handle(), SIGTERM);
    impl.signal_thread.join();
  }
  if (impl.signals_blocked) pthread_sigmask(SIG_SETMASK, &impl.previous_mask, nullptr);
  impl.signals_blocked = false;
  wlog::flush();
}

Session::~Session() {
  if (!impl_) return;
  teardown(*impl_, /*normalExit=*/std::uncaught_exceptions() == 0);
  impl_.reset();
}

int Session::rank() const { return impl_->options.rank; }
int Session::worldSize() const { return impl_->options.world_size; }
int Session::localRank() const { return impl_->options.local_rank; }
const SessionOptions& Session::options() const { return impl_->options; }
c10::Device Session::device() const { return impl_->device; }
BackendKind Session::backendKind() const { return impl_->kind; }
const c10::intrusive_ptr<c10d::Backend>& Session::backend() const { return impl_->backend; }
const c10::intrusive_ptr<c10d::Store>& Session::store() const { return impl_->store; }

void Session::addCleanupHook(std::string name, Hook hook) {
  std::lock_guard<std::mutex> lock(impl_->cleanup_mu);
  impl_->cleanup_hooks.emplace_back(std::move(name), std::move(hook));
}

void Session::barrier() {
  c10d::BarrierOptions barrier;
  barrier.timeout = impl_->options.collective_timeout;
  impl_->backend->barrier(barrier)->wait(impl_->options.collective_timeout);
}

}  // namespace ddpl::worker
