#include "web/dashboard_model.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/secrets.h"

namespace ddpl::web {
namespace {

using Json = nlohmann::json;

template <typename T>
Json orNull(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

// A series may not grow past kMaxSamples; a rank that appears later is padded at the front.
void push(std::map<int, std::deque<std::optional<double>>>& series, int rank,
          std::optional<double> v, size_t length) {
  auto& s = series[rank];
  while (s.size() + 1 < length) s.push_back(std::nullopt);
  s.push_back(v);
}

}  // namespace

std::string cutUtf8(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t end = bytes;
  // Back to the start of a sequence: continuation bytes are 10xxxxxx.
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "\xE2\x80\xA6";
}

void DashboardModel::sample(const DashboardJob& job, std::vector<DashboardRank> ranks, double now) {
  job_ = job;
  for (auto& r : ranks) r.last_line = cutUtf8(maskSecretsInText(r.last_line), kMaxLineBytes);
  ranks_ = std::move(ranks);
  // The rows follow every reading; the series one point a second at most (15 minutes kept).
  if (!t_.empty() && now < t_.back() + kSeriesInterval) return;
  t_.push_back(now);
  steps_per_sec_.push_back(job.steps_per_sec);
  for (const auto& r : ranks_) {
    push(step_ms_, r.global_rank, r.step_ms, t_.size());
    push(gpu_util_, r.global_rank, r.gpu_util_percent, t_.size());
  }
  // Ranks not in this sample (gone after a re-formation) get a null, so lengths stay equal.
  for (auto* series : {&step_ms_, &gpu_util_})
    for (auto& [rank, s] : *series)
      while (s.size() < t_.size()) s.push_back(std::nullopt);
  while (t_.size() > kMaxSamples) {
    t_.pop_front();
    steps_per_sec_.pop_front();
    for (auto* series : {&step_ms_, &gpu_util_})
      for (auto it = series->begin(); it != series->end();) {
        it->second.pop_front();
        // A rank with nothing left in the window is dropped (an elastic job's ranks come and
        // go); the newest value tells most often, so look from the back.
        bool empty = std::none_of(it->second.rbegin(), it->second.rend(),
                                  [](const std::optional<double>& v) { return v.has_value(); });
        it = empty ? series->erase(it) : std::next(it);
      }
  }
}

void DashboardModel::event(double t, const std::string& kind, const std::string& text) {
  events_.push_back({t, kind, cutUtf8(maskSecretsInText(text), kMaxLineBytes)});
  while (events_.size() > kMaxEvents) events_.pop_front();
}

void DashboardModel::setSummary(const std::string& text) {
  summary_ = cutUtf8(maskSecretsInText(text), kMaxTextBytes);
}

void DashboardModel::setIncidents(const std::string& text) {
  incidents_ = cutUtf8(maskSecretsInText(text), kMaxTextBytes);
}

void DashboardModel::setStacks(double t, const std::string& reason, const std::string& text) {
  stacks_ = Stacks{t, reason, cutUtf8(maskSecretsInText(text), kMaxTextBytes)};
}

namespace {

Json rankJson(const DashboardRank& r) {
  return {{"node", r.node},
          {"node_rank", r.node_rank},
          {"global_rank", r.global_rank},
          {"local_rank", r.local_rank},
          {"pid", r.pid},
          {"state", r.state},
          {"exit_code", orNull(r.exit_code)},
          {"step", r.step},
          {"steps_per_sec", orNull(r.steps_per_sec)},
          {"step_ms", orNull(r.step_ms)},
          {"wait_ms", orNull(r.wait_ms)},
          {"cpu_percent", orNull(r.cpu_percent)},
          {"rss_bytes", orNull(r.rss_bytes)},
          {"gpu_util_percent", orNull(r.gpu_util_percent)},
          {"gpu_memory_bytes", orNull(r.gpu_memory_bytes)},
          {"checkpoint_bytes", orNull(r.checkpoint_bytes)},
          {"last_line", r.last_line}};
}

template <typename T>
std::optional<T> number(const Json& j, const char* key, T lo, T hi) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  double v = it->get<double>();
  if (!(v >= static_cast<double>(lo) && v <= static_cast<double>(hi))) return std::nullopt;
  return static_cast<T>(v);
}

std::string text(const Json& j, const char* key, size_t bytes) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? cutUtf8(it->get<std::string>(), bytes) : "";
}

}  // namespace

