#include "launcher/error_report.h"

#include <fmt/format.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddpl::launcher {
namespace {

std::string asText(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "";
  return j.dump();
}

std::string isoTime(double unix_time) {
  time_t t = static_cast<time_t>(unix_time);
  tm tmv{};
  localtime_r(&t, &tmv);
  char buf[64];
  strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &tmv);
  return buf;
}

std::string indent(const std::string& text, const std::string& pad) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out += pad + line + "\n";
  return out;
}

std::string describeOne(const FailureDetail& f) {
  std::string s;
  s += fmt::format("  time      : {}\n", isoTime(f.exit.unix_time));
  s += fmt::format("  host      : {}\n", f.host);
  s += fmt::format("  rank      : {} (local_rank: {})\n", f.global_rank, f.exit.local_rank);
  if (f.exit.status.signaled)
    s += fmt::format("  exitcode  : -{} (pid: {})\n  signal    : {} received by PID {}\n",
                     f.exit.status.value, f.exit.pid, f.exit.status.describe(), f.exit.pid);
  else
    s += fmt::format("  exitcode  : {} (pid: {})\n", f.exit.status.value, f.exit.pid);
  if (f.error) {
    s += fmt::format("  error_file: {}\n", f.error_file);
    s += fmt::format("  message   : {}\n", f.error->message);
    if (!f.error->traceback.empty())
      s += "  traceback :\n" + indent(f.error->traceback, "    ");
  } else {
    s += "  error_file: <none: the program did not write TORCHELASTIC_ERROR_FILE>\n";
    if (!f.stderr_tail.empty()) {
      s += fmt::format("  last {} lines of its stderr:\n", f.stderr_tail.size());
      for (const auto& line : f.stderr_tail) s += "    " + line + "\n";
    }
  }
  return s;
}

}  // namespace

std::optional<ErrorFileContents> readErrorFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string raw = ss.str();
  if (raw.empty()) return std::nullopt;
  ErrorFileContents c;
  auto j = nlohmann::json::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    c.message = "(unparseable error file) " + raw.substr(0, 2000);
    return c;
  }
  // torchrun's layout: {"message": {"message": ..., "extraInfo": {"py_callstack", "timestamp"}}};
  // older writers put a plain string in "message".
  const auto& m = j.contains("message") ? j["message"] : j;
  if (m.is_object()) {
    c.message = asText(m.value("message", nlohmann::json()));
    if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
      const auto& x = m["extraInfo"];
      c.traceback = asText(x.value("py_callstack", nlohmann::json()));
      c.timestamp = asText(x.value("timestamp", nlohmann::json()));
    }
  } else {
    c.message = asText(m);
  }
  return c;
}

std::string formatFailureReport(const std::string& program, const std::vector<FailureDetail>& all,
                                const FailureDetail& root) {
  std::string bar(60, '=');
  std::string rule(60, '-');
  std::string s = bar + "\n" + program + " FAILED\n" + rule + "\nFailures:\n";
  int n = 0;
  bool any_secondary = false;
  for (const auto& f : all) {
    if (&f == &root || (f.exit.pid == root.exit.pid && f.exit.local_rank == root.exit.local_rank))
      continue;
    any_secondary = true;
    s += fmt::format("[{}]:{}\n", ++n, f.exit.stopped_by_us ? " (stopped by launch after the root cause)" : "");
    s += describeOne(f);
  }
  if (!any_secondary) s += "  <NO_OTHER_FAILURES>\n";
  s += rule + "\nRoot Cause (first observed failure):\n[0]:\n" + describeOne(root) + bar + "\n";
  return s;
}

}  // namespace ddpl::launcher
