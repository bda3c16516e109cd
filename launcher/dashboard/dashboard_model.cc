#include "launcher/dashboard/dashboard_model.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "launcher/doctor/manifest.h"

namespace ddpl::launcher {
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

void DashboardModel::setStacks(double t, const std::string& reason, const std::string& text) {
  stacks_ = Stacks{t, reason, cutUtf8(maskSecretsInText(text), kMaxTextBytes)};
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
  for (const auto& r : ranks_)
    ranks.push_back({{"node", r.node},
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
                     {"last_line", r.last_line}});
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
  j["stacks"] = stacks_
                    ? Json{{"t", stacks_->t}, {"reason", stacks_->reason}, {"text", stacks_->text}}
                    : Json(nullptr);
  // Worker output is not guaranteed UTF-8: replace what is not rather than fail the page.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace ddpl::launcher
