#include "common/checkpoint_format.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/errors.h"

namespace ddpl::ckpt {

using nlohmann::json;

std::string rankDirName(int64_t rank) { return "rank-" + std::to_string(rank); }
std::string stepDirName(int64_t step) { return "step-" + std::to_string(step); }
std::string partialDirName(int64_t step, long pid) {
  return "partial-" + std::to_string(step) + "-" + std::to_string(pid);
}
std::string markerName(int64_t step, int64_t rank) {
  return ".ddpl-step-" + std::to_string(step) + ".rank-" + std::to_string(rank) + ".json";
}

namespace {

// A non-negative decimal without sign, leading zeros or overflow: "step-007" is not a step
// directory of ours, so two names never mean the same step.
std::optional<int64_t> parseCount(const std::string& s) {
  if (s.empty() || s.size() > 18 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

bool startsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

}  // namespace

std::optional<int64_t> parseStepDirName(const std::string& name) {
  if (!startsWith(name, "step-")) return std::nullopt;
  return parseCount(name.substr(5));
}

std::optional<int64_t> parseRankDirName(const std::string& name) {
  if (!startsWith(name, "rank-")) return std::nullopt;
  return parseCount(name.substr(5));
}

std::optional<PartialName> parsePartialDirName(const std::string& name) {
  if (!startsWith(name, "partial-")) return std::nullopt;
  std::string rest = name.substr(8);
  auto dash = rest.find('-');
  if (dash == std::string::npos) return std::nullopt;
  auto step = parseCount(rest.substr(0, dash));
  auto pid = parseCount(rest.substr(dash + 1));
  if (!step || !pid || *pid > std::numeric_limits<int>::max()) return std::nullopt;
  return PartialName{*step, static_cast<long>(*pid)};
}

std::optional<MarkerName> parseMarkerName(const std::string& name) {
  const std::string head = ".ddpl-step-", mid = ".rank-", tail = ".json";
  if (!startsWith(name, head) || name.size() < head.size() + tail.size() ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return std::nullopt;
  std::string body = name.substr(head.size(), name.size() - head.size() - tail.size());
  auto m = body.find(mid);
  if (m == std::string::npos) return std::nullopt;
  auto step = parseCount(body.substr(0, m));
  auto rank = parseCount(body.substr(m + mid.size()));
  if (!step || !rank) return std::nullopt;
  return MarkerName{*step, *rank};
}

bool safeRelativePath(const std::string& path) {
  if (path.empty() || path[0] == '/' || path.size() > 4096) return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == ".." || part.find('\0') != std::string::npos)
      return false;
    start = end + 1;
  }
  return true;
}

// nlohmann's json keeps an object's keys in a std::map, so dump() writes them in byte order:
// the order the format fixes (a change to ordered_json would change every record's bytes).
std::string encodeRecord(const CommitRecord& r) {
  json files = json::array();
  for (const auto& f : r.files) files.push_back({{"path", f.path}, {"size", f.size}});
  json j = {{"version", r.version},
            {"step", r.step},
            {"rank", r.rank},
            {"world_size", r.world_size},
            {"files", files},
            {"bytes", r.bytes},
            {"durable_path", r.durable_path},
            {"persist", r.persist},
            {"replicated", r.replicated},
            {"keep", r.keep},
            {"time", r.time}};
  if (r.writer.known()) {
    j["run_id"] = r.writer.run_id;
    j["epoch"] = r.writer.epoch;
    j["round"] = r.writer.round;
  }
  return j.dump();
}

namespace {

const json& field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) throw InvalidArgument(std::string("commit record: no '") + name + "'");
  return *it;
}

// A wrong value as a message shows it: a scalar as written (cut), a list or object by its kind
// only. A record comes from a worker's files or a peer's push: printing one nested a hundred
// thousand levels deep recursed once per level and overflowed launch's stack.
std::string shown(const json& v) {
  if (v.is_structured()) return std::string("a JSON ") + v.type_name();
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 200 ? text.substr(0, 200) + "..." : text;
}

int64_t nonNegative(const json& j, const char* name) {
  const json& v = field(j, name);
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    throw InvalidArgument(std::string("commit record: '") + name +
                          "' is not a non-negative integer: " + shown(v));
  return v.get<int64_t>();
}

bool flag(const json& j, const char* name) {
  const json& v = field(j, name);
  if (!v.is_boolean())
    throw InvalidArgument(std::string("commit record: '") + name + "' is not true/false");
  return v.get<bool>();
}

}  // namespace

