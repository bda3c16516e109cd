#pragma once
// The memory checkpoint tier's contract (docs/checkpoints.md, format version 1): the names, the
// commit record, and the decisions launch, the C++ worker library and the Python module must
// take alike (the resume agreement, durable retention, the budget). Pure: no file is touched
// here (common/checkpoint_files.h does the I/O). Plain std:: only: the worker library includes
// it next to LibTorch.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/defaults.h"

namespace ddpl::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kRecordName = ".ddpl-commit.json";
// In a committed step launch fetched from another node's replica (launcher/checkpoint/replica.h):
// the worker reports such a step as "peer" (Python) or "peer replica" (C++).
inline constexpr const char* kOriginName = ".ddpl-origin";
// Variables launch sets for each worker when the tier is on (the one list: common/defaults.h).
inline constexpr const char* kMemoryEnv = envvar::kCheckpointMemory;
inline constexpr const char* kBudgetEnv = envvar::kCheckpointBudget;
inline constexpr const char* kKeepEnv = envvar::kCheckpointKeep;
inline constexpr const char* kDirEnv = envvar::kCheckpointDir;
// A committed checkpoint lists its files; a record that names more is refused as hostile or
// broken (the agent opens them all at once while copying).
inline constexpr size_t kMaxFiles = 4096;
inline constexpr size_t kMaxRecordBytes = 4 << 20;

struct FileEntry {
  std::string path;  // relative to the step directory
  uint64_t size = 0;
};

// Who wrote a checkpoint: the job's run and the (epoch, round) its group belongs to (launch sets
// DDPL_ROUND_EPOCH and DDPL_ROUND). Epoch 0: not known (static nodes, etcd), nothing fenced.
struct FenceToken {
  std::string run_id;
  int64_t epoch = 0;
  int64_t round = 0;
  bool known() const { return epoch > 0; }
};
inline constexpr const char* kFenceName = ".ddpl-fence";
inline constexpr size_t kMaxFenceBytes = 4096;

// Whether a write by `mine` is refused where `newest` is the last round that committed: the same
// run, and an older (epoch, round). Another run's fence says nothing of this one (a new job into
// the same directory starts its own count).
bool fenceRefuses(const FenceToken& newest, const FenceToken& mine);
// The encoding of encodeRecord, then a newline.
std::string encodeFence(const FenceToken& t);
// None when the text is not a fence (empty, or written by something else): no refusal on it.
std::optional<FenceToken> decodeFence(const std::string& text);
// "round 4 (epoch 1733300000000) of run 'job7'".
std::string describeFence(const FenceToken& t);

struct CommitRecord {
  int version = kFormatVersion;
  int64_t step = 0;
  int64_t rank = 0;
  int64_t world_size = 1;
  std::vector<FileEntry> files;
  uint64_t bytes = 0;
  std::string durable_path;  // absolute; empty: not persisted
  bool persist = true;
  bool replicated = false;
  int64_t keep = 2;  // durable retention for this rank; 0: all
  double time = 0;
  FenceToken writer;  // optional in the record: absent from older writers'
};

std::string rankDirName(int64_t rank);               // "rank-3"
std::string stepDirName(int64_t step);               // "step-40"
std::string partialDirName(int64_t step, long pid);  // "partial-40-1234"
std::string markerName(int64_t step, int64_t rank);  // ".ddpl-step-40.rank-3.json"
std::optional<int64_t> parseStepDirName(const std::string& name);
std::optional<int64_t> parseRankDirName(const std::string& name);  // "rank-3" -> 3
struct PartialName {
  int64_t step = 0;
  long pid = 0;
};
std::optional<PartialName> parsePartialDirName(const std::string& name);
struct MarkerName {
  int64_t step = 0;
  int64_t rank = 0;
};
std::optional<MarkerName> parseMarkerName(const std::string& name);

// A relative path that stays inside its directory: no "..", no leading "/", no empty part.
bool safeRelativePath(const std::string& path);

// The one encoding every writer of the format uses (docs/checkpoints.md; Python:
// ddplaunch.checkpoint._format): a JSON object, keys in byte order, no whitespace, strings as
// UTF-8 with only '"', '\\' and control characters escaped, no newline at the end.
std::string encodeRecord(const CommitRecord& r);
// Throws ddpl::InvalidArgument naming the field that is missing, of the wrong type or out of
// range (a negative size, an unsafe path, more than kMaxFiles files, a sum that is not `bytes`).
CommitRecord decodeRecord(const std::string& json);

// The newest step every rank offered, or none. `offers[r]` is rank r's list, in any order.
std::optional<int64_t> agreeOnStep(const std::vector<std::vector<int64_t>>& offers);

// Durable retention: given the steps persisted for one rank, those to remove so that the newest
// `keep` stay (keep <= 0: none removed). Oldest first.
std::vector<int64_t> stepsToRetire(std::vector<int64_t> persisted, int64_t keep);

// Memory a write may use: the budget minus what the committed steps present hold (0 when they
// already fill it).
uint64_t writeAllowance(uint64_t budget, uint64_t committed_bytes);

}  // namespace ddpl::ckpt
