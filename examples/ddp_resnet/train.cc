// ddp_resnet: trains a ResNet with the worker library's DistributedDataParallel, one process per
// rank, started by `launch`, torchrun or mpirun (alone it is a single rank). Restarted by the
// launcher after a failure, it resumes from the latest complete checkpoint and finishes the same
// number of optimizer steps.
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/errors.h"
#include "examples/ddp_resnet/cifar10.h"
#include "examples/ddp_resnet/data.h"
#include "examples/ddp_resnet/options.h"
#include "examples/ddp_resnet/progress.h"
#include "examples/ddp_resnet/resnet.h"
#include "worker/amp.h"
#include "worker/auto_batch.h"
#include "worker/checkpoint_manager.h"
#include "worker/ddp.h"
#include "worker/error_report.h"
#include "worker/log_bridge.h"
#include "worker/sampler.h"
#include "worker/session.h"

namespace ddpl::example {
namespace {

namespace dw = ddpl::worker;

constexpr double kPi = 3.14159265358979323846;

// The schedule in optimizer steps, fixed by the options, the training-set size and the world
// size: a resumed run recomputes the same plan and so finishes the same number of steps.
struct Plan {
  int64_t samples_per_rank = 0;  // DistributedSampler pads to an equal share
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t warmup_steps = 0;
  int64_t global_batch = 0;  // images per optimizer step, all ranks
  int64_t log_every = 1;
};

Plan makePlan(const Options& o, int64_t train_size, int world_size) {
  Plan p;
  p.samples_per_rank = (train_size + world_size - 1) / world_size;
  const int64_t microBatches = p.samples_per_rank / o.batch_size;
  if (microBatches == 0) {
    throw UsageError("--batch-size: " + std::to_string(o.batch_size) +
                     " is more than each rank's share of the " + std::to_string(train_size) +
                     " training images (" + std::to_string(p.samples_per_rank) + " on each of " +
                     std::to_string(world_size) + " ranks)");
  }
  p.steps_per_epoch = microBatches / o.accumulation;
  if (p.steps_per_epoch == 0) {
    throw UsageError("--accumulation: " + std::to_string(o.accumulation) +
                     " micro-batches per step, but an epoch has only " +
                     std::to_string(microBatches) + " per rank");
  }
  p.total_steps = p.steps_per_epoch * o.epochs;
  p.warmup_steps = std::min<int64_t>(
      p.total_steps, std::llround(o.warmup_epochs * static_cast<double>(p.steps_per_epoch)));
  p.global_batch = static_cast<int64_t>(o.batch_size) * o.accumulation * world_size;
  p.log_every = o.log_every > 0 ? o.log_every : std::max<int64_t>(1, p.steps_per_epoch / 10);
  return p;
}

// Linear warm-up to the peak, then cosine decay to --min-lr. step: 0-based index of the step.
double learningRate(const Options& o, const Plan& p, int64_t step) {
  if (step < p.warmup_steps)
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(p.warmup_steps);
  const double decaySteps =
      static_cast<double>(std::max<int64_t>(1, p.total_steps - p.warmup_steps));
  const double t = std::min(1.0, static_cast<double>(step - p.warmup_steps) / decaySteps);
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(kPi * t));
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9E3779B97F4A7C15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

at::Tensor allReduce(dw::Session& session, at::Tensor t, c10d::ReduceOp op = c10d::ReduceOp::SUM) {
  std::vector<at::Tensor> tensors{std::move(t)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  opts.timeout = session.options().collective_timeout;
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
  const int64_t evalBatch = 2 * static_cast<int64_t>(o.batch_size);
  for (int64_t start = 0; start < indices.size(0); start += evalBatch) {
    const auto idx = indices.narrow(0, start, std::min(evalBatch, indices.size(0) - start));
    const Batch batch = makeBatch(data, data.test, idx, o.channels_last, nullptr);
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

// FNV-1a over every parameter's bytes: two runs that end with identical weights print the same
// digest (the --auto-batch equivalence test compares them).
std::string parameterDigest(torch::nn::Module& model) {
  uint64_t h = 1469598103934665603ULL;
  for (const auto& p : model.parameters()) {
    const auto cpu = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(cpu.data_ptr());
    for (size_t i = 0, n = cpu.numel() * cpu.element_size(); i < n; ++i) {
      h = (h ^ bytes[i]) * 1099511628211ULL;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// What the cleanup hook reports if training is cut short (signal, exception): it runs on the
// session's signal thread while training goes on, so only atomics and the thread-safe
// CheckpointManager::latest() are shared.
struct RunState {
  std::atomic<int64_t> step{0};
  std::atomic<bool> finished{false};
};

// Where an epoch's figures go.
struct EpochResult {
  double train_loss = 0;
  std::optional<Evaluation> test;
  double seconds = 0;
};

// One training run, in the order a reader follows it: the constructor sets up (session, data,
// model, optimizer, checkpoints), resume() picks up where an earlier start left off, runEpoch()
// trains and evaluates one epoch, summarize() reports. Users' own programs take the same shape.
class Training {
 public:
  Training(const Options& o, const dw::SessionOptions& sessionOptions,
           const std::optional<Cifar10>& cifar)
      : o_(o),
        session_options_(sessionOptions),
        session_(sessionOptions, {[&o](dw::Session&) { applySwitches(o); }}),
        rank_(session_.rank()),
        world_(session_.worldSize()),
        device_(session_.device()),
        plan_(makePlan(o, cifar ? cifar->train.count : o.train_size, world_)),
        progress_(std::make_shared<ProgressReporter>(o.progress, rank_ == 0, plan_.log_every)),
        checkpoints_(std::make_shared<dw::CheckpointManager>(
            session_, dw::CheckpointPolicy{o.checkpoint_dir, o.keep_checkpoints, o.resume})) {
    addStopReport();
    loadData(cifar);
    buildModel();
    announce();
  }

  // Every rank continues from the same step (the library checks), inside its epoch.
  void resume() {
    const dw::ResumePoint point = checkpoints_->resume(refs_);
    for (const auto& skipped : point.skipped_truncated) {
      progress_->line("skipping checkpoint " + skipped +
                      (point.path.empty() ? "; no complete checkpoint left: starting at step 0"
                                          : "; resuming from the newest complete one instead"));
    }
    if (point.removed_stale > 0) {
      progress_->line("starting afresh: removed " + std::to_string(point.removed_stale) +
                      " checkpoint(s) of an earlier run from " + checkpoints_->directory().dir() +
                      " (--resume continues from them instead)");
    }
    const std::string why =
        point.reason == dw::ResumeReason::kResumeFlag ? "--resume" : point.reason_text;
    start_step_ = point.progress.step;
    resumed_from_ = point.path;
    if (start_step_ > 0 && point.progress.samples_seen != start_step_ * plan_.global_batch) {
      // World size or batch changed (an elastic resize): the data order within an epoch
      // depends on both, so pick up at the start of the interrupted epoch.
      progress_->line("global batch changed since the checkpoint (" +
                      std::to_string(point.progress.samples_seen / start_step_) + " -> " +
                      std::to_string(plan_.global_batch) + "): continuing at the start of epoch " +
                      std::to_string(point.progress.epoch + 1));
      start_step_ = std::min<int64_t>(point.progress.epoch, o_.epochs) * plan_.steps_per_epoch;
    }
    start_step_ = std::min(start_step_, plan_.total_steps);
    if (!resumed_from_.empty()) {
      progress_->line("resumed from step " + std::to_string(point.progress.step) + " (" +
                      point.source + ": " + resumed_from_ + "), continuing at step " +
                      std::to_string(start_step_) + "/" + std::to_string(plan_.total_steps) + " (" +
                      why + ")");
    }
    step_ = start_step_;
    state_->step = step_;
    startTraining();
  }

  bool done() const { return step_ >= plan_.total_steps; }
  int64_t epoch() const { return step_ / plan_.steps_per_epoch; }

  EpochResult runEpoch() {
    const int64_t epoch = this->epoch();
    const auto epochStart = std::chrono::steady_clock::now();
    sampler_->setEpoch(epoch);
    const auto indices = torch::tensor(sampler_->indices(), torch::kLong).to(device_);
    model_->train();
    const auto floatOnDevice = torch::TensorOptions().dtype(torch::kFloat).device(device_);
    epoch_loss_ = torch::zeros({}, floatOnDevice);
    window_loss_ = torch::zeros({}, floatOnDevice);
    epoch_steps_ = window_steps_ = 0;

    for (int64_t s = step_ - epoch * plan_.steps_per_epoch; s < plan_.steps_per_epoch; ++s) {
      trainStep(epoch, s, indices);
      reportProgress(epoch, s, epochStart);
      if (s + 1 < plan_.steps_per_epoch) {
        if (o_.checkpoint_every > 0 && step_ % o_.checkpoint_every == 0)
          save(epoch);
        else if (checkpoints_->inMemory() && o_.memory_checkpoint_every > 0 &&
                 step_ % o_.memory_checkpoint_every == 0)
          save(epoch, /*durable=*/false);
      }
    }
    train_seconds_ += secondsSince(epochStart);

    EpochResult result;
    auto lossStats =
        allReduce(session_,
                  torch::stack({epoch_loss_,
                                torch::full({}, static_cast<float>(epoch_steps_), floatOnDevice)}))
            .cpu();
    result.train_loss = lossStats[0].item<double>() / std::max(1.0, lossStats[1].item<double>());
    if ((epoch + 1) % o_.eval_every == 0 || epoch + 1 == o_.epochs) {
      result.test = evaluate(session_, *model_, data_, o_);
      last_ = *result.test;
    }
    save(epoch + 1);
    result.seconds = secondsSince(epochStart);
    logEpoch(epoch, result);
    return result;
  }

  int summarize() {
    if (last_.images == 0) last_ = evaluate(session_, *model_, data_, o_);  // resumed at the end
    state_->finished = true;
    const double wall = secondsSince(run_start_);
    const int64_t stepsRun = step_ - start_step_;
    const double throughput =
        static_cast<double>(stepsRun * plan_.global_batch) / std::max(train_seconds_, 1e-9);
    std::string checkpoint = checkpoints_->latestDurable();
    progress_->line(
        "finished: " + std::to_string(step_) + "/" + std::to_string(plan_.total_steps) + " steps" +
        (start_step_ > 0 ? " (" + std::to_string(stepsRun) + " in this run, resumed at " +
                               std::to_string(start_step_) + ")"
                         : "") +
        " in " + formatDuration(wall) + " on " + std::to_string(world_) + " rank" +
        (world_ > 1 ? "s" : "") + ", " + fixed(throughput, 0) + " images/s");
    progress_->line("final test top-1: " + percent(last_.top1) + " on " +
                    std::to_string(last_.images) + " images (chance " +
                    percent(1.0 / static_cast<double>(data_.classes)) + ")");
    progress_->line(checkpoint.empty() ? "checkpoint: none (--checkpoint-dir '')"
                                       : "checkpoint: " + checkpoint);
    const std::string digest = parameterDigest(*model_);  // every rank: it reads no collective
    if (rank_ == 0 && !o_.summary_json.empty()) {
      const auto& micro = auto_batch_->current();
      nlohmann::json summary{{"model", toString(o_.model)},
                             {"world_size", world_},
                             {"backend", dw::toString(session_.backendKind())},
                             {"device", device_.str()},
                             {"epochs", o_.epochs},
                             {"steps_per_epoch", plan_.steps_per_epoch},
                             {"total_steps", plan_.total_steps},
                             {"final_step", step_},
                             {"start_step", start_step_},
                             {"steps_this_run", stepsRun},
                             {"resumed_from", resumed_from_},
                             {"restart_count", session_options_.restart_count},
                             {"global_batch", plan_.global_batch},
                             {"micro_batch", micro.micro_batch},
                             {"accumulation", micro.accumulation},
                             {"oom_switches", auto_batch_->switches()},
                             {"final_top1", last_.top1},
                             {"final_test_loss", last_.loss},
                             {"test_images", last_.images},
                             {"classes", data_.classes},
                             {"epoch_log", epoch_log_},
                             {"seconds", wall},
                             {"images_per_second", throughput},
                             {"checkpoint", checkpoint},
                             {"parameter_digest", digest}};
      // What the run really trained with, read back from torch rather than from the flags:
      // the GPU checks (tests/gpu/run_gpu_checks.sh) judge the switches by these.
      const auto& context = at::globalContext();
      summary["amp"] = toString(o_.amp);
      summary["channels_last"] = o_.channels_last;
      summary["cudnn_benchmark"] = context.benchmarkCuDNN();
      summary["tf32_cudnn"] = context.allowTF32CuDNN();
      summary["tf32_matmul"] =
          context.float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST;
      summary["grad_scale"] = scaler_->enabled() ? nlohmann::json(scaler_->currentScale())
                                                 : nlohmann::json(nullptr);
      std::ofstream(o_.summary_json) << summary.dump(2) << "\n";
    }
    return 0;
  }

 private:
  // Process-wide switches go in before the first kernel runs (a Session setup hook).
  static void applySwitches(const Options& o) {
    if (o.threads > 0) torch::set_num_threads(o.threads);
    dw::PerformanceOptions perf;
    perf.cudnn_benchmark = o.cudnn_benchmark;
    perf.deterministic = o.deterministic;
    if (o.tf32) {
      perf.float32_matmul_precision = "high";
      perf.allow_tf32_cudnn = true;
    }
    dw::applyPerformanceOptions(perf);
  }

  static double secondsSince(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void addStopReport() {
    session_.addCleanupHook(
        "progress", [state = state_, progress = progress_, checkpoints = checkpoints_,
                     total = plan_.total_steps](dw::Session&) {
          if (state->finished) return;
          const std::string checkpoint = checkpoints->latest();
          progress->line("stopped at step " + std::to_string(state->step.load()) + "/" +
                         std::to_string(total) +
                         (checkpoint.empty() ? "; no checkpoint written yet"
                                             : "; latest checkpoint " + checkpoint));
        });
  }

  void loadData(const std::optional<Cifar10>& cifar) {
    torch::manual_seed(o_.seed);
    data_ =
        cifar
            ? fromCifar10(*cifar, o_.augment)
            : makeSynthetic({o_.train_size, o_.test_size, o_.image_size, o_.classes, o_.data_seed});
    moveTo(data_, device_);
  }

  void buildModel() {
    imagenet_stem_ = o_.stem == StemKind::kImageNet ||
                     (o_.stem == StemKind::kAuto && data_.train.images.size(2) >= 128);
    model_ = std::make_shared<ResNetImpl>(
        ResNetConfig{o_.model, o_.width, data_.classes, imagenet_stem_});
    model_->to(device_);
    if (o_.channels_last) {
      torch::NoGradGuard noGrad;
      for (auto& p : model_->parameters()) {
        if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
      }
    }
    optimizer_ =
        std::make_unique<torch::optim::SGD>(model_->parameters(), torch::optim::SGDOptions(o_.lr)
                                                                      .momentum(o_.momentum)
                                                                      .weight_decay(o_.weight_decay)
                                                                      .nesterov(o_.nesterov));
    dw::GradScalerOptions scalerOptions;
    scalerOptions.enabled = o_.amp == AmpMode::kFp16;
    scaler_ = std::make_unique<dw::GradScaler>(scalerOptions, session_.backend());
    refs_ = {model_.get(), optimizer_.get(), scalerOptions.enabled ? scaler_.get() : nullptr,
             &saved_};
  }

  void announce() {
    progress_->line("ddp_resnet: " + toString(o_.model) + " (width " + std::to_string(o_.width) +
                    ", " + fixed(static_cast<double>(countParameters(*model_)) / 1e6, 2) +
                    "M parameters, " + (imagenet_stem_ ? "ImageNet" : "CIFAR") + " stem) on " +
                    std::to_string(world_) + " rank" + (world_ > 1 ? "s" : "") + ", " +
                    device_.str() + "/" + dw::toString(session_.backendKind()) +
                    (o_.amp != AmpMode::kOff ? ", amp " + toString(o_.amp) : "") +
                    (o_.channels_last ? ", channels-last" : ""));
    progress_->line("data: " + data_.description);
    progress_->line(
        "plan: " + std::to_string(o_.epochs) + " epochs x " +
        std::to_string(plan_.steps_per_epoch) + " steps, global batch " +
        std::to_string(plan_.global_batch) + " (" + std::to_string(o_.batch_size) + " per rank" +
        (o_.accumulation > 1 ? " x " + std::to_string(o_.accumulation) + " accumulated" : "") +
        (o_.auto_batch ? ", smaller on running out of memory" : "") + "), lr " + fixed(o_.lr, 4) +
        " with " + std::to_string(plan_.warmup_steps) + " warm-up steps then cosine decay" +
        (checkpoints_->enabled() ? "; checkpoints in " + checkpoints_->directory().dir()
                                 : "; no checkpoints"));
  }

  // After resume: DDP broadcasts rank 0's (resumed) weights as it starts.
  void startTraining() {
    dw::DdpOptions ddpOptions;
    ddpOptions.bucket_bytes = static_cast<size_t>(o_.bucket_mb * 1024 * 1024);
    ddpOptions.comm_hook = o_.comm_hook == CommHookKind::kFp16   ? dw::CommHook::kFp16Compress
                           : o_.comm_hook == CommHookKind::kBf16 ? dw::CommHook::kBf16Compress
                                                                 : dw::CommHook::kNone;
    ddpOptions.timeout = session_options_.collective_timeout;
    ddp_ = std::make_unique<dw::DistributedDataParallel<ResNetImpl>>(model_, session_.backend(),
                                                                     ddpOptions);
    sampler_ = std::make_unique<dw::DistributedSampler>(
        data_.train.size(), rank_, world_,
        dw::SamplerOptions{/*shuffle=*/true, o_.seed, /*drop_last=*/false});
    if (sampler_->numSamples() != plan_.samples_per_rank) {
      throw ddpl::Error("sampler gives " + std::to_string(sampler_->numSamples()) +
                        " images per rank, plan expected " +
                        std::to_string(plan_.samples_per_rank));
    }
    dw::AutoBatchOptions autoOptions;
    autoOptions.enabled = o_.auto_batch;
    autoOptions.inject = {o_.inject_oom.step, o_.inject_oom.rank, -1, o_.inject_oom.in_backward};
    auto_batch_ = std::make_unique<dw::AutoBatch>(
        session_, *ddp_, dw::MicroBatching{o_.batch_size, o_.accumulation}, autoOptions);
    run_start_ = std::chrono::steady_clock::now();
  }

  // One optimizer step: the micro-batches (run again, smaller, if a rank ran out of memory),
  // then the optimizer. Losses count only once the step has gone through.
  void trainStep(int64_t epoch, int64_t s, const at::Tensor& indices) {
    const double lr = learningRate(o_, plan_, step_);
    for (auto& group : optimizer_->param_groups())
      static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
    last_lr_ = lr;
    const auto amp = ampType(o_.amp);
    at::Tensor stepLoss;
    int64_t stepMicroBatches = 0;
    do {
      optimizer_->zero_grad();
      stepLoss = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
      stepMicroBatches = 0;
    } while (!auto_batch_->step(step_, [&](int64_t m) {
      const dw::MicroBatching& mb = auto_batch_->current();
      const int64_t micro = s * mb.accumulation + m;
      const uint64_t augmentSeed = mix(mix(o_.seed, static_cast<uint64_t>(epoch)),
                                       static_cast<uint64_t>(micro * world_ + rank_));
      const Batch batch =
          makeBatch(data_, data_.train, indices.narrow(0, micro * mb.micro_batch, mb.micro_batch),
                    o_.channels_last, &augmentSeed);
      at::Tensor loss;
      {
        std::optional<dw::AutocastScope> autocast;
        if (amp) autocast.emplace(device_.type(), amp);
        loss = torch::nn::functional::cross_entropy(ddp_->forward(batch.images), batch.labels);
      }
      stepLoss += loss.detach().to(torch::kFloat) * static_cast<float>(mb.micro_batch);
      stepMicroBatches += mb.micro_batch;
      scaler_->scale(loss / mb.accumulation).backward();
    }));
    scaler_->step(*optimizer_);
    scaler_->update();
    state_->step = ++step_;
    // Per-image mean, so that the figures do not depend on how the step was split.
    const auto perBatch = stepLoss / static_cast<float>(stepMicroBatches);
    epoch_loss_ += perBatch;
    window_loss_ += perBatch;
    ++epoch_steps_;
    ++window_steps_;
  }

  void reportProgress(int64_t epoch, int64_t s, std::chrono::steady_clock::time_point epochStart) {
    if (!progress_->wantsUpdate(s + 1, plan_.steps_per_epoch)) return;
    const double elapsed = train_seconds_ + secondsSince(epochStart);
    const double stepsDone = static_cast<double>(step_ - start_step_);
    StepStats stats;
    stats.epoch = static_cast<int>(epoch + 1);
    stats.epochs = o_.epochs;
    stats.step_in_epoch = s + 1;
    stats.steps_per_epoch = plan_.steps_per_epoch;
    stats.loss = window_loss_.item<double>() / static_cast<double>(window_steps_);
    stats.lr = last_lr_;
    stats.images_per_second =
        stepsDone * static_cast<double>(plan_.global_batch) / std::max(elapsed, 1e-9);
    stats.eta_seconds =
        static_cast<double>(plan_.total_steps - step_) * elapsed / std::max(stepsDone, 1.0);
    progress_->update(stats);
    window_loss_.zero_();
    window_steps_ = 0;
  }

  void save(int64_t epoch, bool durable = true) {
    if (!checkpoints_->enabled()) return;
    // The library logs a disk write: not onto the end of a progress bar. A memory copy is silent.
    if (!checkpoints_->inMemory()) progress_->finishLine();
    saved_ = {epoch, step_, step_ * plan_.global_batch};
    checkpoints_->save(refs_, durable);
  }

  void logEpoch(int64_t epoch, const EpochResult& r) {
    nlohmann::json entry{{"epoch", epoch + 1}, {"train_loss", r.train_loss}};
    std::string line = "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(o_.epochs) +
                       " done: train loss " + fixed(r.train_loss, 4);
    if (r.test) {
      entry["test_top1"] = r.test->top1;
      entry["test_loss"] = r.test->loss;
      line += ", test loss " + fixed(r.test->loss, 4) + ", top-1 " + percent(r.test->top1) + " (" +
              std::to_string(r.test->images) + " images)";
    }
    progress_->line(line + ", " + formatDuration(r.seconds));
    epoch_log_.push_back(entry);
  }

  const Options& o_;
  const dw::SessionOptions& session_options_;
  std::shared_ptr<RunState> state_ = std::make_shared<RunState>();
  dw::Session session_;
  const int rank_;
  const int world_;
  const c10::Device device_;
  const Plan plan_;
  std::shared_ptr<ProgressReporter> progress_;
  // Shared with the cleanup hook, which the Session runs after this object's later members are
  // gone; latest() touches nothing but its own string.
  std::shared_ptr<dw::CheckpointManager> checkpoints_;

  Dataset data_;
  bool imagenet_stem_ = false;
  std::shared_ptr<ResNetImpl> model_;
  std::unique_ptr<torch::optim::SGD> optimizer_;
  std::unique_ptr<dw::GradScaler> scaler_;
  dw::TrainingProgress saved_;
  dw::CheckpointRefs refs_;

  std::unique_ptr<dw::DistributedDataParallel<ResNetImpl>> ddp_;
  std::unique_ptr<dw::DistributedSampler> sampler_;
  std::unique_ptr<dw::AutoBatch> auto_batch_;

  int64_t start_step_ = 0;
  int64_t step_ = 0;
  std::string resumed_from_;
  double train_seconds_ = 0;
  double last_lr_ = 0;
  at::Tensor epoch_loss_, window_loss_;
  int64_t epoch_steps_ = 0, window_steps_ = 0;
  Evaluation last_;
  std::vector<nlohmann::json> epoch_log_;
  std::chrono::steady_clock::time_point run_start_ = std::chrono::steady_clock::now();
};

int train(const Options& o, const dw::SessionOptions& sessionOptions,
          const std::optional<Cifar10>& cifar) {
  Training training(o, sessionOptions, cifar);
  training.resume();
  while (!training.done()) training.runEpoch();
  return training.summarize();
}

// Errors found before the job starts still reach the launcher's failure report, with the frames
// of their throw: the check that failed, named with its source line.
int inputError(const std::string& error_file, const std::exception& error) {
  std::fprintf(stderr, "ddp_resnet: %s\n", error.what());
  // Naming the frames costs a fork and a look into the debug information (~50 ms of CPU per
  // rank): only for a launcher that reads them.
  if (!error_file.empty())
    dw::writeErrorFile(error_file, dw::describeException(std::current_exception()));
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
    if (!options.data_dir.empty()) cifar = ex::loadCifar10(options.data_dir);
    ex::makePlan(options, cifar ? cifar->train.count : options.train_size,
                 sessionOptions.world_size);
  } catch (const ex::UsageError& e) {
    return ex::inputError(sessionOptions.error_file, e);
  } catch (const ex::DataError& e) {
    return ex::inputError(sessionOptions.error_file, e);
  }
  return dw::recordErrors(sessionOptions.error_file,
                          [&] { return ex::train(options, sessionOptions, cifar); });
}