CommitRecord decodeRecord(const std::string& text) {
  if (text.size() > kMaxRecordBytes)
    throw InvalidArgument("commit record: " + std::to_string(text.size()) + " bytes (limit " +
                          std::to_string(kMaxRecordBytes) + ")");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw InvalidArgument("commit record: not a JSON object");
  CommitRecord r;
  r.version = static_cast<int>(nonNegative(j, "version"));
  if (r.version != kFormatVersion)
    throw InvalidArgument("commit record: format version " + std::to_string(r.version) +
                          ", this build reads " + std::to_string(kFormatVersion));
  r.step = nonNegative(j, "step");
  r.rank = nonNegative(j, "rank");
  r.world_size = nonNegative(j, "world_size");
  if (r.world_size < 1 || r.rank >= r.world_size)
    throw InvalidArgument("commit record: rank " + std::to_string(r.rank) + " of world size " +
                          std::to_string(r.world_size));
  const json& files = field(j, "files");
  if (!files.is_array()) throw InvalidArgument("commit record: 'files' is not a list");
  if (files.size() > kMaxFiles)
    throw InvalidArgument("commit record: " + std::to_string(files.size()) + " files (limit " +
                          std::to_string(kMaxFiles) + ")");
  uint64_t sum = 0;
  std::set<std::string> seen;
  for (const auto& f : files) {
    if (!f.is_object()) throw InvalidArgument("commit record: a file entry is not an object");
    const json& p = field(f, "path");
    if (!p.is_string() || !safeRelativePath(p.get<std::string>()))
      throw InvalidArgument("commit record: unsafe file path " + shown(p));
    FileEntry e{p.get<std::string>(), static_cast<uint64_t>(nonNegative(f, "size"))};
    if (!seen.insert(e.path).second)
      throw InvalidArgument("commit record: file '" + e.path + "' listed twice");
    if (e.path == kRecordName) throw InvalidArgument("commit record: lists itself");
    // Sizes of 2^63-1, 2^63-1 and 2 wrap to 0: a record could claim 'bytes' 0, pass every
    // budget, then stream exabytes into /dev/shm (a peer's replica push).
    if (e.size > std::numeric_limits<int64_t>::max() - sum)
      throw InvalidArgument("commit record: file sizes add up past 2^63 bytes");
    sum += e.size;
    r.files.push_back(std::move(e));
  }
  r.bytes = static_cast<uint64_t>(nonNegative(j, "bytes"));
  if (r.bytes != sum)
    throw InvalidArgument("commit record: 'bytes' is " + std::to_string(r.bytes) +
                          " but the files add up to " + std::to_string(sum));
  const json& d = field(j, "durable_path");
  if (!d.is_string()) throw InvalidArgument("commit record: 'durable_path' is not a string");
  r.durable_path = d.get<std::string>();
  if (!r.durable_path.empty() && r.durable_path[0] != '/')
    throw InvalidArgument("commit record: 'durable_path' is not absolute: " + r.durable_path);
  r.persist = flag(j, "persist");
  r.replicated = flag(j, "replicated");
  r.keep = nonNegative(j, "keep");
  const json& t = field(j, "time");
  if (!t.is_number()) throw InvalidArgument("commit record: 'time' is not a number");
  r.time = t.get<double>();
  if (j.contains("epoch")) {
    r.writer.epoch = nonNegative(j, "epoch");
    r.writer.round = nonNegative(j, "round");
    const json& run = field(j, "run_id");
    if (!run.is_string()) throw InvalidArgument("commit record: 'run_id' is not a string");
    r.writer.run_id = run.get<std::string>();
  }
  return r;
}

bool fenceRefuses(const FenceToken& newest, const FenceToken& mine) {
  if (!newest.known() || !mine.known() || newest.run_id != mine.run_id) return false;
  return std::make_pair(mine.epoch, mine.round) < std::make_pair(newest.epoch, newest.round);
}

std::string encodeFence(const FenceToken& t) {
  return json{{"run_id", t.run_id}, {"epoch", t.epoch}, {"round", t.round}}.dump() + "\n";
}

std::optional<FenceToken> decodeFence(const std::string& text) {
  if (text.size() > kMaxFenceBytes) return std::nullopt;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto run = j.find("run_id"), epoch = j.find("epoch"), round = j.find("round");
  if (run == j.end() || epoch == j.end() || round == j.end() || !run->is_string() ||
      !epoch->is_number_integer() || !round->is_number_integer())
    return std::nullopt;
  FenceToken t{run->get<std::string>(), epoch->get<int64_t>(), round->get<int64_t>()};
  if (t.epoch < 0 || t.round < 0) return std::nullopt;
  return t;
}

std::string describeFence(const FenceToken& t) {
  return "round " + std::to_string(t.round) + " (epoch " + std::to_string(t.epoch) + ") of run '" +
         t.run_id + "'";
}

std::optional<int64_t> agreeOnStep(const std::vector<std::vector<int64_t>>& offers) {
  if (offers.empty()) return std::nullopt;
  std::set<int64_t> common(offers[0].begin(), offers[0].end());
  for (size_t i = 1; i < offers.size() && !common.empty(); ++i) {
    std::set<int64_t> next;
    for (int64_t s : offers[i])
      if (common.count(s)) next.insert(s);
    common.swap(next);
  }
  if (common.empty()) return std::nullopt;
  return *common.rbegin();
}

std::vector<int64_t> stepsToRetire(std::vector<int64_t> persisted, int64_t keep) {
  std::sort(persisted.begin(), persisted.end());
  persisted.erase(std::unique(persisted.begin(), persisted.end()), persisted.end());
  if (keep <= 0 || persisted.size() <= static_cast<size_t>(keep)) return {};
  persisted.resize(persisted.size() - static_cast<size_t>(keep));
  return persisted;
}

uint64_t writeAllowance(uint64_t budget, uint64_t committed_bytes) {
  return committed_bytes >= budget ? 0 : budget - committed_bytes;
}

}  // namespace ddpl::ckpt
