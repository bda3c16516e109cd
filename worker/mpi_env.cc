#include "worker/mpi_env.h"

#include <exception>

#include "common/errors.h"

namespace ddpl::worker {
namespace {

bool has(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it != env.end() && !it->second.empty();
}

// nullopt when absent; InvalidArgument naming the variable when not a whole number >= 0.
std::optional<int> readCount(const Environment& env, const std::string& name) {
  if (!has(env, name)) return std::nullopt;
  const std::string& text = env.at(name);
  try {
    size_t used = 0;
    const long value = std::stol(text, &used);
    if (used == text.size() && value >= 0 && value <= 1'000'000'000) return static_cast<int>(value);
  } catch (const std::exception&) {
  }
  throw InvalidArgument("environment variable " + name + "='" + text + "' is not a whole number >= 0");
}

struct Names {
  const char* source;
  const char* rank;
  const char* size;  // nullptr: the launcher does not export one
  const char* local_rank;
  const char* local_size;
};

constexpr Names kOpenMpi{"OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                         "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr Names kPmi{"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};
constexpr Names kPmix{"PMIx", "PMIX_RANK", nullptr, nullptr, nullptr};
constexpr Names kSlurm{"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr};

bool anyPresent(const Environment& env, const Names& n) {
  for (const char* name : {n.rank, n.size, n.local_rank, n.local_size}) {
    if (name && has(env, name)) return true;
  }
  return false;
}

std::string partial(const Names& n, const char* present, const char* missing) {
  return std::string("a partial ") + n.source + " environment: " + present + " is set but " + missing +
         " is not; start the program with the launcher's own tool (mpirun, srun) or unset the " + n.source +
         " variables";
}

MpiLaunch read(const Environment& env, const Names& n) {
  MpiLaunch launch;
  launch.source = n.source;
  for (const char* name : {n.rank, n.size, n.local_rank, n.local_size}) {
    if (name && has(env, name)) {
      launch.variables += (launch.variables.empty() ? "" : " ") + std::string(name) + "=" + env.at(name);
    }
  }
  const auto rank = readCount(env, n.rank);
  const auto size = n.size ? readCount(env, n.size) : std::nullopt;
  const auto local_rank = n.local_rank ? readCount(env, n.local_rank) : std::nullopt;
  const auto local_size = n.local_size ? readCount(env, n.local_size) : std::nullopt;
  if (!rank)
    throw InvalidArgument(
        partial(n, size ? n.size : (local_rank ? n.local_rank : n.local_size), n.rank));
  if (n.size && !size) throw InvalidArgument(partial(n, n.rank, n.size));
  if (n.local_size && local_rank.has_value() != local_size.has_value()) {
    throw InvalidArgument(local_rank ? partial(n, n.local_rank, n.local_size)
                                     : partial(n, n.local_size, n.local_rank));
  }
  const std::string what = " (" + launch.variables + ")";
  if (size && *size < 1) throw InvalidArgument(std::string(n.size) + " must be >= 1" + what);
  if (size && *rank >= *size) {
    throw InvalidArgument(std::string(n.rank) + "=" + std::to_string(*rank) + " is not below " + n.size + "=" +
                          std::to_string(*size) + what);
  }
  if (local_size && (*local_size < 1 || *local_rank >= *local_size)) {
    throw InvalidArgument(std::string(n.local_rank) + "=" + std::to_string(*local_rank) +
                          " is not below " + n.local_size + "=" + std::to_string(*local_size) +
                          what);
  }
  if (local_size && size && *local_size > *size) {
    throw InvalidArgument(std::string(n.local_size) + "=" + std::to_string(*local_size) +
                          " exceeds " + n.size + "=" + std::to_string(*size) + what);
  }
  if (local_rank && size && *local_rank >= *size) {
    throw InvalidArgument(std::string(n.local_rank) + "=" + std::to_string(*local_rank) +
                          " is not below " + n.size + "=" + std::to_string(*size) + what);
  }
  launch.rank = *rank;
  launch.world_size = size;
  launch.local_rank = local_rank;
  launch.local_world_size = local_size;
  return launch;
}

}  // namespace

BootstrapMode parseBootstrapMode(const std::string& name) {
  if (name.empty() || name == "auto") return BootstrapMode::kAuto;
  if (name == "env") return BootstrapMode::kEnv;
  if (name == "mpi") return BootstrapMode::kMpi;
  throw InvalidArgument("DDPL_BOOTSTRAP='" + name + "' is not auto, env or mpi");
}

std::optional<MpiLaunch> detectMpiLaunch(const Environment& env) {
  // OpenMPI also exports PMIX_RANK, and srun --mpi=pmix the Slurm variables: the most
  // specific set wins.
  if (anyPresent(env, kOpenMpi)) return read(env, kOpenMpi);
  if (has(env, kPmi.rank) || has(env, kPmi.size)) return read(env, kPmi);
  const bool slurmStep = has(env, "SLURM_STEP_ID") && anyPresent(env, kSlurm);
  if (has(env, kPmix.rank)) {
    MpiLaunch launch = read(env, kPmix);
    if (slurmStep) {
      // srun --mpi=pmix: Slurm knows the sizes; they must describe the same rank.
      MpiLaunch slurm = read(env, kSlurm);
      if (slurm.rank != launch.rank) {
        throw InvalidArgument("PMIX_RANK=" + std::to_string(launch.rank) + " but SLURM_PROCID=" +
                              std::to_string(slurm.rank) + ": inconsistent MPI environment");
      }
      slurm.source = "PMIx";
      slurm.variables = launch.variables + " " + slurm.variables;
      return slurm;
    }
    return launch;
  }
  if (slurmStep) return read(env, kSlurm);
  return std::nullopt;
}

}  // namespace ddpl::worker
