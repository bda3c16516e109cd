// ddp_resnet: trains a ResNet with the worker library's DistributedDataParallel, one process per
// rank, started by `launch`, torchrun or mpirun (alone it is a single rank). Restarted by the
// launcher after a failure, it resumes from the latest complete checkpoint and finishes the same
// number of optimizer steps.
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "common/errors.h"
#include "examples/ddp_resnet/cifar10.h"
#include "examples/ddp_resnet/data.h"
#include "examples/ddp_resnet/options.h"
#include "examples/ddp_resnet/progress.h"
#include "examples/ddp_resnet/resnet.h"
#include "worker/amp.h"
#include "worker/checkpoint.h"
#include "worker/ddp.h"
#include "worker/error_report.h"
#include "worker/log_bridge.h"
#include "worker/sampler.h"
#include "worker/session.h"

namespace ddpl::example {
namespace {

namespace dw = ddpl::worker;
namespace fs = std::filesystem;

constexpr double kPi = 3.14159265358979323846;

// The schedule in optimizer steps, fixed by the options, the training-set size and the world
// size: a resumed run recomputes the same plan and so finishes the same number of steps.
struct Plan {
  int64_t samplesPerRank = 0;  // DistributedSampler pads to an equal share
  int64_t stepsPerEpoch = 0;
  int64_t totalSteps = 0;
  int64_t warmupSteps = 0;
  int64_t globalBatch = 0;  // images per optimizer step, all ranks
  int64_t logEvery = 1;
};

Plan makePlan(const Options& o, int64_t trainSize, int worldSize) {
  Plan p;
  p.samplesPerRank = (trainSize + worldSize - 1) / worldSize;
  const int64_t microBatches = p.samplesPerRank / o.batchSize;
  if (microBatches == 0) {
    throw UsageError("--batch-size: " + std::to_string(o.batchSize) +
                     " is more than each rank's share of the " + std::to_string(trainSize) +
                     " training images (" + std::to_string(p.samplesPerRank) + " on each of " +
                     std::to_string(worldSize) + " ranks)");
  }
  p.stepsPerEpoch = microBatches / o.accumulation;
  if (p.stepsPerEpoch == 0) {
    throw UsageError("--accumulation: " + std::to_string(o.accumulation) +
                     " micro-batches per step, but an epoch has only " +
                     std::to_string(microBatches) + " per rank");
  }
  p.totalSteps = p.stepsPerEpoch * o.epochs;
  p.warmupSteps = std::min<int64_t>(
      p.totalSteps, std::llround(o.warmupEpochs * static_cast<double>(p.stepsPerEpoch)));
  p.globalBatch = static_cast<int64_t>(o.batchSize) * o.accumulation * worldSize;
  p.logEvery = o.logEvery > 0 ? o.logEvery : std::max<int64_t>(1, p.stepsPerEpoch / 10);
  return p;
}

// Linear warm-up to the peak, then cosine decay to --min-lr. step: 0-based index of the step.
double learningRate(const Options& o, const Plan& p, int64_t step) {
  if (step < p.warmupSteps)
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(p.warmupSteps);
  const double decaySteps = static_cast<double>(std::max<int64_t>(1, p.totalSteps - p.warmupSteps));
  const double t = std::min(1.0, static_cast<double>(step - p.warmupSteps) / decaySteps);
  return o.minLr + 0.5 * (o.lr - o.minLr) * (1.0 + std::cos(kPi * t));
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9E3779B97F4A7C15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// ckpt-step<N>.pt files, newest kept. Names carry the step so that "latest" is a listing, not a
// pointer file that could itself be half-written.
class CheckpointDir {
 public:
  static constexpr const char* kRunIdFile = "run_id";

  CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

  std::string pathFor(int64_t step) const {
    char name[64];
    std::snprintf(name, sizeof name, "ckpt-step%08lld.pt", static_cast<long long>(step));
    return dir_ + "/" + name;
  }

  // Complete checkpoints, newest first. A writer killed mid-write leaves only a ".tmp.<pid>"
  // file, which never matches.
  std::vector<std::pair<int64_t, std::string>> list() const {
    static const std::regex kName("ckpt-step([0-9]+)\\.pt");
    std::vector<std::pair<int64_t, std::string>> found;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir_, ec)) {
      std::smatch m;
      const std::string name = entry.path().filename().string();
      if (std::regex_match(name, m, kName))
        found.emplace_back(std::stoll(m[1]), entry.path().string());
    }
    std::sort(found.rbegin(), found.rend());
    return found;
  }

