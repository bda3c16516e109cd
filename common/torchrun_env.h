#pragma once
// The names of the variables torchrun gives its workers (and a few it reads), written once:
// the agent sets them, the MPI shim derives them, doctor checks them and the worker library
// reads them. torch/distributed/elastic/agent/server/local_elastic_agent.py is the reference.
namespace ddpl::torchrun_env {

inline constexpr const char kRank[] = "RANK";
inline constexpr const char kLocalRank[] = "LOCAL_RANK";
inline constexpr const char kGroupRank[] = "GROUP_RANK";
inline constexpr const char kRoleRank[] = "ROLE_RANK";
inline constexpr const char kRoleName[] = "ROLE_NAME";
inline constexpr const char kWorldSize[] = "WORLD_SIZE";
inline constexpr const char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr const char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr const char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr const char kMasterAddr[] = "MASTER_ADDR";
inline constexpr const char kMasterPort[] = "MASTER_PORT";
inline constexpr const char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr const char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
// Read by launch: "1" leaves the job's TCPStore to rank 0 (torchrun's opt-out of its shared
// store).
inline constexpr const char kDisableSharedStore[] = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE";
inline constexpr const char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr const char kLogLinePrefixTemplate[] = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE";
// torchrun 2.15 exports its --signals-to-handle to the workers under this name.
inline constexpr const char kSignalsToHandle[] = "TORCHELASTIC_SIGNALS_TO_HANDLE";
// What --virtual-local-rank narrows: HIP's list wins when set (ROCm reads it first).
inline constexpr const char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";
inline constexpr const char kHipVisibleDevices[] = "HIP_VISIBLE_DEVICES";
// Not torchrun's own, but set by it (or by us in its place) when the user has not.
inline constexpr const char kNcclAsyncErrorHandling[] = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char kOmpNumThreads[] = "OMP_NUM_THREADS";

}  // namespace ddpl::torchrun_env
