#include "worker/checkpoint_manager.h"

#include <signal.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>

#include "common/checkpoint_files.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "worker/collectives.h"
#include "worker/log_bridge.h"
#include "worker/session.h"

namespace ddpl::worker {
namespace {

namespace fs = std::filesystem;

uint32_t le32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t le64(const unsigned char* p) { return uint64_t{le32(p)} | uint64_t{le32(p + 4)} << 32; }
uint16_t le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

bool readAt(std::ifstream& in, uint64_t offset, unsigned char* out, size_t n) {
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(n));
  return static_cast<size_t>(in.gcount()) == n;
}

std::string reasonText(ResumeReason reason, const Session& session) {
  switch (reason) {
    case ResumeReason::kFresh:
      return "";
    case ResumeReason::kResumeFlag:
      return "resume requested";
    case ResumeReason::kRestart:
      return "restart " + std::to_string(session.options().restart_count);
    case ResumeReason::kSameRun:
      return "run " + session.options().run_id + " started again";
  }
  return "";
}

// LibTorch's load replaces a tensor of another shape instead of refusing it: compare after.
void loadChecked(const std::string& path, const CheckpointRefs& refs, const std::string& why) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& t : refs.model->named_parameters()) shapes.push_back(t.value().sizes().vec());
  try {
    loadCheckpoint(path, refs);
    size_t i = 0;
    for (const auto& t : refs.model->named_parameters()) {
      if (t.value().sizes().vec() != shapes[i++]) {
        throw InvalidArgument("parameter '" + t.key() + "' has shape " +
                              c10::str(t.value().sizes()) + " in the checkpoint but " +
                              c10::str(c10::IntArrayRef(shapes[i - 1])) + " in this model");
      }
    }
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw InvalidArgument("cannot resume from " + path + " (" + why +
                          "): " + what.substr(0, what.find('\n')) +
                          "; the file is complete, so it was written for another model or "
                          "configuration (architecture, width, dtype): use another checkpoint "
                          "directory, or start a new run without resuming");
  }
}

}  // namespace

std::string checkpointDefect(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::string("unreadable: ") + std::strerror(errno);
  const auto size = static_cast<uint64_t>(st.st_size);
  std::ifstream in(path, std::ios::binary);
  if (!in) return "unreadable: cannot open";
  const auto truncated = [size](const std::string& detail) {
    return "truncated: " + std::to_string(size) + " bytes, " + detail;
  };
  constexpr uint64_t kEocd = 22, kMaxComment = 0xFFFF;
  if (size < kEocd) return truncated("shorter than an end-of-archive record");
  const uint64_t tail = std::min<uint64_t>(size, kEocd + kMaxComment);
  std::vector<unsigned char> buf(tail);
  if (!readAt(in, size - tail, buf.data(), tail)) return "unreadable: short read";
  // The record is the last thing in the file, followed only by its comment.
  for (int64_t i = static_cast<int64_t>(tail - kEocd); i >= 0; --i) {
    const unsigned char* r = buf.data() + i;
    if (le32(r) != 0x06054b50) continue;
    const uint64_t at = size - tail + static_cast<uint64_t>(i);
    if (at + kEocd + le16(r + 20) != size) continue;
    uint64_t cdSize = le32(r + 12), cdOffset = le32(r + 16);
    uint64_t cdEnd = at;
    if (cdOffset == 0xFFFFFFFF || cdSize == 0xFFFFFFFF) {
      // zip64: a locator right before the record points at the zip64 end record.
      unsigned char loc[20], rec[56];
      if (at < 20 || !readAt(in, at - 20, loc, 20) || le32(loc) != 0x07064b50)
        return truncated("zip64 archive without its locator");
      const uint64_t recAt = le64(loc + 8);
      if (recAt + 56 > at - 20 || !readAt(in, recAt, rec, 56) || le32(rec) != 0x06064b50)
        return truncated("zip64 end record missing");
      cdSize = le64(rec + 40);
      cdOffset = le64(rec + 48);
      cdEnd = recAt;
    }
    unsigned char sig[4];
    if (cdOffset + cdSize > cdEnd || !readAt(in, cdOffset, sig, 4) || le32(sig) != 0x02014b50)
      return truncated("central directory missing");
    return "";
  }
  return truncated("no end-of-archive record");
}

CheckpointDirectory::CheckpointDirectory(std::string dir, int keep)
    : dir_(std::move(dir)), keep_(std::max(1, keep)) {}

std::string CheckpointDirectory::pathFor(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-step%08lld.pt", static_cast<long long>(step));
  return dir_ + "/" + name;
}

