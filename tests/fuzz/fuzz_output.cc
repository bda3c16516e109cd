// libFuzzer target: the routing of workers' output (launcher/agent/output.h): lines split,
// prefixed and kept for the failure report and the dashboard, carriage-return updates drawn on
// a live console under launch's status line. The input: two bytes of options (live console,
// status line, prefix, terminal width), a prefix template up to the first '\n', then records
// [what][length][bytes]: output on rank 0's stdout or stderr, rank 1's stdout (to a log file
// only), or a new status line. Real pipes, read as the agent's loop reads them; the consoles
// and the log file are /dev/null. Findings besides a crash or a sanitizer report: kept lines
// past their bounds, and an exception from what the dashboard does with them (each traps).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/secrets.h"
#include "launcher/agent/output.h"
#include "web/dashboard_model.h"

using namespace ddpl;
using namespace ddpl::launcher;
using namespace ddpl::web;

namespace {

int devNull() {
  static int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  return fd;
}

void checkKept(const OutputRouter& router, int local_rank) {
  auto recent = router.recentLines(local_rank);
  if (recent.size() > OutputRouter::kRecentLines) __builtin_trap();
  for (const auto& l : recent)
    if (l.size() > OutputRouter::kMaxRecentLine) __builtin_trap();
  if (router.stderrTail(local_rank).size() > OutputRouter::kTailLines) __builtin_trap();
  for (const auto& l : router.stderrTail(local_rank))
    if (l.size() > OutputRouter::kMaxLine) __builtin_trap();
  // What the dashboard shows of them (LiveView: the last line per rank, the recent ones masked).
  try {
    DashboardModel m;
    DashboardRank r;
    r.last_line = router.lastLine(local_rank);
    m.sample({}, {r}, 1);
    (void)m.json(1);
    for (const auto& l : recent) (void)maskSecretsInText(l);
  } catch (const std::exception& e) {
    fprintf(stderr, "exception: %s\n", e.what());
    __builtin_trap();
  } catch (...) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  ConsoleOptions co;
  co.out = co.err = devNull();
  co.live = data[0] & 1;
  co.status_line = data[0] & 2;
  co.prefix = !(data[0] & 4);
  co.columns = data[1];  // 0: ask the terminal (/dev/null is none: 80)
  size_t i = 2;
  const uint8_t* nl = static_cast<const uint8_t*>(memchr(data + i, '\n', size - i));
  if (nl) {
    co.prefix_template.assign(reinterpret_cast<const char*>(data + i),
                              static_cast<size_t>(nl - (data + i)));
    i = static_cast<size_t>(nl - data) + 1;
  }
  OutputRouter router(co);
  router.keepRecentLines(true);
  // Rank 0's stdout and stderr to the console, rank 1's stdout to a file only.
  const StreamRoute routes[3] = {{0, 7, StreamKind::kStdout, true, -1},
                                 {0, 7, StreamKind::kStderr, true, -1},
                                 {1, 8, StreamKind::kStdout, false, dup(devNull())}};
  int rd[3], wr[3];
  for (int s = 0; s < 3; ++s) {
    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0) __builtin_trap();
    rd[s] = p[0];
    wr[s] = p[1];
    router.add(rd[s], routes[s]);
  }
  while (i + 2 <= size) {
    const uint8_t what = data[i] % 4;
    const size_t len = std::min<size_t>(data[i + 1], size - i - 2);
    const char* bytes = reinterpret_cast<const char*>(data + i + 2);
    i += 2 + len;
    if (what == 3) {
      router.setStatus(std::string(bytes, len));
      continue;
    }
    if (write(wr[what], bytes, len) != static_cast<ssize_t>(len)) __builtin_trap();
    if (!router.onReadable(rd[what])) __builtin_trap();  // open: never at its end here
  }
  for (int s = 0; s < 3; ++s) {
    close(wr[s]);
    router.drain(rd[s]);
    router.remove(rd[s]);
  }
  checkKept(router, 0);
  checkKept(router, 1);
  (void)expandPrefix(co.prefix_template, "trainer", 3, 1027);
  return 0;
}