std::string encodeRanks(const std::vector<DashboardRank>& ranks) {
  Json a = Json::array();
  for (const auto& r : ranks) a.push_back(rankJson(r));
  return a.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::vector<DashboardRank> decodeRanks(const std::string& encoded) {
  std::vector<DashboardRank> out;
  Json a = Json::parse(encoded, nullptr, /*allow_exceptions=*/false);
  if (!a.is_array() || a.size() > kMaxPeerRanks) return out;
  static const std::set<std::string> kStates{"starting", "training", "straggling",
                                             "hung",     "exited",   "restarting"};
  constexpr double kHuge = 1e15;
  for (const auto& j : a) {
    if (!j.is_object()) return {};
    DashboardRank r;
    auto g = number<int>(j, "global_rank", 0, INT32_MAX);
    auto l = number<int>(j, "local_rank", 0, INT32_MAX);
    auto n = number<int>(j, "node_rank", 0, INT32_MAX);
    if (!g || !l || !n) return {};
    r.global_rank = *g;
    r.local_rank = *l;
    r.node_rank = *n;
    r.node = text(j, "node", 255);
    r.pid = number<int>(j, "pid", 0, INT32_MAX).value_or(0);
    r.state = text(j, "state", 32);
    if (!kStates.count(r.state)) r.state = "starting";
    r.exit_code = number<int>(j, "exit_code", -1, 4096);
    r.step = number<uint64_t>(j, "step", 0, uint64_t{1} << 53).value_or(0);
    r.steps_per_sec = number<double>(j, "steps_per_sec", 0, kHuge);
    r.step_ms = number<double>(j, "step_ms", 0, kHuge);
    r.wait_ms = number<double>(j, "wait_ms", 0, kHuge);
    r.cpu_percent = number<double>(j, "cpu_percent", 0, 1e6);
    r.rss_bytes = number<int64_t>(j, "rss_bytes", 0, int64_t{1} << 53);
    r.gpu_util_percent = number<double>(j, "gpu_util_percent", 0, 100);
    r.gpu_memory_bytes = number<int64_t>(j, "gpu_memory_bytes", 0, int64_t{1} << 53);
    r.checkpoint_bytes = number<int64_t>(j, "checkpoint_bytes", 0, int64_t{1} << 53);
    r.last_line = text(j, "last_line", DashboardModel::kMaxLineBytes);
    out.push_back(std::move(r));
  }
  return out;
}

std::string DashboardModel::json(double now) const {
  Json j;
  j["version"] = 1;
  j["job"] = {{"run_id", job_.run_id},
              {"state", job_.state},
              {"attempt", job_.attempt},
              {"restarts_used", job_.restarts_used},
              {"max_restarts", job_.max_restarts},
              {"world_size", job_.world_size},
              {"nodes", job_.nodes},
              {"step", job_.step},
              {"steps_per_sec", orNull(job_.steps_per_sec)},
              {"uptime_s", job_.uptime_s},
              {"now", now}};
  Json ranks = Json::array();
  for (const auto& r : ranks_) ranks.push_back(rankJson(r));
  j["ranks"] = std::move(ranks);
  Json series;
  series["t"] = t_;
  Json sps = Json::array();
  for (const auto& v : steps_per_sec_) sps.push_back(orNull(v));
  series["steps_per_sec"] = std::move(sps);
  for (auto [name, src] :
       {std::pair{"step_ms", &step_ms_}, std::pair{"gpu_util_percent", &gpu_util_}}) {
    Json by_rank = Json::object();
    for (const auto& [rank, values] : *src) {
      Json a = Json::array();
      for (const auto& v : values) a.push_back(orNull(v));
      by_rank[std::to_string(rank)] = std::move(a);
    }
    series[name] = std::move(by_rank);
  }
  j["series"] = std::move(series);
  Json events = Json::array();
  for (const auto& e : events_) events.push_back({{"t", e.t}, {"kind", e.kind}, {"text", e.text}});
  j["events"] = std::move(events);
  j["summary"] = summary_ ? Json(*summary_) : Json(nullptr);
  j["incidents"] = incidents_ ? Json(*incidents_) : Json(nullptr);
  j["stacks"] = stacks_
                    ? Json{{"t", stacks_->t}, {"reason", stacks_->reason}, {"text", stacks_->text}}
                    : Json(nullptr);
  // Worker output is not guaranteed UTF-8: replace what is not rather than fail the page.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace ddpl::web
