#include "launcher/agent/error_report.h"

#include <fmt/format.h>

#include <algorithm>
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

bool isFrameLine(const std::string& line) { return line.rfind("frame #", 0) == 0; }

// Frames of the error's own making, innermost on a C++ worker's stack: building and throwing the
// exception (c10::Error's constructor, TORCH_CHECK's failure path), std::terminate for one that
// escaped a thread, and the worker library's report itself. They say nothing about the cause.
bool isErrorMachinery(const std::string& frame_line) {
  const auto colon = frame_line.find(": ");
  if (colon == std::string::npos) return false;
  const std::string function = frame_line.substr(colon + 2);
  static const char* const kPrefixes[] = {"c10::Error::",
                                          "c10::detail::torchCheckFail",
                                          "c10::detail::torchInternalAssertFail",
                                          "c10::get_backtrace",
                                          "c10::get_lazy_backtrace",
                                          "__cxa_throw",
                                          "__cxa_allocate_exception",
                                          "std::__throw_",  // libstdc++'s (vector::at, stoi)
                                          "__cxa_rethrow",
                                          "std::rethrow_exception",
                                          "std::terminate",
                                          "__cxxabiv1::__terminate",
                                          "ddpl::worker::describeException",
                                          "ddpl::worker::(anonymous namespace)::describeImpl",
                                          "ddpl::worker::(anonymous namespace)::onTerminate"};
  for (const char* p : kPrefixes)
    if (function.rfind(p, 0) == 0) return true;
  // c10's typed errors: c10::ValueError::ValueError(...) runs before c10::Error's constructor.
  const std::string name = function.substr(0, function.find('('));
  const auto sep = name.rfind("::");
  if (name.rfind("c10::", 0) != 0 || sep == std::string::npos || sep <= 5) return false;
  const std::string type = name.substr(5, sep - 5);
  return type == name.substr(sep + 2) && type.size() > 5 &&
         type.compare(type.size() - 5, 5, "Error") == 0;
}

// A C++ worker's trace ("frame #N: ..." lines, inlined calls indented under their frame) can run
// to 64 frames; the report shows what leads to the cause (the lines before the first frame,
// the innermost frames after the error's own machinery) and points to the file for the rest.
// Other tracebacks (Python's, innermost last) are shown whole.
std::string traceForReport(const std::string& traceback, const FailureDetail& f) {
  std::vector<std::string> lines;
  std::istringstream in(traceback);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (std::none_of(lines.begin(), lines.end(), isFrameLine)) return traceback;
  std::string out;
  size_t i = 0;
  for (; i < lines.size() && !isFrameLine(lines[i]); ++i) out += lines[i] + "\n";
  // The machinery ends at the last machinery frame of the leading run of machinery and unnamed
  // frames (libstdc++ without symbols shows std::terminate's helpers as "<unknown function>").
  size_t machinery_end = i;
  for (size_t j = i; j < lines.size(); ++j) {
    if (!isFrameLine(lines[j])) continue;
    if (isErrorMachinery(lines[j]))
      machinery_end = j + 1;
    else if (lines[j].find(": <unknown function>") == std::string::npos)
      break;
  }
  size_t skipped = 0, shown = 0, left = 0;
  bool showing = false;
  for (; i < lines.size(); ++i) {
    if (isFrameLine(lines[i])) {
      if (i < machinery_end) {
        ++skipped;
        showing = false;
        continue;
      }
      showing = shown < kReportFrames;
      if (showing)
        ++shown;
      else
        ++left;
    }
    if (showing) out += lines[i] + "\n";
  }
  if (skipped > 0 || left > 0) {
    std::string what;
    if (skipped > 0) what = fmt::format("{} frame(s) that build and throw the exception", skipped);
    if (left > 0) what += fmt::format("{}{} outer frame(s)", what.empty() ? "" : ", ", left);
    out += f.error_file_kept
               ? fmt::format("(not shown: {}; all in {})\n", what, f.error_file)
               : fmt::format(
                     "(not shown: {}; launch keeps the error file that has them with --log-dir)\n",
                     what);
  }
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
      s += "  traceback :\n" + indent(traceForReport(f.error->traceback, f), "    ");
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
  // torchrun's layout nests three levels. A worker's file of [[[[... a hundred thousand deep
  // parsed (nlohmann's parser keeps its own stack), then printing it recursed once per level
  // and overflowed launch's stack: anything deeper than kMaxDepth is taken as unparseable.
  constexpr int kMaxDepth = 32;
  bool too_deep = false;
  auto j = nlohmann::json::parse(
      raw,
      [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        too_deep = too_deep || depth > kMaxDepth;
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  if (too_deep || j.is_discarded() || !j.is_object()) {
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
    s += fmt::format("[{}]:{}\n", ++n,
                     f.exit.stopped_by_us ? " (stopped by launch after the root cause)" : "");
    s += describeOne(f);
  }
  if (!any_secondary) s += "  <NO_OTHER_FAILURES>\n";
  s += rule + "\nRoot Cause (first observed failure):\n[0]:\n" + describeOne(root) + bar + "\n";
  return s;
}

FailureDetail workerFailure(const WorkerExit& exit, int global_rank, const std::string& host,
                            const std::string& error_file, bool error_file_kept,
                            std::deque<std::string> stderr_tail, const FailureDetail* exec_failed) {
  FailureDetail d;
  if (exec_failed)
    d = *exec_failed;
  else
    d.error = readErrorFile(error_file);
  d.exit = exit;
  d.global_rank = global_rank;
  d.host = host;
  d.error_file = error_file;
  d.error_file_kept = error_file_kept;
  d.stderr_tail = std::move(stderr_tail);
  return d;
}

}  // namespace ddpl::launcher