std::vector<CheckpointFile> CheckpointDirectory::list() const {
  static const std::regex kName("ckpt-step([0-9]{1,18})\\.pt");
  std::vector<CheckpointFile> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kName))
      found.push_back({std::stoll(m[1]), entry.path().string()});
  }
  std::sort(found.begin(), found.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return a.step != b.step ? a.step > b.step : a.path > b.path;
  });
  return found;
}

bool CheckpointDirectory::newestComplete(CheckpointFile& out,
                                         std::vector<std::string>* skipped) const {
  for (const auto& file : list()) {
    const std::string defect = checkpointDefect(file.path);
    if (defect.empty()) {
      out = file;
      return true;
    }
    if (skipped) skipped->push_back(file.path + ": " + defect);
  }
  return false;
}

void CheckpointDirectory::removeTemporaries() const {
  // Only a dead writer's: launch persists into the same directory (the memory tier, at a
  // worker's failure, while the group restarts), and removing its file in flight failed its
  // rename. A writer alive on this host keeps its own; one that is not (or another host's, whose
  // pid means nothing here) is stale once it has not written for a while.
  static const std::regex kTemp("ckpt-step[0-9]+\\.pt\\.tmp\\.([0-9]+)");
  constexpr auto kStaleAfter = std::chrono::minutes(10);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, kTemp)) continue;
    const long pid = std::strtol(m[1].str().c_str(), nullptr, 10);
    const bool writer_alive =
        pid > 0 && pid <= INT32_MAX && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
    std::error_code tec;
    const auto written = fs::last_write_time(entry.path(), tec);
    const bool quiet = !tec && fs::file_time_type::clock::now() - written > kStaleAfter;
    if (!writer_alive || quiet) fs::remove(entry.path(), ec);
  }
}

size_t CheckpointDirectory::prune() const {
  const auto all = list();
  size_t removed = 0;
  std::error_code ec;
  for (size_t i = static_cast<size_t>(keep_); i < all.size(); ++i)
    removed += fs::remove(all[i].path, ec);
  return removed;
}

size_t CheckpointDirectory::removeAll() const {
  size_t removed = 0;
  std::error_code ec;
  for (const auto& file : list()) removed += fs::remove(file.path, ec);
  return removed;
}

std::string CheckpointDirectory::storedRunId() const {
  std::ifstream in(dir_ + "/" + kRunIdFile);
  std::string id;
  std::getline(in, id);
  return id;
}

void CheckpointDirectory::storeRunId(const std::string& id) const {
  if (id.empty() || storedRunId() == id) return;
  writeFileAtomically(dir_ + "/" + kRunIdFile, id + "\n");
}

ResumeReason chooseResume(int restart_count, const std::string& run_id,
                          const std::string& storedRunId, bool resumeFlag) {
  if (restart_count > 0) return ResumeReason::kRestart;
  if (!run_id.empty() && storedRunId == run_id) return ResumeReason::kSameRun;
  if (resumeFlag) return ResumeReason::kResumeFlag;
  return ResumeReason::kFresh;
}

CheckpointManager::CheckpointManager(Session& session, CheckpointPolicy policy)
    : session_(session), policy_(std::move(policy)), dir_(policy_.dir, policy_.keep) {
  const std::string& root = session_.options().checkpoint_memory;
  if (!policy_.memory || !enabled() || root.empty()) return;
  // The first save makes the directory (launch does not: a job that never saves has none).
  rank_dir_ = root + "/" + ckpt::rankDirName(session_.rank());
}

namespace {

// The newest step in every rank's offer, over the process group. The answer is always below
// `bound`; each round's candidate, the smallest of the ranks' newest offers below it, is at
// least the answer, and is the answer when every rank has it. One round in the common case
// (every rank offers the same newest step); never more rounds than offers.
std::optional<int64_t> agreeOverGroup(Session& session, const std::set<int64_t>& offer) {
  int64_t bound = std::numeric_limits<int64_t>::max();
  for (;;) {
    auto it = offer.lower_bound(bound);
    const int64_t mine = it == offer.begin() ? -1 : *std::prev(it);
    const int64_t candidate = detail::allReduceInts(session, {mine}, c10d::ReduceOp::MIN)[0];
    if (candidate < 0) return std::nullopt;
    const int64_t everyone =
        detail::allReduceInts(session, {offer.count(candidate) ? 1 : 0}, c10d::ReduceOp::MIN)[0];
    if (everyone == 1) return candidate;
    bound = candidate;
  }
}

}  // namespace

