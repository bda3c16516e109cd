// Training throughput of our C++ DDP on a small ResNet with synthetic data, one rank of a job
// started by `launch` or torchrun. Prints rank 0's samples/s. --no-comm runs the same loop with
// communication switched off (DdpOptions::communicate = false), to measure DDP's overhead.
// For looking into that overhead:
//   --phases                         per-step milliseconds of each phase, every rank
//   --probe                          latency of one all-reduce by size, then exit
//   --sync-buffers-before-forward    DdpOptions::overlap_buffer_broadcast = false
//   --no-broadcast                   DdpOptions::broadcast_buffers = false
//   --first-bucket-kb=N --bucket-kb=N
//   --steps=N --batch=N
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>

#include "bench/ddp_resnet_model.h"
#include "common/parse.h"
#include "worker/ddp.h"
#include "worker/error_report.h"
#include "worker/session.h"

namespace dw = ddpl::worker;

int main(int argc, char** argv) {
  int steps = 30, warmup = 5, batch = 32;
  bool comm = true, bcast = true, phases = false, probe = false;
  size_t firstBucketKb = 0, bucketKb = 0;
  bool overlapBuffers = true;
  auto value = [](const std::string& a, int64_t lo, int64_t hi) {
    auto eq = a.find('=');
    return ddpl::parseInteger(a.substr(0, eq), a.substr(eq + 1), lo, hi);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    try {
      if (a == "--no-comm")
        comm = false;
      else if (a == "--no-broadcast")
        bcast = false;
      else if (a == "--phases")
        phases = true;
      else if (a == "--probe")
        probe = true;
      else if (a == "--sync-buffers-before-forward")
        overlapBuffers = false;
      else if (a.rfind("--first-bucket-kb=", 0) == 0)
        firstBucketKb = value(a, 1, 1 << 20);
      else if (a.rfind("--bucket-kb=", 0) == 0)
        bucketKb = value(a, 1, 1 << 20);
      else if (a.rfind("--steps=", 0) == 0)
        steps = static_cast<int>(value(a, 1, 1'000'000));
      else if (a.rfind("--batch=", 0) == 0)
        batch = static_cast<int>(value(a, 1, 1'000'000));
      else {
        std::fprintf(
            stderr,
            "ddp_bench: unknown flag '%s' (see the comment at the top of bench/ddp_bench.cc)\n",
            a.c_str());
        return 2;
      }
    } catch (const ddpl::InvalidArgument& e) {
      std::fprintf(stderr, "ddp_bench: %s\n", e.what());
      return 2;
    }
  }
  auto options = dw::SessionOptions::fromEnvironment();
  return dw::recordErrors(options.error_file, [&] {
    dw::Session session(options);
    if (probe) {
      for (int64_t n : {1, 256, 4096, 44000, 175000, 1000000}) {
        std::vector<at::Tensor> t{torch::randn({n})};
        for (int i = 0; i < 10; ++i) session.backend()->allreduce(t)->wait();
        const auto p0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 200; ++i) session.backend()->allreduce(t)->wait();
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - p0).count() / 200;
        if (session.rank() == 0)
          std::printf("allreduce %ld floats: %.0f us\n", static_cast<long>(n), us);
      }
      return 0;
    }
    torch::manual_seed(0);
    auto model = ddpl::bench::SmallResNet();
    dw::DdpOptions ddpOptions;
    ddpOptions.communicate = comm;
    ddpOptions.broadcast_buffers = comm && bcast;
    if (firstBucketKb) ddpOptions.first_bucket_bytes = firstBucketKb << 10;
    if (bucketKb) ddpOptions.bucket_bytes = bucketKb << 10;
    ddpOptions.overlap_buffer_broadcast = overlapBuffers;
    dw::DistributedDataParallel<ddpl::bench::SmallResNetImpl> ddp(model.ptr(), session.backend(), ddpOptions);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1 + session.rank());
    auto x = torch::randn({batch, 3, 32, 32}, gen);
    auto y = torch::randint(0, 10, {batch}, gen);
    using Clock = std::chrono::steady_clock;
    auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    Clock::time_point start;
    double fwd = 0, bwd = 0, stp = 0, bc = 0;
    std::vector<double> tails;  // per timed step: wait after the last gradient
    for (int step = 0; step < warmup + steps; ++step) {
      if (step == warmup) {
        session.barrier();
        start = Clock::now();
        fwd = bwd = stp = bc = 0;
      }
      const auto t0 = Clock::now();
      opt.zero_grad();
      ddp.reducer().beforeForward();
      const auto tb = Clock::now();
      auto out = model->forward(x);
      ddp.reducer().afterForward();
      auto loss = torch::nn::functional::cross_entropy(out, y);
      const auto t1 = Clock::now();
      bc += ms(t0, tb);
      loss.backward();
      const auto t2 = Clock::now();
      opt.step();
      const auto t3 = Clock::now();
      fwd += ms(t0, t1);
      bwd += ms(t1, t2);
      stp += ms(t2, t3);
      if (phases && step >= warmup) {  // the trace is a locked copy: only when asked for
        const auto trace = ddp.reducer().lastIteration();
        if (trace.finished_us >= 0)
          tails.push_back((trace.finished_us - trace.last_grad_ready_us) / 1000);
      }
    }
    session.barrier();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (session.rank() == 0) {
      std::printf("samples_per_sec=%.1f (cpp ddp%s, %d ranks, batch %d/rank, %d steps)\n",
                  steps * batch * session.worldSize() / seconds, comm ? "" : " no-comm", session.worldSize(), batch, steps);
      std::fflush(stdout);
    }
    if (phases) {
      const double tail = std::accumulate(tails.begin(), tails.end(), 0.0);
      std::printf("rank %d per step ms: broadcast %.2f forward %.2f backward %.2f step %.2f (after last grad %.2f)\n", session.rank(), bc / steps,
                  fwd / steps, bwd / steps, stp / steps, tail / steps);
      std::string list;
      for (double t : tails) list += " " + std::to_string(t).substr(0, 5);
      std::printf("rank %d tails ms:%s\n", session.rank(), list.c_str());
      std::fflush(stdout);
    }
    return 0;
  });
}