  // Temporaries of writers killed mid-write: their processes are gone once we run again.
  void removeTemporaries() const {
    static const std::regex kTemp("ckpt-step[0-9]+\\.pt\\.tmp\\.[0-9]+");
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir_, ec)) {
      if (std::regex_match(entry.path().filename().string(), kTemp)) fs::remove(entry.path(), ec);
    }
  }

  void prune() const {
    const auto all = list();
    std::error_code ec;
    for (size_t i = static_cast<size_t>(keep_); i < all.size(); ++i) fs::remove(all[i].second, ec);
  }

  // The job (TORCHELASTIC_RUN_ID) whose checkpoints these are.
  std::string storedRunId() const {
    std::ifstream in(dir_ + "/" + kRunIdFile);
    std::string id;
    std::getline(in, id);
    return id;
  }
  void storeRunId(const std::string& id) const {
    if (id.empty() || storedRunId() == id) return;
    const std::string tmp = dir_ + "/" + kRunIdFile + ".tmp";
    std::ofstream(tmp) << id << "\n";
    fs::rename(tmp, dir_ + "/" + kRunIdFile);
  }

  size_t removeAll() const {
    const auto all = list();
    std::error_code ec;
    for (const auto& [step, path] : all) fs::remove(path, ec);
    return all.size();
  }

 private:
  std::string dir_;
  int keep_;
};

