// libFuzzer target: the reader of torchrun's error files (launcher/agent/error_report.h). The input
// is the file's contents, handed over through a memfd so that no disk is touched. It must
// never throw: a file it cannot parse yields its raw text as the message; only an empty file
// yields nothing.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "launcher/agent/error_report.h"

using namespace ddpl::launcher;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int fd = memfd_create("error_file", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  auto contents = readErrorFile(path);
  if (!contents && size > 0) __builtin_trap();  // the file exists and is not empty
  return 0;
}
