// A user's training program, from ddplaunch's installed headers alone: a linear model on random
// data, trained a few steps with DistributedDataParallel under AutoBatch (an out-of-memory error
// injected at step 3 on rank 1 switches both ranks from micro-batch 32 to 16 x 2), checkpointed
// through a CheckpointManager, then checkpointed to a file and read back. Every rank prints one
// line the consumer test checks (equal weights on all ranks show that the gradients were
// averaged: each rank starts from its own seed and sees its own shard).
#include <torch/torch.h>

#include <cstdio>
#include <string>

// Every installed header, not only those used: one that needs a header the package lacks fails
// to compile here.
#include "common/errors.h"
#include "rendezvous/store/store.h"
#include "worker/amp.h"
#include "worker/auto_batch.h"
#include "worker/checkpoint_archive.h"
#include "worker/checkpoint_manager.h"
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
  return dw::recordErrors(options.error_file, [&] {
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
    const dw::CheckpointRefs refs{model.get(), &optimizer, nullptr, &progress};
    dw::CheckpointManager checkpoints(session, {checkpointPath + ".d", 2, /*resume=*/false});
    checkpoints.resume(refs);  // a new run: nothing to load
    dw::AutoBatchOptions autoOptions;
    autoOptions.inject = {/*step=*/3, /*rank=*/1};
    dw::AutoBatch autoBatch(session, ddp, {sampler.numSamples(), 1}, autoOptions);
    double firstLoss = 0, loss = 0;
    for (int64_t step = 0; step < 8; ++step) {
      sampler.setEpoch(step);
      const auto index = torch::tensor(sampler.indices());
      do {
        optimizer.zero_grad();
        loss = 0;
      } while (!autoBatch.step(step, [&](int64_t m) {
        const auto& mb = autoBatch.current();
        const auto part = index.narrow(0, m * mb.micro_batch, mb.micro_batch);
        auto l = torch::mse_loss(ddp(x.index_select(0, part)), y.index_select(0, part));
        (l / mb.accumulation).backward();
        loss += l.item<double>() / static_cast<double>(mb.accumulation);
      }));
      optimizer.step();
      if (step == 0) firstLoss = loss;
      progress.step = step + 1;
    }
    checkpoints.save(refs);
    dw::saveCheckpoint(session, checkpointPath, refs);

    auto reloaded = std::make_shared<torch::nn::LinearImpl>(8, 1);
    dw::TrainingProgress reloadedProgress;
    if (!dw::loadCheckpoint(checkpointPath,
                            {reloaded.get(), nullptr, nullptr, &reloadedProgress}) ||
        !torch::equal(reloaded->weight, model->weight) || reloadedProgress.step != progress.step) {
      throw ddpl::Error("checkpoint " + checkpointPath + " does not hold the trained model");
    }
    // Readable at once, in launch's memory or in the directory; named in the directory.
    if (checkpoints.latestDurable() != checkpointPath + ".d/ckpt-step00000008.pt" ||
        !dw::checkpointDefect(checkpoints.latest()).empty()) {
      throw ddpl::Error("CheckpointManager wrote '" + checkpoints.latest() + "'");
    }
    std::printf(
        "consumer rank %d/%d: %lld steps, loss %.4f -> %.4f, micro-batch %lld x %lld, "
        "weights %.6f\n",
        session.rank(), session.worldSize(), static_cast<long long>(progress.step), firstLoss, loss,
        static_cast<long long>(autoBatch.current().micro_batch),
        static_cast<long long>(autoBatch.current().accumulation),
        model->weight.sum().item<double>() + model->bias.sum().item<double>());
    return 0;
  });
}
