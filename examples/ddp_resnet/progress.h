#pragma once
// What rank 0 shows while training: a live bar on a terminal, plain lines otherwise (a log
// file, or `launch`, which collects every worker's output line by line). Torch-free; the
// trainer asks wantsUpdate() first so that it only reads the loss off the device when a line
// or frame will actually be drawn.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "examples/ddp_resnet/options.h"

namespace ddpl::example {

// "42s", "3m05s", "1h02m".
std::string formatDuration(double seconds);

struct StepStats {
  int epoch = 0;  // 1-based
  int epochs = 0;
  int64_t step_in_epoch = 0;  // 1-based, optimizer steps
  int64_t steps_per_epoch = 0;
  double loss = 0;  // rank 0, mean since the last update
  double lr = 0;
  double images_per_second = 0;  // all ranks
  double eta_seconds = 0;
};

class ProgressReporter {
 public:
  // enabled: false on ranks other than 0 (they stay silent). mode kOff keeps line() (epoch
  // results, the summary) but drops per-step output. logEvery: steps between lines.
  ProgressReporter(ProgressMode mode, bool enabled, int64_t logEvery, std::FILE* out = stdout);
  ~ProgressReporter();

  bool usesBar() const { return bar_; }
  // Whether update() for this step would draw something.
  bool wantsUpdate(int64_t step_in_epoch, int64_t steps_per_epoch);
  void update(const StepStats& stats);
  // A whole line (clears a bar in progress first).
  void line(const std::string& text);
  // Leaves the terminal on a fresh line (a cleanup hook calls this when training is cut short).
  void finishLine();

 private:
  std::FILE* out_;
  bool enabled_;
  bool steps_;
  bool bar_;
  int64_t log_every_;
  bool bar_drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace ddpl::example
