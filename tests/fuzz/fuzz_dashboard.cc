// libFuzzer target: the dashboard's model (web/dashboard_model.h) fed what other
// machines and workers control: another node's rows as they come from the job's store
// (decodeRanks: the input up to its first \0), and text (the rest) as a rank's last line, an
// event, the summary (the failure report goes there) and stacks. Findings besides a crash or
// a sanitizer report: an exception, a row past its bounds, a page whose JSON does not parse,
// rows that do not come back from their own encoding (each traps).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "web/dashboard_model.h"

using namespace ddpl::web;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find('\0');
  const std::string rows_text = input.substr(0, cut);
  const std::string text = cut == std::string::npos ? input : input.substr(cut + 1);
  try {
    std::vector<DashboardRank> rows = decodeRanks(rows_text);
    if (rows.size() > kMaxPeerRanks) __builtin_trap();
    for (const auto& r : rows)
      if (r.last_line.size() > DashboardModel::kMaxLineBytes + 3 || r.node.size() > 255 + 3 ||
          r.global_rank < 0 || r.local_rank < 0 || r.node_rank < 0)
        __builtin_trap();
    if (decodeRanks(encodeRanks(rows)).size() != rows.size()) __builtin_trap();
    DashboardRank mine;
    mine.node = "here";
    mine.last_line = text;
    rows.push_back(mine);
    DashboardModel m;
    DashboardJob job;
    job.run_id = text.substr(0, 64);
    for (int tick = 0; tick < 3; ++tick) m.sample(job, rows, 1000 + tick);
    m.event(1000, "exit", text);
    m.setSummary(text);
    m.setStacks(1001, "on demand", text);
    auto page = nlohmann::json::parse(m.json(1002));
    if (page["ranks"].size() != rows.size()) __builtin_trap();
  } catch (const std::exception& e) {
    fprintf(stderr, "exception: %s\n", e.what());
    __builtin_trap();
  } catch (...) {
    __builtin_trap();
  }
  return 0;
}