at::Tensor allReduce(dw::Session& session, at::Tensor t, c10d::ReduceOp op = c10d::ReduceOp::SUM) {
  std::vector<at::Tensor> tensors{std::move(t)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  opts.timeout = session.options().collectiveTimeout;
  session.backend()->allreduce(tensors, opts)->wait(opts.timeout);
  return tensors[0];
}

std::optional<at::ScalarType> ampType(AmpMode amp) {
  switch (amp) {
    case AmpMode::kOff:
      return std::nullopt;
    case AmpMode::kBf16:
      return at::kBFloat16;
    case AmpMode::kFp16:
      return at::kHalf;
  }
  return std::nullopt;
}

struct Evaluation {
  double top1 = 0;
  int64_t images = 0;
  double loss = 0;
};

// Top-1 over the whole test set: each rank takes every world-th image (no padding, so nothing is
// counted twice) and the counts are summed over ranks.
Evaluation evaluate(dw::Session& session, ResNetImpl& model, const Dataset& data,
                    const Options& o) {
  torch::NoGradGuard noGrad;
  model.eval();
  const auto device = data.test.labels.device();
  const auto indices = torch::arange(session.rank(), data.test.size(), session.worldSize(),
                                     torch::TensorOptions().dtype(torch::kLong).device(device));
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  auto lossSum = torch::zeros_like(correct);
  const int64_t evalBatch = 2 * static_cast<int64_t>(o.batchSize);
  for (int64_t start = 0; start < indices.size(0); start += evalBatch) {
    const auto idx = indices.narrow(0, start, std::min(evalBatch, indices.size(0) - start));
    const Batch batch = makeBatch(data, data.test, idx, o.channelsLast, nullptr);
    std::optional<dw::AutocastScope> autocast;
    if (const auto dtype = ampType(o.amp)) autocast.emplace(device.type(), dtype);
    const auto logits = model.forward(batch.images).to(torch::kFloat);
    correct += logits.argmax(1).eq(batch.labels).sum().to(torch::kDouble);
    lossSum += torch::nn::functional::cross_entropy(
                   logits, batch.labels,
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .to(torch::kDouble);
  }
  auto stats = torch::stack(
      {correct, lossSum, torch::full({}, static_cast<double>(indices.size(0)), correct.options())});
  stats = allReduce(session, stats).cpu();
  model.train();
  const double images = stats[2].item<double>();
  return {stats[0].item<double>() / images, static_cast<int64_t>(images),
          stats[1].item<double>() / images};
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * fraction);
  return buf;
}

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

int64_t countParameters(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// What the cleanup hook reports if training is cut short (signal, exception).
struct RunState {
  std::atomic<int64_t> step{0};
  std::atomic<bool> finished{false};
  std::mutex mu;
  std::string lastCheckpoint;
};

int train(const Options& o, const dw::SessionOptions& sessionOptions,
          const std::optional<Cifar10>& cifar) {
  auto state = std::make_shared<RunState>();
  std::shared_ptr<ProgressReporter> progress;

  // Process-wide switches go in before the first kernel runs.
  dw::Session::Hook applySwitches = [&o](dw::Session&) {
    if (o.threads > 0) torch::set_num_threads(o.threads);
    dw::PerformanceOptions perf;
    perf.cudnnBenchmark = o.cudnnBenchmark;
    perf.deterministic = o.deterministic;
    if (o.tf32) {
      perf.float32MatmulPrecision = "high";
      perf.allowTf32Cudnn = true;
    }
    dw::applyPerformanceOptions(perf);
  };
  dw::Session session(sessionOptions, {applySwitches});
  const int rank = session.rank();
  const int world = session.worldSize();
  const auto device = session.device();

  // The plan was checked in main already (for a clean usage error); same numbers here.
  const int64_t trainSize = cifar ? cifar->train.count : o.trainSize;
  const Plan plan = makePlan(o, trainSize, world);
  progress = std::make_shared<ProgressReporter>(o.progress, rank == 0, plan.logEvery);

  session.addCleanupHook("progress", [state, progress, total = plan.totalSteps](dw::Session&) {
    if (state->finished) return;
    std::string checkpoint;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      checkpoint = state->lastCheckpoint;
    }
    progress->line(
        "stopped at step " + std::to_string(state->step.load()) + "/" + std::to_string(total) +
        (checkpoint.empty() ? "; no checkpoint written yet" : "; latest checkpoint " + checkpoint));
  });

  torch::manual_seed(o.seed);
  Dataset data;
  if (cifar) {
    data = fromCifar10(*cifar, o.augment);
  } else {
    data = makeSynthetic({o.trainSize, o.testSize, o.imageSize, o.classes, o.dataSeed});
  }
  moveTo(data, device);

  const bool imagenetStem = o.stem == StemKind::kImageNet ||
                            (o.stem == StemKind::kAuto && data.train.images.size(2) >= 128);
  auto model =
      std::make_shared<ResNetImpl>(ResNetConfig{o.model, o.width, data.classes, imagenetStem});
  model->to(device);
  if (o.channelsLast) {
    torch::NoGradGuard noGrad;
    for (auto& p : model->parameters()) {
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    }
  }

  dw::DdpOptions ddpOptions;
  ddpOptions.bucketBytes = static_cast<size_t>(o.bucketMb * 1024 * 1024);
  ddpOptions.commHook = o.commHook == CommHookKind::kFp16   ? dw::CommHook::kFp16Compress
                        : o.commHook == CommHookKind::kBf16 ? dw::CommHook::kBf16Compress
                                                            : dw::CommHook::kNone;
  ddpOptions.timeout = sessionOptions.collectiveTimeout;

  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(o.lr)
                                                       .momentum(o.momentum)
                                                       .weight_decay(o.weightDecay)
                                                       .nesterov(o.nesterov));
  dw::GradScalerOptions scalerOptions;
  scalerOptions.enabled = o.amp == AmpMode::kFp16;
  dw::GradScaler scaler(scalerOptions, session.backend());

  dw::TrainingProgress saved;
  dw::CheckpointRefs refs{model.get(), &optimizer, scalerOptions.enabled ? &scaler : nullptr,
                          &saved};
  CheckpointDir checkpoints(o.checkpointDir, o.keepCheckpoints);

  progress->line("ddp_resnet: " + toString(o.model) + " (width " + std::to_string(o.width) + ", " +
                 fixed(static_cast<double>(countParameters(*model)) / 1e6, 2) + "M parameters, " +
                 (imagenetStem ? "ImageNet" : "CIFAR") + " stem) on " + std::to_string(world) +
                 " rank" + (world > 1 ? "s" : "") + ", " + device.str() + "/" +
                 dw::toString(session.backendKind()) +
                 (o.amp != AmpMode::kOff ? ", amp " + toString(o.amp) : "") +
                 (o.channelsLast ? ", channels-last" : ""));
  progress->line("data: " + data.description);
  progress->line(
      "plan: " + std::to_string(o.epochs) + " epochs x " + std::to_string(plan.stepsPerEpoch) +
      " steps, global batch " + std::to_string(plan.globalBatch) + " (" +
      std::to_string(o.batchSize) + " per rank" +
      (o.accumulation > 1 ? " x " + std::to_string(o.accumulation) + " accumulated" : "") +
      "), lr " + fixed(o.lr, 4) + " with " + std::to_string(plan.warmupSteps) +
      " warm-up steps then cosine decay" +
      (checkpoints.enabled() ? "; checkpoints in " + checkpoints.dir() : "; no checkpoints"));

  // Resume whenever this is the same job started again: after a restart (a worker failed) and
  // after the group re-formed around a node that left or joined, which keeps the restart count
  // but not the run id. A new job (another run id) starts afresh unless --resume says
  // otherwise. Rank 0 decides, so that no rank reads the run id while rank 0 rewrites it.
  int64_t startStep = 0;
  std::string resumedFrom;
  std::string resumeReason;
  if (checkpoints.enabled()) {
    int64_t decision = 0;  // 0: afresh, 1: --resume, 2: restart, 3: same run re-formed
    if (rank == 0) {
      fs::create_directories(checkpoints.dir());
      checkpoints.removeTemporaries();
      if (sessionOptions.restartCount > 0)
        decision = 2;
      else if (!sessionOptions.runId.empty() && checkpoints.storedRunId() == sessionOptions.runId)
        decision = 3;
      else if (o.resume)
        decision = 1;
    }
    decision = allReduce(session,
                         torch::tensor({decision},
                                       torch::TensorOptions().dtype(torch::kLong).device(device)),
                         c10d::ReduceOp::MAX)
                   .item<int64_t>();
    if (decision > 0) {
      resumeReason = decision == 2   ? "restart " + std::to_string(sessionOptions.restartCount)
                     : decision == 3 ? "run " + sessionOptions.runId + " started again"
                                     : "--resume";
      // Only the newest: writes are atomic, so it is complete. One that does not load is an
      // error, not a reason to fall back: it belongs to another model or options, and a failed
      // load has already overwritten part of the model.
      const auto all = checkpoints.list();
      if (!all.empty()) {
        const std::string& path = all.front().second;
        try {
          // LibTorch's load replaces a tensor of another shape instead of refusing it.
          std::vector<std::vector<int64_t>> shapes;
          for (const auto& t : model->named_parameters()) shapes.push_back(t.value().sizes().vec());
          dw::loadCheckpoint(path, refs);
          size_t i = 0;
          for (const auto& t : model->named_parameters()) {
            if (t.value().sizes().vec() != shapes[i++]) {
              throw ddpl::InvalidArgument("parameter '" + t.key() + "' has shape " +
                                          c10::str(t.value().sizes()) + " in the checkpoint but " +
                                          c10::str(c10::IntArrayRef(shapes[i - 1])) +
                                          " in this model");
            }
          }
        } catch (const std::exception& e) {
          const std::string what = e.what();
          throw ddpl::InvalidArgument(
              "cannot resume from " + path + " (" + resumeReason +
              "): " + what.substr(0, what.find('\n')) +
              "; was it written with another --model, --width or --amp? Use another "
              "--checkpoint-dir, or start a new run without --resume");
        }
        startStep = saved.step;
        resumedFrom = path;
      }
      if (startStep > 0 && saved.samplesSeen != startStep * plan.globalBatch) {
        // World size or batch changed (an elastic resize): the data order within an epoch
        // depends on both, so pick up at the start of the interrupted epoch.
        const int64_t restart = std::min<int64_t>(saved.epoch, o.epochs) * plan.stepsPerEpoch;
        progress->line("global batch changed since the checkpoint (" +
                       std::to_string(saved.samplesSeen / std::max<int64_t>(1, startStep)) +
                       " -> " + std::to_string(plan.globalBatch) +
                       "): continuing at the start of epoch " + std::to_string(saved.epoch + 1));
        startStep = restart;
      }
    } else if (rank == 0) {
      if (const size_t removed = checkpoints.removeAll()) {
        progress->line("starting afresh: removed " + std::to_string(removed) +
                       " checkpoint(s) of an earlier run from " + checkpoints.dir() +
                       " (--resume continues from them instead)");
      }
    }
    if (rank == 0) checkpoints.storeRunId(sessionOptions.runId);
  }
  // Every rank must continue from the same step; differing answers mean the directory is not
  // shared between the nodes.
  {
    auto steps = allReduce(session,
                           torch::tensor({startStep, -startStep},
                                         torch::TensorOptions().dtype(torch::kLong).device(device)),
                           c10d::ReduceOp::MAX)
                     .cpu();
    const int64_t most = steps[0].item<int64_t>(), least = -steps[1].item<int64_t>();
    if (most != least) {
      throw ddpl::Error("ranks resume from different steps (" + std::to_string(least) + " to " +
                        std::to_string(most) + "; this rank: " + std::to_string(startStep) +
                        "): --checkpoint-dir " + checkpoints.dir() +
                        " must be one directory shared by all nodes");
    }
  }
  startStep = std::min(startStep, plan.totalSteps);
  if (!resumedFrom.empty()) {
    progress->line("resumed from " + resumedFrom + " at step " + std::to_string(startStep) + "/" +
                   std::to_string(plan.totalSteps) + " (" + resumeReason + ")");
  }
  state->step = startStep;

  dw::DistributedDataParallel<ResNetImpl> ddp(model, session.backend(), ddpOptions);
  dw::DistributedSampler sampler(data.train.size(), rank, world,
                                 {/*shuffle=*/true, o.seed, /*dropLast=*/false});
  if (sampler.numSamples() != plan.samplesPerRank) {
    throw ddpl::Error("sampler gives " + std::to_string(sampler.numSamples()) +
                      " images per rank, plan expected " + std::to_string(plan.samplesPerRank));
  }

  const auto saveAt = [&](int64_t epoch, int64_t step) {
    if (!checkpoints.enabled()) return;
    progress->finishLine();  // the library logs the write: not onto the end of a progress bar
    saved = {epoch, step, step * plan.globalBatch};
    const std::string path = checkpoints.pathFor(step);
    dw::saveCheckpoint(session, path, refs);
    if (rank == 0) checkpoints.prune();
    std::lock_guard<std::mutex> lock(state->mu);
    state->lastCheckpoint = path;
  };

  const auto amp = ampType(o.amp);
  const auto floatOnDevice = torch::TensorOptions().dtype(torch::kFloat).device(device);
  int64_t step = startStep;
  double trainSeconds = 0;
  Evaluation last;
  std::vector<nlohmann::json> epochLog;
  const auto runStart = std::chrono::steady_clock::now();

  for (int64_t epoch = step / plan.stepsPerEpoch; epoch < o.epochs; ++epoch) {
    sampler.setEpoch(epoch);
    const auto order = sampler.indices();
    const auto indices = torch::tensor(order, torch::kLong).to(device);
    model->train();
    auto epochLoss = torch::zeros({}, floatOnDevice);
    auto windowLoss = torch::zeros({}, floatOnDevice);
    int64_t epochMicroBatches = 0, windowMicroBatches = 0;
    auto epochStart = std::chrono::steady_clock::now();

    for (int64_t s = step - epoch * plan.stepsPerEpoch; s < plan.stepsPerEpoch; ++s) {
      const double lr = learningRate(o, plan, step);
      for (auto& group : optimizer.param_groups())
        static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
      optimizer.zero_grad();
      for (int m = 0; m < o.accumulation; ++m) {
        const int64_t micro = s * o.accumulation + m;
        const uint64_t augmentSeed = mix(mix(o.seed, static_cast<uint64_t>(epoch)),
                                         static_cast<uint64_t>(micro * world + rank));
        const Batch batch =
            makeBatch(data, data.train, indices.narrow(0, micro * o.batchSize, o.batchSize),
                      o.channelsLast, &augmentSeed);
        // Only the last micro-batch of a step synchronises gradients.
        std::optional<dw::NoSyncGuard> noSync;
        if (m + 1 < o.accumulation) noSync.emplace(ddp.reducer());
        at::Tensor loss;
        {
          std::optional<dw::AutocastScope> autocast;
          if (amp) autocast.emplace(device.type(), amp);
          loss = torch::nn::functional::cross_entropy(ddp.forward(batch.images), batch.labels);
        }
        const auto detached = loss.detach().to(torch::kFloat);
        epochLoss += detached;
        windowLoss += detached;
        ++epochMicroBatches;
        ++windowMicroBatches;
        scaler.scale(loss / o.accumulation).backward();
      }
      scaler.step(optimizer);
      scaler.update();
      state->step = ++step;

      if (progress->wantsUpdate(s + 1, plan.stepsPerEpoch)) {
        const double elapsed =
            trainSeconds +
            std::chrono::duration<double>(std::chrono::steady_clock::now() - epochStart).count();
        const double stepsDone = static_cast<double>(step - startStep);
        StepStats stats;
        stats.epoch = static_cast<int>(epoch + 1);
        stats.epochs = o.epochs;
        stats.stepInEpoch = s + 1;
        stats.stepsPerEpoch = plan.stepsPerEpoch;
        stats.loss = windowLoss.item<double>() / static_cast<double>(windowMicroBatches);
        stats.lr = lr;
        stats.imagesPerSecond =
            stepsDone * static_cast<double>(plan.globalBatch) / std::max(elapsed, 1e-9);
        stats.etaSeconds =
            static_cast<double>(plan.totalSteps - step) * elapsed / std::max(stepsDone, 1.0);
        progress->update(stats);
        windowLoss.zero_();
        windowMicroBatches = 0;
      }
      if (o.checkpointEvery > 0 && step % o.checkpointEvery == 0 && s + 1 < plan.stepsPerEpoch)
        saveAt(epoch, step);
    }
    trainSeconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epochStart).count();

    auto lossStats =
        allReduce(session,
                  torch::stack({epochLoss, torch::full({}, static_cast<float>(epochMicroBatches),
                                                       floatOnDevice)}))
            .cpu();
    const double trainLoss =
        lossStats[0].item<double>() / std::max(1.0, lossStats[1].item<double>());
    nlohmann::json entry{{"epoch", epoch + 1}, {"train_loss", trainLoss}};
    std::string line = "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(o.epochs) +
                       " done: train loss " + fixed(trainLoss, 4);
    if ((epoch + 1) % o.evalEvery == 0 || epoch + 1 == o.epochs) {
      last = evaluate(session, *model, data, o);
      entry["test_top1"] = last.top1;
      entry["test_loss"] = last.loss;
      line += ", test loss " + fixed(last.loss, 4) + ", top-1 " + percent(last.top1) + " (" +
              std::to_string(last.images) + " images)";
    }
    saveAt(epoch + 1, step);
    line +=
        ", " +
        formatDuration(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - epochStart).count());
    progress->line(line);
    epochLog.push_back(entry);
  }
  if (last.images == 0) last = evaluate(session, *model, data, o);  // resumed after the last step

  state->finished = true;
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - runStart).count();
  const int64_t stepsRun = step - startStep;
  const double throughput =
      static_cast<double>(stepsRun * plan.globalBatch) / std::max(trainSeconds, 1e-9);
  std::string checkpointPath;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    checkpointPath = state->lastCheckpoint;
  }
  progress->line("finished: " + std::to_string(step) + "/" + std::to_string(plan.totalSteps) +
                 " steps" +
                 (startStep > 0 ? " (" + std::to_string(stepsRun) + " in this run, resumed at " +
                                      std::to_string(startStep) + ")"
                                : "") +
                 " in " + formatDuration(wall) + " on " + std::to_string(world) + " rank" +
                 (world > 1 ? "s" : "") + ", " + fixed(throughput, 0) + " images/s");
  progress->line("final test top-1: " + percent(last.top1) + " on " + std::to_string(last.images) +
                 " images (chance " + percent(1.0 / static_cast<double>(data.classes)) + ")");
  if (checkpointPath.empty()) checkpointPath = resumedFrom;  // resumed after the last step
  progress->line(checkpointPath.empty() ? "checkpoint: none (--checkpoint-dir '')"
                                        : "checkpoint: " + checkpointPath);

  if (rank == 0 && !o.summaryJson.empty()) {
    nlohmann::json summary{{"model", toString(o.model)},
                           {"world_size", world},
                           {"backend", dw::toString(session.backendKind())},
                           {"device", device.str()},
                           {"epochs", o.epochs},
                           {"steps_per_epoch", plan.stepsPerEpoch},
                           {"total_steps", plan.totalSteps},
                           {"final_step", step},
                           {"start_step", startStep},
                           {"steps_this_run", stepsRun},
                           {"resumed_from", resumedFrom},
                           {"restart_count", sessionOptions.restartCount},
                           {"global_batch", plan.globalBatch},
                           {"final_top1", last.top1},
                           {"final_test_loss", last.loss},
                           {"test_images", last.images},
                           {"classes", data.classes},
                           {"epoch_log", epochLog},
                           {"seconds", wall},
                           {"images_per_second", throughput},
                           {"checkpoint", checkpointPath}};
    std::ofstream(o.summaryJson) << summary.dump(2) << "\n";
  }
  return 0;
}