ResumePoint CheckpointManager::resume(const CheckpointRefs& refs) {
  ResumePoint point;
  if (!enabled()) return point;
  if (!refs.model) throw InvalidArgument("CheckpointManager::resume: no model to load into");
  const bool leader = session_.rank() == 0;
  // Rank 0 decides, so that no rank reads the run id while rank 0 rewrites it.
  int64_t decision = 0;
  if (leader) {
    fs::create_directories(dir_.dir());
    dir_.removeTemporaries();
    decision = static_cast<int64_t>(chooseResume(session_.options().restart_count,
                                                 session_.options().run_id, dir_.storedRunId(),
                                                 policy_.resume));
  }
  point.reason = static_cast<ResumeReason>(
      detail::allReduceInts(session_, {decision}, c10d::ReduceOp::MAX)[0]);
  point.reason_text = reasonText(point.reason, session_);

  if (point.reason == ResumeReason::kFresh) {
    if (leader) point.removed_stale = dir_.removeAll();
  } else if (inMemory()) {
    resumeAgreed(refs, point);
  } else {
    CheckpointFile file;
    const bool found = dir_.newestComplete(file, &point.skipped_truncated);
    if (found) {
      loadChecked(file.path, refs, point.reason_text);
      point.path = file.path;
      point.source = "disk";
      if (refs.progress) point.progress = *refs.progress;
      std::lock_guard<std::mutex> lock(mu_);
      latest_ = file.path;
    }
  }
  if (leader) dir_.storeRunId(session_.options().run_id);

  // Rule 4: differing answers mean the directory is not one shared directory.
  const int64_t step = point.progress.step;
  const auto extremes = detail::allReduceInts(session_, {step, -step}, c10d::ReduceOp::MAX);
  const int64_t most = extremes[0], least = -extremes[1];
  if (most != least) {
    throw Error("ranks resume from different steps (" + std::to_string(least) + " to " +
                std::to_string(most) + "; this rank: " + std::to_string(step) +
                "): the checkpoint directory " + dir_.dir() +
                " must be one directory shared by all nodes");
  }
  return point;
}

std::string CheckpointManager::save(const CheckpointRefs& refs, bool durable) {
  if (!enabled()) return "";
  if (!refs.progress)
    throw InvalidArgument("CheckpointManager::save: CheckpointRefs::progress is required");
  if (inMemory()) return saveInMemory(refs, durable);
  const std::string path = dir_.pathFor(refs.progress->step);
  // saveCheckpoint(session, ...) with the fence held by the writer only: a lock held across its
  // barrier would wait for ranks that wait for the lock.
  std::exception_ptr error;
  if (session_.rank() == 0) {
    try {
      ckpt::FenceGuard fence(dir_.dir(), fenceToken(),
                             "checkpoint step " + std::to_string(refs.progress->step));
      saveCheckpoint(path, refs);
    } catch (...) {
      error = std::current_exception();
    }
  }
  session_.barrier();  // nobody loads (or exits) before rank 0 has finished writing
  if (error) std::rethrow_exception(error);
  if (session_.rank() == 0) dir_.prune();
  std::lock_guard<std::mutex> lock(mu_);
  latest_ = path;
  return path;
}

std::string CheckpointManager::memoryFileName(int64_t step) const {
  const std::string path = dir_.pathFor(step);
  return path.substr(path.find_last_of('/') + 1);
}

void CheckpointManager::resumeAgreed(const CheckpointRefs& refs, ResumePoint& point) {
  const int64_t rank = session_.rank();
  std::set<int64_t> offer;
  std::map<int64_t, std::string> inMemory, onDisk;
  // Every rank holds the same state (replicated), so any local rank's copy serves: ranks may
  // be one checkpoint apart when one dies, and with --checkpoint-memory-keep=1 the rank ahead
  // kept only the newer.
  const std::string& root = session_.options().checkpoint_memory;
  std::vector<std::pair<std::string, int64_t>> rankDirs{{rank_dir_, rank}};
  const int64_t first = rank - session_.options().local_rank;  // launch numbers a node's ranks
  for (int64_t r = first; r < first + session_.options().local_world_size; ++r)  // contiguously
    if (r != rank && r >= 0) rankDirs.emplace_back(root + "/" + ckpt::rankDirName(r), r);
  for (const auto& [dir, owner] : rankDirs) {
    for (const auto& s : ckpt::listCommitted(dir, owner)) {
      const std::string name = memoryFileName(s.step);
      const bool has = std::any_of(s.record.files.begin(), s.record.files.end(),
                                   [&](const ckpt::FileEntry& f) { return f.path == name; });
      if (!has || s.record.world_size != session_.worldSize() || inMemory.count(s.step) ||
          (owner != rank && !s.record.replicated))
        continue;
      inMemory[s.step] = s.dir + "/" + name;
      offer.insert(s.step);
    }
  }
  std::vector<std::pair<int64_t, std::string>> truncated;
  for (const auto& file : dir_.list()) {
    if (onDisk.count(file.step)) continue;
    const std::string defect = checkpointDefect(file.path);
    if (!defect.empty()) {
      truncated.emplace_back(file.step, file.path + ": " + defect);
      continue;
    }
    onDisk[file.step] = file.path;
    offer.insert(file.step);
  }
  const auto agreed = agreeOverGroup(session_, offer);
  for (const auto& [step, why] : truncated)
    if (!agreed || step > *agreed) point.skipped_truncated.push_back(why);
  if (!agreed) return;
  const bool fromMemory = inMemory.count(*agreed) > 0;
  const std::string path = fromMemory ? inMemory[*agreed] : onDisk[*agreed];
  loadChecked(path, refs, point.reason_text);
  point.path = path;
  // launch fetched it from another node's replica (launcher/checkpoint/replica.h).
  struct stat st {};
  const std::string origin = path.substr(0, path.find_last_of('/')) + "/" + ckpt::kOriginName;
  point.source = !fromMemory                         ? "disk"
                 : ::lstat(origin.c_str(), &st) == 0 ? "peer replica"
                                                     : "memory";
  if (refs.progress) point.progress = *refs.progress;
  std::lock_guard<std::mutex> lock(mu_);
  latest_ = path;
}

