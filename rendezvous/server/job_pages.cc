#include "rendezvous/server/job_pages.h"

#include <fmt/format.h>
#include <sys/random.h>

#include <algorithm>
#include <vector>

#include "common/errors.h"
#include "common/log.h"

namespace ddpl::rdzv {

JobPages::JobPages(RendezvousServer& server, const DashboardAddress& address,
                   const std::string& token)
    : server_(server) {
  web::DashboardOptions o;
  o.host = address.host;
  o.port = address.port;
  o.token = token;
  if (o.token.empty()) {
    // Without the server's token nobody from another machine may read: a token nobody has.
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw))
      throw Error("cannot make the dashboard's token: getrandom failed");
    for (unsigned char c : raw) o.token += fmt::format("{:02x}", c);
  }
  endpoint_.reset(web::newJobsDashboard(o));
  log::info("dashboard of every job on http://{}:{}/ ({})", o.host, endpoint_->port(),
            token.empty() ? "readable from this machine only: the server has no token"
                          : "other machines need the server's token");
  thread_ = std::thread([this] { run(); });
}

JobPages::~JobPages() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void JobPages::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; })) {
    lock.unlock();
    publish();
    lock.lock();
  }
}

void JobPages::publish() {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::map<std::string, std::string> jobs;
  std::map<std::string, web::DashboardModel> kept;
  for (auto& r : server_.nodeValues("dashboard", kMaxJobs)) {
    std::vector<web::DashboardRank> rows;
    for (size_t n = 0; n < r.values.size(); ++n) {
      if (!r.values[n]) continue;
      for (auto& row : web::decodeRanks(*r.values[n]))
        if (row.node_rank == static_cast<int>(n)) rows.push_back(std::move(row));
    }
    if (rows.empty()) continue;  // its agents publish nothing: not a job with a page
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.global_rank < b.global_rank; });
    web::DashboardJob job;
    job.run_id = r.run_id;
    job.attempt = static_cast<int>(r.round);
    job.world_size = static_cast<int>(rows.size());
    job.nodes = static_cast<int>(r.values.size());
    job.state = "starting";
    job.step = rows.front().step;
    for (const auto& row : rows) {
      if (row.state != "starting" && row.state != "exited") job.state = "training";
      job.step = std::min(job.step, row.step);
      if (row.steps_per_sec && (!job.steps_per_sec || *row.steps_per_sec < *job.steps_per_sec))
        job.steps_per_sec = row.steps_per_sec;  // the slowest rank's pace is the job's
    }
    web::DashboardModel& m = kept[r.run_id];
    if (auto old = models_.find(r.run_id); old != models_.end()) m = std::move(old->second);
    m.sample(job, std::move(rows), now);
    jobs[r.run_id] = m.json(now);
  }
  models_ = std::move(kept);  // runs gone, or without rows, are forgotten
  endpoint_->publish(std::move(jobs));
}

}  // namespace ddpl::rdzv
