#include "launcher/checkpoint/checkpoint_keeper.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/bytes.h"
#include "common/errors.h"
#include "common/log.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {
namespace {

constexpr const char* kReplicaKey = "ckpt-replica";  // a node's checkpoint replica endpoint
constexpr const char* kBase = "/dev/shm";

}  // namespace

CheckpointKeeper::CheckpointKeeper(CheckpointKeeperOptions options, NodeValues& node_values)
    : options_(std::move(options)), node_values_(node_values) {
  const std::string base = kBase;
  const auto& o = options_;
  uint64_t budget = o.memory ? *o.memory : MemoryTier::autoBudget(base, o.nproc);
  if (budget == 0) {
    if (!o.memory) log::warn("checkpoints in memory are off: {} is not usable", base);
    return;
  }
  MemoryTierOptions mo;
  mo.budget_per_rank = budget;
  mo.keep = o.keep;
  mo.base = base;
  if (!o.durable_dir.empty()) mo.durable_dir = fs::absolute(o.durable_dir).string();
  try {
    tier_ = std::make_unique<MemoryTier>(mo);
  } catch (const Error& e) {
    if (o.memory) throw;
    log::warn("checkpoints in memory are off: {}", e.what());
    return;
  }
  log::debug("checkpoints in memory: {} per rank in {}", humanBytes(static_cast<int64_t>(budget)),
             tier_->root());
}

CheckpointKeeper::~CheckpointKeeper() = default;

const std::string& CheckpointKeeper::root() const { return tier_->root(); }

std::map<std::string, std::string> CheckpointKeeper::startGroup(
    const rdzv::round_rules::NodePlace& place, int restart_count) {
  if (!tier_) return {};
  std::vector<int64_t> ranks;
  for (int lr = 0; lr < options_.nproc; ++lr) ranks.push_back(place.rank_offset + lr);
  auto env = tier_->startGroup(ranks);
  const bool stayed = last_place_ && last_place_->epoch_ms == place.epoch_ms &&
                      last_place_->round + 1 == place.round &&
                      last_place_->rank_offset == place.rank_offset &&
                      last_place_->world_size == place.world_size;
  last_place_ = place;
  if (place.group_world_size > 1) startReplicas(ranks, place, restart_count, stayed);
  return env;
}

// Several nodes: this node's replica endpoint goes to the job's store (written by the
// rendezvous's health thread: the loop never waits on the store for it) and the persister
// thread looks up the next node's to send this node's commits there. A node that joins a
// running job (a round after the first, or a restart) fetches its ranks' newest steps from the
// peers before its workers start when the others may have trained without it: it has nothing in
// memory for its ranks (a replacement), or it was not in the round before this one (cut off,
// fenced, re-joining: its memory is as old as its leaving, and the ranks would agree on the
// newest step all of them offer). A node that was in the previous round holds what the others
// hold, and its restart asks nobody. Steps are per world size: what the others trained at a
// smaller world while it was away reaches it through the durable directory. Where it fetches the
// loop waits, 10 s at most for the peers' endpoints and 60 s per fetch.
void CheckpointKeeper::startReplicas(const std::vector<int64_t>& ranks,
                                     const rdzv::round_rules::NodePlace& place, int restart_count,
                                     bool stayed) {
  try {
    node_values_.publishNodeValue(kReplicaKey,
                                  tier_->startReplicas(options_.advertised_host, options_.nproc));
  } catch (const std::exception& e) {
    log::warn("checkpoint replicas off for this round: {}", e.what());
    return;
  }
  const int next = (place.group_rank + 1) % place.group_world_size;
  tier_->setSuccessorLookup([values = &node_values_, next]() -> std::optional<ReplicaEndpoint> {
    if (auto v = values->nodeValue(kReplicaKey, next)) return parseEndpoint(*v);
    return std::nullopt;
  });
  if ((place.round == 0 && restart_count == 0) ||
      (stayed && !tier_->missing(ranks, place.world_size)))
    return;
  std::vector<ReplicaEndpoint> peers;
  std::vector<bool> found(static_cast<size_t>(place.group_world_size), false);
  found[static_cast<size_t>(place.group_rank)] = true;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::find(found.begin(), found.end(), false) != found.end() &&
         std::chrono::steady_clock::now() < deadline) {
    for (int n = 0; n < place.group_world_size; ++n) {
      if (found[static_cast<size_t>(n)]) continue;
      try {
        if (auto v = node_values_.nodeValue(kReplicaKey, n))
          if (auto e = parseEndpoint(*v)) {
            peers.push_back(*e);
            found[static_cast<size_t>(n)] = true;
          }
      } catch (const std::exception& e) {
        log::debug("checkpoint replica endpoint of node {}: {}", n, e.what());
      }
    }
    if (std::find(found.begin(), found.end(), false) != found.end())
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (const auto& line : tier_->pullNewer(ranks, place.world_size, peers, 60))
    log::info("{}", line);
}

void CheckpointKeeper::tick(double now) {
  if (!tier_) return;
  tier_->tick();  // starts watching once a worker wrote a checkpoint
  if (now >= next_status_) {
    status_ = tier_->status();
    next_status_ = now + 1;
  }
}

void CheckpointKeeper::onWorkerExit(int64_t global_rank, pid_t pid) {
  if (tier_) tier_->onWorkerExit(global_rank, pid);
}

std::optional<int64_t> CheckpointKeeper::bytesOf(int64_t global_rank) const {
  for (const auto& s : status_)
    if (s.rank == global_rank && s.committed_bytes + s.partial_bytes > 0)
      return static_cast<int64_t>(s.committed_bytes + s.partial_bytes);
  return std::nullopt;
}

std::string CheckpointKeeper::drain() {
  return tier_ ? tier_->drain(options_.drain_timeout_sec) : "";
}

void CheckpointKeeper::logSummary() const {
  if (!tier_) return;
  std::vector<std::string> parts;
  for (const auto& s : tier_->status()) {
    if (s.newest_step < 0 && s.committed_bytes == 0) continue;
    std::string p = fmt::format("rank {} {} (step {}", s.rank,
                                humanBytes(static_cast<int64_t>(s.committed_bytes)), s.newest_step);
    if (!s.persists)
      p += ", rank 0's copy persists)";
    else
      p +=
          s.persisted_step >= 0 ? fmt::format(", on disk {})", s.persisted_step) : ", not on disk)";
    if (!s.error.empty()) p += ": " + s.error;
    parts.push_back(std::move(p));
  }
  if (!parts.empty())
    log::info("checkpoints in memory (budget {} per rank): {}",
              humanBytes(static_cast<int64_t>(tier_->budgetPerRank())), fmt::join(parts, "; "));
}

void CheckpointKeeper::logDrained(const std::string& line) {
  if (line.find("not persisted") != std::string::npos)
    log::warn("{}", line);
  else if (!line.empty())
    log::info("{}", line);
}

}  // namespace ddpl::launcher
