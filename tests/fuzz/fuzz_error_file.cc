// libFuzzer target: the reader of torchrun's error files (launcher/agent/error_report.h) and the
// failure report made of them. The input is the file's contents, handed over through a memfd so
// that no disk is touched. It must never throw: a file it cannot parse yields its raw text as
// the message; only an empty file yields nothing. The report is then made twice, from the file
// and from the same bytes as the last lines of a worker's stderr (a program that wrote no
// file), and given to the dashboard's summary as launch gives it (masked, cut, in the page's
// JSON). Findings besides a crash or a sanitizer report: an exception, a page whose JSON does
// not parse (each traps).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "launcher/agent/error_report.h"
#include "web/dashboard_model.h"

using namespace ddpl::launcher;
using namespace ddpl::web;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int fd = memfd_create("error_file", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  try {
    auto contents = readErrorFile(path);
    if (!contents && size > 0) __builtin_trap();  // the file exists and is not empty
    FailureDetail from_file;
    from_file.exit = WorkerExit{0, 4242, ExitStatus{false, 1}, 1.7e9, false};
    from_file.host = "node7";
    from_file.error_file = path;
    from_file.error = contents;
    FailureDetail from_stderr = from_file;
    from_stderr.error.reset();
    std::istringstream lines(std::string(reinterpret_cast<const char*>(data), size));
    for (std::string l; std::getline(lines, l) && from_stderr.stderr_tail.size() < 20;)
      from_stderr.stderr_tail.push_back(l);
    from_stderr.exit.local_rank = 1;
    from_stderr.exit.pid = 4243;
    from_stderr.exit.stopped_by_us = true;
    const std::vector<FailureDetail> all = {from_file, from_stderr};
    DashboardModel m;
    m.setSummary(formatFailureReport("train.py", all, all[0]) +
                 formatFailureReport("train.py", all, all[1]));
    (void)nlohmann::json::parse(m.json(1));
  } catch (const std::exception& e) {
    fprintf(stderr, "exception: %s\n", e.what());
    __builtin_trap();
  } catch (...) {
    __builtin_trap();
  }
  return 0;
}
