// libFuzzer target: the masking of secrets (common/secrets.h) in what a worker or the
// user controls: a rank's lines on the dashboard, its stacks, the failure report (text), the
// command line (the input's \0-separated words) and the environment (its NAME=VALUE lines),
// then what the dashboard and the status line do with the result (cutUtf8, fitColumns). Every
// byte sequence is valid input. Findings besides a crash or a sanitizer report: an exception,
// masked text with another number of lines, a word list of another length, a cut longer than
// asked (each traps).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/secrets.h"
#include "launcher/health/job_view.h"
#include "web/dashboard_model.h"

using namespace ddpl;
using namespace ddpl::launcher;
using namespace ddpl::web;

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at; (at = text.find(sep, start)) != std::string::npos; start = at + 1)
    out.push_back(text.substr(start, at - start));
  out.push_back(text.substr(start));
  return out;
}

size_t lines(const std::string& text) {
  size_t n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const std::string masked = maskSecretsInText(text);
    if (lines(masked) != lines(text)) __builtin_trap();
    (void)maskUrlPasswords(text);
    const std::vector<std::string> words = split(text, '\0');
    if (maskCommandLine(words).size() != words.size()) __builtin_trap();
    ddpl::Environment env;
    for (const auto& line : split(text, '\n')) {
      size_t eq = line.find('=');
      if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    if (maskEnvironment(env).size() != env.size()) __builtin_trap();
    const size_t bytes = size > 0 ? data[0] : 0;
    if (cutUtf8(masked, bytes).size() > bytes + 3) __builtin_trap();
    (void)fitColumns(masked, bytes);
  } catch (const std::exception& e) {
    fprintf(stderr, "exception: %s\n", e.what());
    __builtin_trap();
  } catch (...) {
    __builtin_trap();  // masking takes any bytes
  }
  return 0;
}
