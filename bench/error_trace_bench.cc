// What a symbolised error file costs (issue 18): the time describeException adds for a LibTorch
// error thrown from inside an operator (a c10::Error whose frames run through libtorch_cpu.so and
// this program), next to c10's own text for the same frames (dladdr names, the reference), and
// the fork the symboliser runs in. --rss-gib N first touches N GiB, since a
// fork copies page tables: a training process is large when it fails.
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "worker/error_report.h"

namespace dw = ddpl::worker;
using Clock = std::chrono::steady_clock;

namespace {

// Frame lines, and how many of them name a function.
std::pair<size_t, size_t> countNamed(const std::string& trace) {
  size_t frames = 0, named = 0;
  for (size_t at = 0; (at = trace.find("frame #", at)) != std::string::npos; ++at) {
    ++frames;
    if (trace.substr(at, trace.find('\n', at) - at).find("<unknown function>") == std::string::npos)
      ++named;
  }
  return {frames, named};
}

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void report(const char* what, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  std::printf("%-46s min %8.2f  median %8.2f  max %8.2f ms  (%zu rounds)\n", what, ms.front(),
              ms[ms.size() / 2], ms.back(), ms.size());
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 10;
  double rssGib = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rss-gib") == 0) rssGib = std::atof(argv[i + 1]);
  }
  torch::Tensor ballast;
  if (rssGib > 0)
    ballast = torch::ones({static_cast<int64_t>(rssGib * (1 << 28))});  // float32: touched
  // Two LibTorch errors: from an operator's shape check (a shallow stack: the dispatcher), and
  // from a gradient hook during backward (a deep one: the autograd engine below the hook).
  const std::vector<std::pair<std::string, std::function<void()>>> cases{
      {"torch::mm shape check",
       [] {
         torch::mm(torch::ones({2, 3}), torch::ones({4, 5}));
       }},
      {"gradient hook in backward", [] {
         auto x = torch::ones({3}, torch::requires_grad());
         auto y = (x * 2).sum();
         x.register_hook([](const torch::Tensor&) { TORCH_CHECK(false, "bad gradient"); });
         y.backward();
       }}};
  std::string sample, c10Sample;
  for (const auto& [name, fail] : cases) {
    std::vector<double> c10Text, symbolised;
    for (int r = 0; r < rounds; ++r) {
      try {
        fail();
      } catch (const c10::Error& e) {
        // c10 captured the frames when it threw and names them (lazily) on first use: its text.
        auto t = Clock::now();
        c10Sample = e.backtrace()->get();
        c10Text.push_back(msSince(t));
        // The text is cached now: what describeException adds is the symboliser.
        t = Clock::now();
        const dw::ErrorRecord record = dw::describeException(std::current_exception());
        symbolised.push_back(msSince(t));
        sample = record.backtrace;
      }
    }
    const auto [frames, named] = countNamed(sample);
    std::printf("%s: %zu frames; named by c10 %zu, after symbolisation %zu\n", name.c_str(), frames,
                countNamed(c10Sample).second, named);
    report("  c10's text of the frames (dladdr)", c10Text);
    report("  describeException on top (fork + libdw)", symbolised);
  }
  std::vector<double> forkOnly;
  for (int r = 0; r < rounds; ++r) {
    const auto t = Clock::now();
    const pid_t child = ::fork();
    if (child == 0) std::_Exit(0);
    ::waitpid(child, nullptr, 0);
    forkOnly.push_back(msSince(t));
  }
  std::printf("RSS ballast %.1f GiB\n", rssGib);
  report("fork + exit + wait of this process", forkOnly);
  if (argc > 1 && std::string(argv[argc - 1]) == "--print") std::printf("%s", sample.c_str());
  return 0;
}
