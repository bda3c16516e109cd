#pragma once
// The values `launch`, `rdzv-server` and the worker library must agree on, in one place: default
// ports and timeouts, the DDPL_* environment variables that pass between them, and the signals
// that mean "stop". Each component's options start from these; a change here changes all of
// them together. Plain constants: installed with the worker headers, no dependencies.
#include <chrono>
#include <csignal>

namespace ddpl {
namespace defaults {

// torchrun's defaults, so that flags written for torchrun mean the same here.
inline constexpr int kRdzvPort = 29400;    // the rendezvous service (--rdzv-endpoint, rdzv-server)
inline constexpr int kMasterPort = 29500;  // MASTER_PORT: the TCPStore of a static launch

// Rendezvous: how long a join waits for the minimum number of nodes, how long it keeps the door
// open for more once the minimum is there, and after how long without a heartbeat a node is
// presumed dead.
inline constexpr std::chrono::seconds kJoinTimeout{600};
inline constexpr std::chrono::seconds kLastCallTimeout{30};
inline constexpr std::chrono::seconds kHeartbeatWindow{30};
// A store operation (get/wait) and a collective: bounded, so that a dead peer turns into an
// error naming it instead of a hang (torch's own defaults are 5 and 30 minutes).
inline constexpr std::chrono::seconds kStoreTimeout{300};
inline constexpr std::chrono::seconds kCollectiveTimeout{300};
// From the stop signal to SIGKILL of the workers that ignore it (torchrun: 30 s).
inline constexpr std::chrono::seconds kShutdownTimeout{30};

// What stops launch and rdzv-server cleanly (torchrun's set). Workers under a Session also catch
// SIGUSR1/SIGUSR2, which `launch --signals-to-handle` may forward (batch systems' pre-emption
// warnings), so that their cleanup hooks run for those too.
inline constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};

}  // namespace defaults

// The environment variables of the ddplaunch programs, by name (docs/user-guide.md lists them).
namespace envvar {

// The rendezvous server's shared secret, read by both `rdzv-server` and `launch`. The older
// name rdzv-server read, DDPL_STORE_TOKEN, is still accepted there and by launch, with a warning:
// it is the per-worker variable below, which launch sets for each worker itself.
inline constexpr const char kRdzvToken[] = "DDPL_RDZV_TOKEN";
inline constexpr const char kLegacyRdzvToken[] = "DDPL_STORE_TOKEN";

// Set by launch for each worker: our gRPC store, its token and this attempt's key prefix.
inline constexpr const char kStoreAddr[] = "DDPL_STORE_ADDR";
inline constexpr const char kStoreToken[] = "DDPL_STORE_TOKEN";
inline constexpr const char kStorePrefix[] = "DDPL_STORE_PREFIX";
// "0": the worker reaches DDPL_STORE_ADDR over gRPC only, not the store socket.
inline constexpr const char kStoreSocket[] = "DDPL_STORE_SOCKET";
// Set by launch for each worker: the pipe its step heartbeats go to (common/heartbeat.h).
inline constexpr const char kHeartbeatFd[] = "DDPL_HEARTBEAT_FD";
// Set by launch for each worker while hangs are looked for: the socket where the worker's
// ddplaunch module answers with torch's flight recorder (launcher/health/flight_recorder.h).
inline constexpr const char kFlightRecorderSocket[] = "DDPL_FLIGHT_RECORDER_SOCKET";
// Set by launch for each worker: the round its group belongs to and the epoch that numbers it
// (round_rules.h NodePlace): the checkpoint fence refuses writes from an older (epoch, round)
// than the newest that committed to a directory. No epoch (0): nothing to fence.
inline constexpr const char kRound[] = "DDPL_ROUND";
inline constexpr const char kRoundEpoch[] = "DDPL_ROUND_EPOCH";
// Set by launch on every process it starts, to find strays after it dies
// (launcher/agent/watchdog.h).
inline constexpr const char kLaunchId[] = "DDPL_LAUNCH_ID";

// Read by the worker library's SessionOptions::fromEnvironment.
inline constexpr const char kBackend[] = "DDPL_BACKEND";      // auto | gloo | nccl
inline constexpr const char kBootstrap[] = "DDPL_BOOTSTRAP";  // auto | env | mpi
inline constexpr const char kRetainFreedMemory[] = "DDPL_RETAIN_FREED_MEMORY";  // 1 | 0

// Read by launch.
inline constexpr const char kLaunchPython[] = "DDPL_LAUNCH_PYTHON";
inline constexpr const char kMpirun[] = "DDPL_MPIRUN";
inline constexpr const char kMpiRanksPerHost[] = "DDPL_MPI_RANKS_PER_HOST";
inline constexpr const char kEtcdPassword[] = "DDPL_ETCD_PASSWORD";

// Set by launch for each worker: checkpoints in memory (docs/checkpoints.md): the node's memory
// root, bytes per rank, committed steps kept per rank, launch's --checkpoint-dir.
inline constexpr const char kCheckpointMemory[] = "DDPL_CHECKPOINT_MEMORY";
inline constexpr const char kCheckpointBudget[] = "DDPL_CHECKPOINT_MEMORY_BUDGET";
inline constexpr const char kCheckpointKeep[] = "DDPL_CHECKPOINT_MEMORY_KEEP";
inline constexpr const char kCheckpointDir[] = "DDPL_CHECKPOINT_DIR";

}  // namespace envvar
}  // namespace ddpl
