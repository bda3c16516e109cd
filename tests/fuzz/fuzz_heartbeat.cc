// libFuzzer target: what launch makes of its workers' heartbeats (common/heartbeat.h: the step,
// the microseconds waited in collectives, the microseconds spent restoring a checkpoint, any
// 64-bit values a worker writes) and of their timing: the progress tracker and its straggler
// judgement, the hang detector, the live view's figures and lines, the restart's phases and the
// incident table, the dashboard's rows and the end-of-run summary. The input: a byte of options
// (ranks, a --hang-timeout or not), then readings of 27 bytes: [rank and event][ms since the
// last reading, 2 bytes][step][waited][restore] (little-endian). Findings: a crash, a sanitizer
// report (an overflowing conversion included), an exception (each traps).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "launcher/health/job_view.h"
#include "launcher/health/progress.h"
#include "launcher/warm/restart_phases.h"
#include "web/dashboard_model.h"

using namespace ddpl::launcher;
using namespace ddpl::web;

namespace {

template <typename T>
T take(const uint8_t* p) {
  T v;
  memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int nproc = 1 + data[0] % 4;
  HangOptions ho;
  if (data[0] & 4) ho.timeout_sec = 1 + (data[0] >> 3);
  try {
    double now = 1.7e9;
    ProgressTracker progress;
    HangDetector hang(ho);
    JobView view;
    warm::RestartClock restarts;
    DashboardModel model;
    progress.start(nproc, 8, now);
    hang.start(nproc, now);
    view.start(now);
    restarts.onFailure(now);
    restarts.onStopped(now);
    restarts.onFormed(now);
    restarts.onStarted(now, 0, nproc);
    std::vector<RankUsage> usage(static_cast<size_t>(nproc));
    for (int r = 0; r < nproc; ++r) {
      usage[static_cast<size_t>(r)].local_rank = r;
      usage[static_cast<size_t>(r)].global_rank = 8 + r;
    }
    constexpr size_t kReading = 27;
    for (size_t i = 1; i + kReading <= size; i += kReading) {
      const uint8_t* p = data + i;
      const int r = p[0] % nproc;
      now += take<uint16_t>(p + 1) / 1000.0;
      const uint64_t step = take<uint64_t>(p + 3), waited = take<uint64_t>(p + 11),
                     restore = take<uint64_t>(p + 19);
      RankUsage& u = usage[static_cast<size_t>(r)];
      if (p[0] & 0x80) {  // the rank exits
        u.alive = false;
        progress.onExit(r, now, static_cast<double>(p[1]), static_cast<int64_t>(p[2]) << 10);
        hang.onExit(r);
      }
      if (p[0] & 0x40) progress.onGpu(r, p[1] % 101, static_cast<int64_t>(p[2]) << 20);
      progress.onStep(r, step, now, waited);
      hang.observe(r, step, static_cast<double>(p[1]) / 10, p[0] & 0x20, now);
      u.step = step;
      u.waited_us = waited;
      u.cpu_seconds += static_cast<double>(p[2]) / 100;
      u.rss_bytes = static_cast<int64_t>(p[1]) << 20;
      view.sample(usage, now);
      const JobFigures f = view.figures();
      (void)view.statusLine(80);
      (void)view.logLine();
      for (const auto& s : progress.newStragglers()) (void)s.describe();
      for (const auto& h : hang.check(now)) (void)h.why;
      // The incident table's readings: the waited field stands for the step restored, a byte
      // for its source; bit 4 of the first byte fails the group and starts the next.
      std::vector<warm::RankSteps> steps;
      for (const auto& x : usage)
        steps.push_back({x.step, x.waited_us, warm::restoreSourceFromCode(p[2] & 7)});
      if (auto rec = restarts.onReadings(now, steps, static_cast<double>(restore) / 1e6))
        (void)rec->describe();
      if (p[0] & 0x10) {
        restarts.onFailure(now, std::string(p[1], 'c'));
        restarts.onStopped(now);
        restarts.onFormed(now);
        restarts.onStarted(now, 0, nproc);
      }
      if (restarts.takeChanged()) (void)restarts.incidentTable(now - 1.7e9, 3);
      // The dashboard's row of each rank, as the live view fills it.
      std::vector<DashboardRank> rows;
      for (const auto& x : usage) {
        DashboardRank d;
        d.global_rank = x.global_rank;
        d.local_rank = x.local_rank;
        d.step = x.step;
        const RankProgress& rp = progress.ranks()[static_cast<size_t>(x.local_rank)];
        if (auto s = rp.meanStepSeconds(); s && *s > 0) {
          d.step_ms = *s * 1000;
          d.steps_per_sec = 1 / *s;
        }
        if (static_cast<size_t>(x.local_rank) < f.cpu_percent.size())
          d.cpu_percent = f.cpu_percent[static_cast<size_t>(x.local_rank)];
        rows.push_back(d);
      }
      DashboardJob job;
      job.step = f.step;
      job.steps_per_sec = f.steps_per_sec;
      job.uptime_s = f.uptime_sec;
      model.sample(job, rows, now);
    }
    // What another node makes of this node's rows (once: JSON costs most of a reading).
    (void)decodeRanks(encodeRanks(model.ranks()));
    (void)model.json(now);
    for (int r = 0; r < nproc; ++r) progress.onExit(r, now, 1, 1024);
    for (const auto& s : progress.newStragglers()) (void)s.describe();
    (void)restarts.onGroupEnded(now);
    (void)restarts.summary();
    (void)restarts.incidentTable(now - 1.7e9);
    (void)progress.summary(now, 2, 4);
  } catch (const std::exception& e) {
    fprintf(stderr, "exception: %s\n", e.what());
    __builtin_trap();
  } catch (...) {
    __builtin_trap();
  }
  return 0;
}
