// Training throughput of our C++ DDP on a small ResNet with synthetic data, one rank of a job
// started by `launch` or torchrun. Prints rank 0's samples/s. --no-comm runs the same loop with
// communication switched off (DdpOptions::communicate = false), to measure DDP's overhead.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/ddp_resnet_model.h"
#include "worker/ddp.h"
#include "worker/error_report.h"
#include "worker/session.h"

namespace dw = ddpl::worker;

int main(int argc, char** argv) {
  int steps = 30, warmup = 5, batch = 32;
  bool comm = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-comm") comm = false;
    else if (a.rfind("--steps=", 0) == 0) steps = std::stoi(a.substr(8));
    else if (a.rfind("--batch=", 0) == 0) batch = std::stoi(a.substr(8));
  }
  auto options = dw::SessionOptions::fromEnvironment();
  return dw::recordErrors(options.errorFile, [&] {
    dw::Session session(options);
    torch::manual_seed(0);
    auto model = ddpl::bench::SmallResNet();
    dw::DdpOptions ddpOptions;
    ddpOptions.communicate = comm;
    ddpOptions.broadcastBuffers = comm;
    dw::DistributedDataParallel<ddpl::bench::SmallResNetImpl> ddp(model.ptr(), session.backend(), ddpOptions);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1 + session.rank());
    auto x = torch::randn({batch, 3, 32, 32}, gen);
    auto y = torch::randint(0, 10, {batch}, gen);
    std::chrono::steady_clock::time_point start;
    for (int step = 0; step < warmup + steps; ++step) {
      if (step == warmup) {
        session.barrier();
        start = std::chrono::steady_clock::now();
      }
      opt.zero_grad();
      torch::nn::functional::cross_entropy(ddp.forward(x), y).backward();
      opt.step();
    }
    session.barrier();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (session.rank() == 0) {
      std::printf("samples_per_sec=%.1f (cpp ddp%s, %d ranks, batch %d/rank, %d steps)\n",
                  steps * batch * session.worldSize() / seconds, comm ? "" : " no-comm", session.worldSize(), batch, steps);
      std::fflush(stdout);
    }
    return 0;
  });
}
