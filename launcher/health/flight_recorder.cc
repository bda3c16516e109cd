#include "launcher/health/flight_recorder.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/defaults.h"

namespace ddpl::launcher {
namespace {

using nlohmann::json;

constexpr const char* kSocketEnv = envvar::kFlightRecorderSocket;
constexpr const char kBufferEnv[] = "TORCH_FR_BUFFER_SIZE";
constexpr const char kOldBufferEnv[] = "TORCH_NCCL_TRACE_BUFFER_SIZE";
// torch's dump nests five levels (entries, an entry, its sizes, a size list); more is not its.
constexpr int kMaxDepth = 8;
constexpr size_t kMaxSizesText = 120;
constexpr uint64_t kMaxSeq = uint64_t{1} << 62;

// torch writes pg_status's numbers as strings ("4", "-1": none yet).
std::optional<uint64_t> seqNumber(const json& j) {
  if (j.is_number_unsigned()) {
    auto v = j.get<uint64_t>();
    return v <= kMaxSeq ? std::optional<uint64_t>(v) : std::nullopt;
  }
  if (!j.is_string()) return std::nullopt;
  const std::string s = j.get<std::string>();
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  uint64_t v = std::stoull(s);
  return v <= kMaxSeq ? std::optional<uint64_t>(v) : std::nullopt;
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string groupName(const json& pg, const std::string& id) {
  if (pg.is_array() && pg.size() == 2 && pg[1].is_string()) {
    std::string desc = pg[1].get<std::string>();
    if (!desc.empty() && desc != "undefined") return desc;
  }
  return "pg " + id;
}

// One dump of torch's (c10d::dump_fr_trace_json's layout, version 2.x) into `out`; `prefix`
// keeps NCCL's groups apart from the CPU recorder's, whose ids are counted separately.
void addDump(const json& dump, const std::string& prefix, FlightRecord& out) {
  if (!dump.is_object()) return;
  auto status = dump.find("pg_status");
  if (status != dump.end() && status->is_object())
    for (const auto& [id, s] : status->items()) {
      if (!s.is_object() || !s.contains("last_enqueued_collective")) continue;
      if (auto n = seqNumber(s["last_enqueued_collective"])) out.last_enqueued[prefix + id] = *n;
    }
  auto entries = dump.find("entries");
  if (entries == dump.end() || !entries->is_array()) return;
  for (const auto& e : *entries) {
    if (!e.is_object()) continue;
    FlightEntry f;
    auto seq = e.contains("collective_seq_id") ? seqNumber(e["collective_seq_id"]) : std::nullopt;
    auto pg = e.contains("pg_id") ? seqNumber(e["pg_id"]) : std::nullopt;
    if (!seq || !pg) continue;
    f.seq = *seq;
    f.group = prefix + std::to_string(*pg);
    f.group_name = groupName(e.value("process_group", json()), std::to_string(*pg));
    std::string name = text(e, "profiling_name");
    auto colon = name.find(':');
    f.backend = colon == std::string::npos ? "" : name.substr(0, colon);
    f.op = colon == std::string::npos ? name : name.substr(colon + 1);
    auto sizes = e.find("input_sizes");
    if (sizes != e.end()) f.sizes = sizes->dump();
    if (f.sizes.size() > kMaxSizesText) f.sizes = f.sizes.substr(0, kMaxSizesText) + "...";
    auto p2p = e.find("is_p2p");
    f.p2p = p2p != e.end() && p2p->is_boolean() && p2p->get<bool>();
    out.entries.push_back(std::move(f));
  }
}

}  // namespace

const FlightEntry* FlightRecord::find(const std::string& group, uint64_t seq) const {
  for (auto it = entries.rbegin(); it != entries.rend(); ++it)
    if (it->group == group && it->seq == seq && !it->p2p) return &*it;
  return nullptr;
}

FlightRecord parseFlightRecord(const std::string& raw) {
  FlightRecord r;
  bool too_deep = false;
  json j = json::parse(
      raw,
      [&](int depth, json::parse_event_t, json&) {
        too_deep = too_deep || depth > kMaxDepth;
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  if (too_deep || j.is_discarded() || !j.is_object()) {
    r.error = fmt::format("unreadable answer ({} bytes)", raw.size());
    return r;
  }
  r.answered = true;
  r.error = text(j, "error");
  addDump(j.value("fr", json()), "", r);
  addDump(j.value("nccl", json()), "nccl/", r);
  if (r.error.empty() && r.last_enqueued.empty() && r.entries.empty())
    r.error = "no collective recorded (TORCH_FR_BUFFER_SIZE unset or 0 in the worker?)";
  return r;
}

std::map<int, FlightRecord> askFlightRecorders(const std::map<int, std::string>& socket_of,
                                               double timeout_sec) {
  struct Ask {
    int local_rank;
    int fd = -1;
    std::string data;
  };
  std::map<int, FlightRecord> out;
  std::vector<Ask> asks;
  for (const auto& [lr, path] : socket_of) {
    sockaddr_un addr{};
    if (path.size() >= sizeof(addr.sun_path)) {
      out[lr].error = fmt::format("socket path of {} bytes is too long", path.size());
      continue;
    }
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      out[lr].error = std::string("socket: ") + strerror(errno);
      continue;
    }
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      int e = errno;
      close(fd);
      out[lr].error = e == ENOENT || e == ECONNREFUSED
                          ? "no flight recorder served (the program made no ddplaunch call)"
                          : std::string("connect: ") + strerror(e);
      continue;
    }
    asks.push_back({lr, fd, {}});
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_sec));
  size_t open_count = asks.size();
  char buf[65536];
  while (open_count > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) break;
    std::vector<pollfd> fds;
    std::vector<Ask*> of;
    for (auto& a : asks)
      if (a.fd >= 0) {
        fds.push_back({a.fd, POLLIN, 0});
        of.push_back(&a);
      }
    int n = poll(fds.data(), fds.size(), static_cast<int>(left));
    if (n < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size() && n > 0; ++i) {
      if (fds[i].revents == 0) continue;
      Ask& a = *of[i];
      ssize_t got = read(a.fd, buf, sizeof(buf));
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      bool over = got > 0 && a.data.size() + static_cast<size_t>(got) > kMaxFlightRecordBytes;
      if (got > 0 && !over) {
        a.data.append(buf, static_cast<size_t>(got));
        continue;
      }
      FlightRecord& r = out[a.local_rank];
      if (over)
        r.error = fmt::format("answer over {} bytes", kMaxFlightRecordBytes);
      else if (got < 0)
        r.error = std::string("read: ") + strerror(errno);
      else
        r = parseFlightRecord(a.data);
      close(a.fd);
      a.fd = -1;
      --open_count;
    }
  }
  for (auto& a : asks)
    if (a.fd >= 0) {
      close(a.fd);
      out[a.local_rank].error = fmt::format("no answer in {:.1f}s", timeout_sec);
    }
  return out;
}

std::string flightRecorderSocket(const std::string& rank_dir) { return rank_dir + "/fr.sock"; }

void addFlightRecorderBuffer(Environment& env, const Environment& base) {
  if (!base.count(kBufferEnv) && !base.count(kOldBufferEnv))
    env[kBufferEnv] = std::to_string(kFlightRecorderEntries);
}

bool addFlightRecorderSocket(Environment& env, const std::string& rank_dir) {
  std::string path = flightRecorderSocket(rank_dir);
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) return false;
  env[kSocketEnv] = path;
  return true;
}

}  // namespace ddpl::launcher
