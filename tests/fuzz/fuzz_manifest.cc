// libFuzzer target: the run manifest (launcher/doctor/manifest.h). `launch manifest-diff A B`
// reads manifests that may come from another machine (the input up to its first \0, and the
// rest); a manifest is made from a command line (the input's \0-separated words) and an
// environment (its NAME=VALUE lines) that are bytes, not necessarily UTF-8. Findings besides a
// crash or a sanitizer report: an exception other than diffManifests' documented
// InvalidArgument, a manifest that does not parse, one that differs from itself (each traps).
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "launcher/doctor/manifest.h"

using namespace ddpl::launcher;

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at; (at = text.find(sep, start)) != std::string::npos; start = at + 1)
    out.push_back(text.substr(start, at - start));
  out.push_back(text.substr(start));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find('\0');
  try {
    try {
      if (cut != std::string::npos)
        (void)diffManifests(input.substr(0, cut), input.substr(cut + 1));
    } catch (const ddpl::InvalidArgument&) {
      // not a manifest: said so, documented
    }
    ManifestFacts f;
    f.command_line = split(input, '\0');
    for (const auto& line : split(input, '\n')) {
      size_t eq = line.find('=');
      if (eq != std::string::npos) f.env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    f.options.program = f.command_line.back();
    f.cwd = input.substr(0, 64);
    const std::string m = manifestJson(f);
    (void)nlohmann::json::parse(m);
    if (auto d = diffManifests(m, m); !d.empty()) {
      fprintf(stderr, "a manifest differs from itself: %s\n", d[0].c_str());
      __builtin_trap();
    }
  } catch (const std::exception& e) {
    fprintf(stderr, "exception: %s\n", e.what());
    __builtin_trap();
  } catch (...) {
    __builtin_trap();
  }
  return 0;
}
