#include "worker/checkpoints.h"

#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "common/errors.h"
#include "common/file_io.h"
#include "worker/collectives.h"
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
      return "restart " + std::to_string(session.options().restartCount);
    case ResumeReason::kSameRun:
      return "run " + session.options().runId + " started again";
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
  static const std::regex kTemp("ckpt-step[0-9]+\\.pt\\.tmp\\.[0-9]+");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (std::regex_match(entry.path().filename().string(), kTemp)) fs::remove(entry.path(), ec);
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

ResumeReason chooseResume(int restartCount, const std::string& runId,
                          const std::string& storedRunId, bool resumeFlag) {
  if (restartCount > 0) return ResumeReason::kRestart;
  if (!runId.empty() && storedRunId == runId) return ResumeReason::kSameRun;
  if (resumeFlag) return ResumeReason::kResumeFlag;
  return ResumeReason::kFresh;
}

CheckpointManager::CheckpointManager(Session& session, CheckpointPolicy policy)
    : session_(session), policy_(std::move(policy)), dir_(policy_.dir, policy_.keep) {}

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
    decision =
        static_cast<int64_t>(chooseResume(session_.options().restartCount, session_.options().runId,
                                          dir_.storedRunId(), policy_.resume));
  }
  point.reason = static_cast<ResumeReason>(
      detail::allReduceInts(session_, {decision}, c10d::ReduceOp::MAX)[0]);
  point.reasonText = reasonText(point.reason, session_);

  if (point.reason == ResumeReason::kFresh) {
    if (leader) point.removedStale = dir_.removeAll();
  } else {
    CheckpointFile file;
    const bool found = dir_.newestComplete(file, &point.skippedTruncated);
    if (found) {
      loadChecked(file.path, refs, point.reasonText);
      point.path = file.path;
      if (refs.progress) point.progress = *refs.progress;
      std::lock_guard<std::mutex> lock(mu_);
      latest_ = file.path;
    }
  }
  if (leader) dir_.storeRunId(session_.options().runId);

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

std::string CheckpointManager::save(const CheckpointRefs& refs) {
  if (!enabled()) return "";
  if (!refs.progress)
    throw InvalidArgument("CheckpointManager::save: CheckpointRefs::progress is required");
  const std::string path = dir_.pathFor(refs.progress->step);
  saveCheckpoint(session_, path, refs);
  if (session_.rank() == 0) dir_.prune();
  std::lock_guard<std::mutex> lock(mu_);
  latest_ = path;
  return path;
}

std::string CheckpointManager::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

}  // namespace ddpl::worker
