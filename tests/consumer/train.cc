// A user's training program, from ddplaunch's installed headers alone: a linear model on random
// data, trained a few steps with DistributedDataParallel, then checkpointed and read back.
// Every rank prints one line the consumer test checks (equal weights on all ranks show that the
// gradients were averaged: each rank starts from its own seed and sees its own shard).
#include <torch/torch.h>

#include <cstdio>
#include <string>

// Every installed header, not only those used: one that needs a header the package lacks fails
// to compile here.
#include "common/errors.h"
#include "rendezvous/store.h"
#include "worker/amp.h"
#include "worker/checkpoint.h"
#include "worker/ddp.h"
#include "worker/error_report.h"
#include "worker/heartbeat.h"
#include "worker/log_bridge.h"
#include "worker/sampler.h"
#include "worker/session.h"
#include "worker/store_adapter.h"

namespace dw = ddpl::worker;

int main(int argc, char** argv) {
  const std::string checkpointPath = argc > 1 ? argv[1] : "consumer.pt";
  const auto options = dw::SessionOptions::fromEnvironment();
  return dw::recordErrors(options.errorFile, [&] {
    dw::Session session(options);
    torch::manual_seed(1000 + session.rank());  // DDP must broadcast rank 0's weights
    auto model = std::make_shared<torch::nn::LinearImpl>(8, 1);
    dw::DistributedDataParallel<torch::nn::LinearImpl> ddp(model, session.backend());
    torch::optim::SGD optimizer(model->parameters(), 0.1);

    torch::manual_seed(7);  // the same data set on every rank; the sampler shards it
    const auto x = torch::randn({64, 8});
    const auto y = x.mm(torch::randn({8, 1}));
    dw::DistributedSampler sampler(x.size(0), session.rank(), session.worldSize());
    dw::TrainingProgress progress;
    double firstLoss = 0, loss = 0;
    for (int64_t step = 0; step < 8; ++step) {
      sampler.setEpoch(step);
      const auto index = torch::tensor(sampler.indices());
      optimizer.zero_grad();
      auto l = torch::mse_loss(ddp(x.index_select(0, index)), y.index_select(0, index));
      l.backward();
      optimizer.step();
      loss = l.item<double>();
      if (step == 0) firstLoss = loss;
      progress.step = step + 1;
    }
    dw::saveCheckpoint(session, checkpointPath, {model.get(), &optimizer, nullptr, &progress});

    auto reloaded = std::make_shared<torch::nn::LinearImpl>(8, 1);
    dw::TrainingProgress reloadedProgress;
    if (!dw::loadCheckpoint(checkpointPath,
                            {reloaded.get(), nullptr, nullptr, &reloadedProgress}) ||
        !torch::equal(reloaded->weight, model->weight) || reloadedProgress.step != progress.step) {
      throw ddpl::Error("checkpoint " + checkpointPath + " does not hold the trained model");
    }
    std::printf("consumer rank %d/%d: %lld steps, loss %.4f -> %.4f, weights %.6f\n",
                session.rank(), session.worldSize(), static_cast<long long>(progress.step),
                firstLoss, loss,
                model->weight.sum().item<double>() + model->bias.sum().item<double>());
    return 0;
  });
}
