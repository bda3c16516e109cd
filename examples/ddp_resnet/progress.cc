#include "examples/ddp_resnet/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>

namespace ddpl::example {
namespace {

constexpr int kBarWidth = 24;
// Redrawing faster than the eye reads only costs device syncs (the loss is read per frame).
constexpr std::chrono::milliseconds kFrameInterval{150};

std::string printf(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string printf(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

}  // namespace

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return printf("%llds", static_cast<long long>(s));
  if (s < 3600)
    return printf("%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return printf("%lldh%02lldm", static_cast<long long>(s / 3600),
                static_cast<long long>((s % 3600) / 60));
}

ProgressReporter::ProgressReporter(ProgressMode mode, bool enabled, int64_t logEvery,
                                   std::FILE* out)
    : out_(out),
      enabled_(enabled),
      steps_(enabled && mode != ProgressMode::kOff),
      log_every_(std::max<int64_t>(1, logEvery)) {
  const bool terminal = ::isatty(::fileno(out_)) == 1;
  bar_ = steps_ && (mode == ProgressMode::kBar || (mode == ProgressMode::kAuto && terminal));
}

ProgressReporter::~ProgressReporter() { finishLine(); }

bool ProgressReporter::wantsUpdate(int64_t step_in_epoch, int64_t steps_per_epoch) {
  if (!steps_) return false;
  if (step_in_epoch == steps_per_epoch) return true;
  if (bar_) return std::chrono::steady_clock::now() - last_draw_ >= kFrameInterval;
  return step_in_epoch % log_every_ == 0;
}

void ProgressReporter::update(const StepStats& s) {
  if (!steps_) return;
  last_draw_ = std::chrono::steady_clock::now();
  const std::string numbers = printf("loss %.4f  lr %.4f  %.0f img/s  ETA %s", s.loss, s.lr,
                                     s.images_per_second, formatDuration(s.eta_seconds).c_str());
  if (bar_) {
    const double done =
        s.steps_per_epoch > 0 ? static_cast<double>(s.step_in_epoch) / s.steps_per_epoch : 0;
    const int filled = static_cast<int>(done * kBarWidth);
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < kBarWidth) bar += '>';
    bar.resize(kBarWidth, ' ');
    // \r and erase-to-end-of-line: one line redrawn in place.
    std::fprintf(out_, "\r\033[Kepoch %d/%d [%s] %lld/%lld  %s", s.epoch, s.epochs, bar.c_str(),
                 static_cast<long long>(s.step_in_epoch), static_cast<long long>(s.steps_per_epoch),
                 numbers.c_str());
    bar_drawn_ = true;
  } else {
    std::fprintf(out_, "epoch %d/%d  step %lld/%lld  %s\n", s.epoch, s.epochs,
                 static_cast<long long>(s.step_in_epoch), static_cast<long long>(s.steps_per_epoch),
                 numbers.c_str());
  }
  std::fflush(out_);
}

void ProgressReporter::line(const std::string& text) {
  if (!enabled_) return;
  finishLine();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void ProgressReporter::finishLine() {
  if (!bar_drawn_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  bar_drawn_ = false;
}

}  // namespace ddpl::example