// Errors found before the job starts still reach the launcher's failure report.
int inputError(const std::string& errorFile, const std::string& message) {
  std::fprintf(stderr, "ddp_resnet: %s\n", message.c_str());
  try {
    throw ddpl::InvalidArgument(message);
  } catch (...) {
    // Its frames are this function's own: not worth symbolising (a fork and a look into the
    // program's debug information on every rank).
    dw::NativeTraceOptions frames;
    frames.symbolize = false;
    dw::writeErrorFile(errorFile, dw::describeException(std::current_exception(), frames));
  }
  return kUsageExitCode;
}

}  // namespace
}  // namespace ddpl::example

int main(int argc, char** argv) {
  namespace ex = ddpl::example;
  namespace dw = ddpl::worker;
  // Everything a user can get wrong is checked here, before any process group is built: a bad
  // flag or a broken data directory is one clear line and exit code 2 on every rank, not a
  // collective timeout minutes later.
  dw::SessionOptions sessionOptions;
  try {
    sessionOptions = dw::SessionOptions::fromEnvironment();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_resnet: %s\n", e.what());
    return ex::kUsageExitCode;
  }
  ex::Options options;
  std::optional<ex::Cifar10> cifar;
  try {
    options = ex::parseOptions(std::vector<std::string>(argv + 1, argv + argc));
    if (options.help) {
      std::fputs(ex::usage().c_str(), stdout);
      return 0;
    }
    if (options.backend) sessionOptions.backend = dw::parseBackendKind(*options.backend);
    if (!options.dataDir.empty()) cifar = ex::loadCifar10(options.dataDir);
    ex::makePlan(options, cifar ? cifar->train.count : options.trainSize, sessionOptions.worldSize);
  } catch (const ex::UsageError& e) {
    return ex::inputError(sessionOptions.errorFile, e.what());
  } catch (const ex::DataError& e) {
    return ex::inputError(sessionOptions.errorFile, e.what());
  }
  return dw::recordErrors(sessionOptions.errorFile,
                          [&] { return ex::train(options, sessionOptions, cifar); });
}