std::string CheckpointManager::saveInMemory(const CheckpointRefs& refs, bool durable) {
  const int64_t step = refs.progress->step;
  const auto& o = session_.options();
  ckpt::makeRankDir(o.checkpoint_memory, session_.rank());
  const uint64_t held = ckpt::rankUsage(rank_dir_).committed;
  const uint64_t allowance = ckpt::writeAllowance(o.checkpoint_budget, held);
  const std::string partial = ckpt::beginStep(rank_dir_, step);
  const std::string file = partial + "/" + memoryFileName(step);
  try {
    saveCheckpoint(file, refs, SaveLimits{allowance, /*log=*/false});
  } catch (const CheckpointTooLarge& e) {
    ckpt::removePartials(rank_dir_, static_cast<long>(::getpid()));
    // Every rank holds the same state, so every rank is over: rank 0's disk copy serves all.
    if (!warned_budget_)
      wlog::warn("checkpoint step " + std::to_string(step) + " does not fit this rank's memory " +
                 "budget: more than " + std::to_string(e.bytesSoFar()) + " bytes, budget " +
                 std::to_string(o.checkpoint_budget) + " bytes of which " + std::to_string(held) +
                 " hold committed checkpoints; written to " + dir_.dir() +
                 " instead (raise launch --checkpoint-memory, or lower --checkpoint-memory-keep)");
    warned_budget_ = true;
    const std::string path = dir_.pathFor(step);
    if (session_.rank() == 0) {
      fs::create_directories(path.substr(0, path.find_last_of('/')));
      ckpt::FenceGuard fence(dir_.dir(), fenceToken(), "checkpoint step " + std::to_string(step));
      saveCheckpoint(path, refs);
    }
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = path;
    return path;
  } catch (...) {
    ckpt::removePartials(rank_dir_, static_cast<long>(::getpid()));
    throw;
  }
  ckpt::CommitRecord record;
  record.step = step;
  record.rank = session_.rank();
  record.world_size = session_.worldSize();
  record.durable_path = dir_.dir();
  if (record.durable_path.empty() || record.durable_path[0] != '/') {
    char cwd[4096];
    if (!::getcwd(cwd, sizeof cwd)) throw Error("cannot resolve " + dir_.dir() + ": getcwd failed");
    record.durable_path = std::string(cwd) + "/" + record.durable_path;
  }
  record.persist = durable;
  record.replicated = true;
  record.keep = policy_.keep;
  record.writer = fenceToken();
  const std::string committed = ckpt::commitStep(rank_dir_, partial, record);
  ckpt::trimCommitted(rank_dir_, o.checkpoint_keep, step);
  // Readable now: the memory copy. A durable one is also where launch puts it, by the time
  // launch exits (latestDurable()).
  const std::string path = committed + "/" + memoryFileName(step);
  std::lock_guard<std::mutex> lock(mu_);
  latest_ = path;
  if (durable) latest_durable_ = dir_.pathFor(step);
  return path;
}

ckpt::FenceToken CheckpointManager::fenceToken() const {
  const auto& o = session_.options();
  return ckpt::FenceToken{o.run_id, o.round_epoch, o.round};
}

std::string CheckpointManager::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

std::string CheckpointManager::latestDurable() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inMemory() ? latest_durable_ : latest_;
}

}  // namespace ddpl::worker
