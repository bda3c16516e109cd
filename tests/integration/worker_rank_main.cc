// One rank of the worker library's multi-process tests. The drivers (worker_multiproc_test,
// worker_fault_test) start several of these, under plain fork/exec, torchrun or `launch`, and
// judge them by exit status, error files and marker files. Each scenario checks its own claim
// and exits non-zero with a message when it does not hold.
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <thread>

#include "common/checkpoint_files.h"
#include "common/errors.h"
#include "worker/amp.h"
#include "worker/checkpoint_archive.h"
#include "worker/checkpoint_manager.h"
#include "worker/ddp.h"
#include "worker/error_report.h"
#include "worker/session.h"

namespace dw = ddpl::worker;

extern "C" void ddpl_test_call_through_stripped(void (*fn)(void*),
                                                void* arg);  // stripped_frames.cc

// Named frames for the error-file tests (issue 18): functions of this program, which has debug
// information, below one call through a library that has none. The tests find the throw sites
// by their marker comments.
namespace ddpl_test {

__attribute__((noinline)) void throwFromHere(int value) {
  TORCH_CHECK(value < 0, "deliberate check failure with value ", value);  // throw site: throw_named
}

__attribute__((noinline)) void throwInThread(int value) {
  if (value >= 0)
    throw std::runtime_error("deliberate failure in a thread, value " +
                             std::to_string(value));  // throw site: throw_in_thread
}

}  // namespace ddpl_test

namespace {

constexpr int kSteps = 5;
constexpr int kPerRankBatch = 4;

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(bool batchNorm, int64_t width = 16) : use_bn(batchNorm) {
    fc1 = register_module("fc1", torch::nn::Linear(8, width));
    if (use_bn) bn = register_module("bn", torch::nn::BatchNorm1d(width));
    fc2 = register_module("fc2", torch::nn::Linear(width, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = fc1(x);
    if (use_bn) h = bn(h);
    return fc2(torch::relu(h));
  }
  bool use_bn;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

void fail(const std::string& why) { throw std::runtime_error(why); }

// Global batch for a step, identical on every rank; rank r trains on rows [r*b, (r+1)*b).
std::pair<torch::Tensor, torch::Tensor> globalBatch(int step, int micro, int rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step * 17 + micro);
  return {torch::randn({rows, 8}, gen), torch::randn({rows, 3}, gen)};
}

double maxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) fail("tensor count differs");
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, (a[i].to(torch::kDouble) - b[i].to(torch::kDouble)).abs().max().item<double>());
  }
  return worst;
}

std::vector<torch::Tensor> stateOf(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

// N ranks with batch b for K steps == one process with batch N*b (BatchNorm: each replica
// normalises its own shard, as DDP without SyncBatchNorm; the reference does the same per shard
// and keeps rank 0's running statistics, which DDP broadcasts before every forward).
int equivalence(dw::Session& session, bool noSync, bool batchNorm) {
  const int world = session.worldSize();
  const int rank = session.rank();
  const int micro = noSync ? 3 : 1;

  const auto device = session.device();  // cpu for Gloo, cuda:LOCAL_RANK for NCCL (tests/gpu)
  torch::manual_seed(1234 + rank);  // different on purpose: DDP must broadcast rank 0's
  auto model = std::make_shared<MlpImpl>(batchNorm);
  model->to(device);
  dw::DistributedDataParallel<MlpImpl> ddp(model, session.backend());
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  torch::manual_seed(1234);  // rank 0's initial weights
  auto ref = std::make_shared<MlpImpl>(batchNorm);
  ref->to(device);
  torch::optim::SGD refOpt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    refOpt.zero_grad();
    for (int m = 0; m < micro; ++m) {
      auto [xCpu, yCpu] = globalBatch(step, m, world * kPerRankBatch);
      auto x = xCpu.to(device), y = yCpu.to(device);
      auto mine = x.narrow(0, rank * kPerRankBatch, kPerRankBatch);
      auto target = y.narrow(0, rank * kPerRankBatch, kPerRankBatch);
      {
        std::optional<dw::NoSyncGuard> guard;
        if (m + 1 < micro) guard.emplace(ddp.reducer());
        auto loss = torch::mse_loss(ddp.forward(mine), target) / micro;
        loss.backward();
      }
      if (!batchNorm) {
        (torch::mse_loss(ref->forward(x), y) / micro).backward();
      } else {
        std::vector<torch::Tensor> before;
        for (auto& b : ref->buffers()) before.push_back(b.detach().clone());
        std::vector<torch::Tensor> afterRank0;
        // One backward per shard (gradients add up the same): autograd saved the running
        // statistics, so they may only be reset once that shard's backward is done.
        for (int r = 0; r < world; ++r) {
          if (r > 0) {
            torch::NoGradGuard ng;
            auto bufs = ref->buffers();
            for (size_t i = 0; i < bufs.size(); ++i) bufs[i].copy_(before[i]);
          }
          auto part = torch::mse_loss(ref->forward(x.narrow(0, r * kPerRankBatch, kPerRankBatch)),
                                      y.narrow(0, r * kPerRankBatch, kPerRankBatch));
          (part / world / micro).backward();
          if (r == 0) for (auto& b : ref->buffers()) afterRank0.push_back(b.detach().clone());
        }
        torch::NoGradGuard ng;
        auto bufs = ref->buffers();
        for (size_t i = 0; i < bufs.size(); ++i) bufs[i].copy_(afterRank0[i]);
      }
    }
    opt.step();
    refOpt.step();
  }
  ddp.reducer().beforeForward();  // buffers: every rank now holds rank 0's
  const double diff = maxDiff(stateOf(*model), stateOf(*ref));
  std::cout << "rank " << rank << " max |ddp - reference| = " << diff << std::endl;
  if (!(diff < 1e-5)) fail("DDP diverged from the single-process reference: " + std::to_string(diff));
  // The reference must actually have moved, or the comparison proves nothing.
  torch::manual_seed(1234);
  auto initial = std::make_shared<MlpImpl>(batchNorm);
  initial->to(device);
  if (maxDiff(stateOf(*initial), stateOf(*ref)) < 1e-3) fail("training did not change the parameters");
  return 0;
}

// BatchNorm whose forward remembers the buffers it started from.
struct SnoopingBnImpl : torch::nn::Module {
  SnoopingBnImpl() {
    fc = register_module("fc", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    seen = stateOfBuffers();
    return bn(fc(x));
  }
  std::vector<torch::Tensor> stateOfBuffers() {
    std::vector<torch::Tensor> out;
    for (auto& b : buffers()) out.push_back(b.detach().clone());
    return out;
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  std::vector<torch::Tensor> seen;
};

// Every forward through DDP starts from rank 0's buffers (float statistics and the int64
// batch counter alike), whether they travel overlapped with backward or before the forward.
int buffers(dw::Session& session, const std::string& mode) {
  const int rank = session.rank();
  dw::DdpOptions options;
  options.overlap_buffer_broadcast = mode == "overlap";
  torch::manual_seed(5);
  auto model = std::make_shared<SnoopingBnImpl>();
  dw::DistributedDataParallel<SnoopingBnImpl> ddp(model, session.backend(), options);
  auto rank0s = [&](std::vector<torch::Tensor> mine) {
    for (auto& t : mine) {
      std::vector<torch::Tensor> one{t};
      c10d::BroadcastOptions o;
      o.rootRank = 0;
      session.backend()->broadcast(one, o)->wait();
    }
    return mine;
  };
  for (int step = 0; step < 4; ++step) {
    // Each rank its own data, so that local statistics differ.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * rank + step);
    auto x = torch::randn({8, 8}, gen) * (1 + rank);
    ddp.forward(x).pow(2).sum().backward();
    const double atForward = maxDiff(model->seen, rank0s(model->seen));
    const int64_t counter = model->seen.back().item<int64_t>();  // num_batches_tracked
    const double afterForward = maxDiff(model->stateOfBuffers(), rank0s(model->stateOfBuffers()));
    std::cout << mode << " step " << step << ": buffers at forward differ from rank 0's by " << atForward
              << ", after it by " << afterForward << ", batch counter " << counter << std::endl;
    if (atForward != 0) fail("forward " + std::to_string(step) + " did not start from rank 0's buffers");
    if (counter != step) fail("num_batches_tracked at forward " + std::to_string(step) + " is " + std::to_string(counter));
    if (rank != 0 && afterForward == 0) fail("local statistics never differed: the test proves nothing");
  }
  return 0;
}

// The first bucket's all-reduce is issued while other gradients are still being computed.
int overlap(dw::Session& session) {
  torch::manual_seed(7);
  auto seq = torch::nn::Sequential();
  for (int i = 0; i < 8; ++i) {
    seq->push_back(torch::nn::Linear(256, 256));
    seq->push_back(torch::nn::Tanh());
  }
  auto module = seq.ptr();
  module->to(session.device());
  dw::DdpOptions options;
  options.first_bucket_bytes = 300 * 1024;  // one Linear(256,256) per bucket
  options.bucket_bytes = 300 * 1024;
  dw::DistributedDataParallel<torch::nn::SequentialImpl> ddp(module, session.backend(), options);
  if (ddp.reducer().bucketLayout().size() != 8) fail("expected 8 buckets");
  if (ddp.reducer().bucketLayout()[0][0] != "14.bias") fail("bucket 0 must hold the last layer, got " + ddp.reducer().bucketLayout()[0][0]);
  for (int it = 0; it < 3; ++it) {
    auto x = torch::randn({64, 256}, torch::TensorOptions().device(session.device()));
    ddp.forward(x).pow(2).sum().backward();
    const auto trace = ddp.reducer().lastIteration();
    const auto& first = trace.buckets.at(0);
    std::cout << "iteration " << it << ": bucket 0 launched at " << first.launched_us << "us with "
              << first.grads_ready_at_launch << "/" << trace.num_grads
              << " gradients ready; last gradient at " << trace.last_grad_ready_us << "us, done at "
              << trace.finished_us << "us" << std::endl;
    if (first.grads_ready_at_launch >= trace.num_grads)
      fail("bucket 0 launched only after every gradient was ready");
    if (!(first.launched_us < trace.last_grad_ready_us))
      fail("bucket 0 launched after backward produced its last gradient");
    for (auto& p : module->parameters()) p.mutable_grad().reset();
  }
  return 0;
}

// With default options a model under 2 MiB of gradients still gets two buckets, the first
// launched while backward runs; a tiny one stays in one.
int smallModelSplit(dw::Session& session) {
  torch::manual_seed(7);
  auto seq = torch::nn::Sequential();
  for (int i = 0; i < 8; ++i) {
    seq->push_back(torch::nn::Linear(64, 64));  // 16.6 KB of gradients each: 133 KB in all
    seq->push_back(torch::nn::Tanh());
  }
  dw::DistributedDataParallel<torch::nn::SequentialImpl> ddp(seq.ptr(), session.backend());
  const auto layout = ddp.reducer().bucketLayout();
  if (layout.size() != 2) fail("expected 2 buckets for 133 KB of gradients, got " + std::to_string(layout.size()));
  if (layout[0].size() != 8) fail("bucket 0 should hold the last 4 layers' 8 tensors, holds " + std::to_string(layout[0].size()));
  for (int it = 0; it < 3; ++it) {
    ddp.forward(torch::randn({32, 64})).pow(2).sum().backward();
    const auto trace = ddp.reducer().lastIteration();
    if (trace.buckets.at(0).grads_ready_at_launch >= trace.num_grads)
      fail("bucket 0 launched only after every gradient was ready");
  }
  auto tiny = torch::nn::Sequential(torch::nn::Linear(8, 4));
  dw::DistributedDataParallel<torch::nn::SequentialImpl> tinyDdp(tiny.ptr(), session.backend());
  if (tinyDdp.reducer().bucketLayout().size() != 1) fail("a 144-byte model should stay in one bucket");
  return 0;
}

int shapeMismatch(dw::Session& session) {
  auto model = torch::nn::Sequential(torch::nn::Linear(8, session.rank() == 1 ? 5 : 4));
  dw::DistributedDataParallel<torch::nn::SequentialImpl> ddp(model.ptr(), session.backend());
  return 0;  // not reached when shapes differ
}

int throwAfterSetup(dw::Session& session, const std::string& marker) {
  session.addCleanupHook("marker", [marker](dw::Session&) { std::ofstream(marker) << "cleanup ran\n"; });
  session.barrier();
  throw ddpl::InvalidArgument("deliberate failure on rank " + std::to_string(session.rank()));
}

int waitForSignal(dw::Session& session, const std::string& marker) {
  session.addCleanupHook("marker", [marker](dw::Session& s) {
    std::ofstream(marker + "." + std::to_string(s.rank())) << "cleanup ran\n";
  });
  std::ofstream(marker + ".ready." + std::to_string(session.rank())) << "ready\n";
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 5;  // the signal should have ended us long before
}

struct BigImpl : torch::nn::Module {
  BigImpl() { w = register_parameter("w", torch::zeros({32 << 20})); }  // 128 MiB
  torch::Tensor w;
};

int checkpointWriter(const std::string& path) {
  auto model = std::make_shared<BigImpl>();
  dw::TrainingProgress progress;
  {
    torch::NoGradGuard ng;
    model->w.fill_(1.0);
  }
  progress.step = 1;
  dw::saveCheckpoint(path, {model.get(), nullptr, nullptr, &progress});
  std::ofstream(path + ".first-done") << "1\n";
  {
    torch::NoGradGuard ng;
    model->w.fill_(2.0);
  }
  progress.step = 2;
  for (;;) dw::saveCheckpoint(path, {model.get(), nullptr, nullptr, &progress});  // until killed
}

int checkpointVerify(const std::string& path) {
  auto model = std::make_shared<BigImpl>();
  dw::TrainingProgress progress;
  if (!dw::loadCheckpoint(path, {model.get(), nullptr, nullptr, &progress})) fail("no checkpoint at " + path);
  const double lo = model->w.min().item<double>(), hi = model->w.max().item<double>();
  std::cout << "loaded step " << progress.step << " values [" << lo << ", " << hi << "]" << std::endl;
  if (lo != hi || static_cast<int64_t>(lo) != progress.step) fail("checkpoint content does not match its progress");
  return progress.step == 1 ? 0 : 4;  // 4: the second write had completed (test retries)
}

// Blocks for good in the program's own code, as a stuck data loader would (launch's hang test
// looks for this name in the rank's native stack).
[[noreturn]] __attribute__((noinline)) void blockInUserCode() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// DDP steps on every rank; at step 3 rank `hangRank` blocks in blockInUserCode() and the others
// wait for it inside the all-reduce of their backward.
int hang(dw::Session& session, const std::string& hangRank) {
  const int rank = session.options().rank;
  auto model = std::make_shared<MlpImpl>(false);
  dw::DistributedDataParallel<MlpImpl> ddp(model, session.backend());
  for (int step = 1; step <= 1000; ++step) {
    if (step == 3 && std::to_string(rank) == hangRank) blockInUserCode();
    auto x = torch::randn({4, 8});
    ddp.forward(x).sum().backward();
  }
  return 0;
}

// Five DDP steps, then a cleanup hook that takes `seconds` (a final save, say): the teardown
// after the last step, which launch must not take for a hang (worker/heartbeat.h: finished()).
int slowTeardown(dw::Session& session, const std::string& seconds) {
  auto model = std::make_shared<MlpImpl>(false);
  dw::DistributedDataParallel<MlpImpl> ddp(model, session.backend());
  for (int step = 1; step <= 5; ++step) ddp.forward(torch::randn({4, 8})).sum().backward();
  const double wait = std::stod(seconds.empty() ? "4" : seconds);
  session.addCleanupHook("slow final save", [wait](dw::Session&) {
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  });
  std::printf("rank %d stepped 5 times, tearing down for %.1fs\n", session.options().rank, wait);
  std::fflush(stdout);
  return 0;
}

// DDP steps where rank `slowRank` spends 30 ms more of its own per step (the others wait for
// it inside the all-reduce): launch must name it, and no other rank, as a straggler.
int straggler(dw::Session& session, const std::string& slowRank) {
  const int rank = session.options().rank;
  auto model = std::make_shared<MlpImpl>(false);
  dw::DistributedDataParallel<MlpImpl> ddp(model, session.backend());
  for (int step = 1; step <= 40; ++step) {
    if (std::to_string(rank) == slowRank) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    auto x = torch::randn({4, 8});
    ddp.forward(x).sum().backward();
  }
  return 0;
}

// A TORCH_CHECK failure in ddpl_test::throwFromHere(int), called through the stripped library.
int throwNamed() {
  int value = 7;
  ddpl_test_call_through_stripped([](void* p) { ddpl_test::throwFromHere(*static_cast<int*>(p)); },
                                  &value);
  return 0;
}

// A std::exception escaping a thread: nothing catches it, the terminate handler reports it.
int throwInThread() {
  std::thread thread([] { ddpl_test::throwInThread(7); });
  thread.join();
  return 0;
}

// The GradScaler on `device` (cpu, cuda) over a pattern of steps ('i': the gradient is inf,
// else finite), in fp16 on CUDA as mixed precision trains: prints per step whether the
// optimizer stepped, the scale and the parameter, as JSON, for tests/gpu/run_gpu_checks.sh to
// compare with torch.amp.GradScaler's on the same inputs (tests/unit/worker_reference.py).
int scalerSequence(const std::string& pattern, const std::string& device_name) {
  const torch::Device device(device_name);
  auto p = torch::zeros({3}, torch::TensorOptions().device(device)).requires_grad_(true);
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(1.0));
  dw::GradScalerOptions options;
  options.init_scale = 1024.0;
  options.growth_interval = 2;
  dw::GradScaler scaler(options);
  std::string out = "[";
  for (size_t i = 0; i < pattern.size(); ++i) {
    opt.zero_grad();
    auto half = device.is_cuda() ? at::kHalf : at::kFloat;
    auto factor = torch::full({3}, pattern[i] == 'i' ? std::numeric_limits<float>::infinity() : 1.0f,
                              torch::TensorOptions().device(device).dtype(half));
    auto loss = (p.to(half) * factor).sum().to(at::kFloat);
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    out += (i ? "," : "") + std::string("{\"stepped\":") + (stepped ? "true" : "false") +
           ",\"scale\":" + std::to_string(scaler.currentScale()) +
           ",\"param\":" + std::to_string(p[0].item<float>()) + "}";
  }
  std::printf("%s]\n", out.c_str());
  return 0;
}

// Two files of ckpt_train's final parameters: 0 when every tensor is bit for bit the same.
int sameTensors(const std::string& a, const std::string& b) {
  std::vector<torch::Tensor> x, y;
  torch::load(x, a);
  torch::load(y, b);
  if (x.size() != y.size()) fail("tensor counts differ: " + a + " vs " + b);
  for (size_t i = 0; i < x.size(); ++i)
    if (!torch::equal(x[i], y[i]))
      fail("parameter " + std::to_string(i) + " differs: max difference " +
           std::to_string((x[i] - y[i]).abs().max().item<double>()));
  std::printf("same\n");
  return 0;
}

// Training with checkpoints through CheckpointManager (in launch's memory when launch gives
// it), killed once on the first attempt: `arg` is comma-separated key=value: steps, every (a
// checkpoint every N steps), durable (every Nth of them reaches the disk), dir, out (rank 0
// saves the final parameters there), kill=STEP:RANK:step|checkpoint (SIGKILL in the middle of
// that step's backward-to-update, or halfway through writing that step's checkpoint in memory;
// RANK -1: every rank), linger_ms (each rank waits that long after its last step, so that
// launch's periodic views see the checkpoints it holds however fast the steps were).
// Data depend on the step only, so a resumed run must end with a never-failed run's weights.
int checkpointedTraining(dw::Session& session, const std::string& arg) {
  std::map<std::string, std::string> kv;
  for (size_t start = 0; start < arg.size();) {
    size_t end = arg.find(',', start);
    if (end == std::string::npos) end = arg.size();
    std::string item = arg.substr(start, end - start);
    auto eq = item.find('=');
    if (eq != std::string::npos) kv[item.substr(0, eq)] = item.substr(eq + 1);
    start = end + 1;
  }
  const int steps = std::stoi(kv.at("steps")), every = std::stoi(kv.at("every"));
  const int durable = kv.count("durable") ? std::stoi(kv["durable"]) : 1;
  int killStep = -1, killRank = -1;
  std::string killWhere;
  if (kv.count("kill")) {
    const std::string k = kv["kill"];
    killStep = std::stoi(k.substr(0, k.find(':')));
    killRank = std::stoi(k.substr(k.find(':') + 1));
    killWhere = k.substr(k.rfind(':') + 1);
  }
  const bool killHere =
      session.options().restart_count == 0 && (killRank < 0 || session.rank() == killRank);
  const int rank = session.rank(), world = session.worldSize();

  torch::manual_seed(77);
  auto model = std::make_shared<MlpImpl>(false, 32);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  dw::TrainingProgress progress;
  dw::CheckpointRefs refs{model.get(), &opt, nullptr, &progress};
  dw::CheckpointManager ckpts(session, dw::CheckpointPolicy{kv.at("dir"), 2, false});
  const dw::ResumePoint point = ckpts.resume(refs);
  // After the load, as ddp_resnet does: the wrapper hooks the parameters it is given.
  dw::DistributedDataParallel<MlpImpl> ddp(model, session.backend());
  if (!point.path.empty())
    std::printf("rank %d resumed from step %lld (%s)\n", rank,
                static_cast<long long>(point.progress.step), point.source.c_str());
  else
    std::printf("rank %d fresh start\n", rank);
  std::fflush(stdout);
  for (int step = static_cast<int>(point.progress.step); step < steps; ++step) {
    opt.zero_grad();
    auto [x, y] = globalBatch(step, 0, world * kPerRankBatch);
    auto loss = torch::mse_loss(ddp.forward(x.narrow(0, rank * kPerRankBatch, kPerRankBatch)),
                                y.narrow(0, rank * kPerRankBatch, kPerRankBatch));
    loss.backward();
    if (killHere && step == killStep && killWhere == "step") ::kill(::getpid(), SIGKILL);
    opt.step();
    progress.step = step + 1;
    if (progress.step % every != 0) continue;
    if (killHere && step + 1 == killStep && killWhere == "checkpoint" && ckpts.inMemory()) {
      // Half of this step's checkpoint written into launch's memory, then the crash.
      std::string rankDir = ddpl::ckpt::makeRankDir(session.options().checkpoint_memory, rank);
      std::string partial = ddpl::ckpt::beginStep(rankDir, progress.step);
      std::ofstream(partial + "/half.pt") << std::string(4096, 'x');
      ::kill(::getpid(), SIGKILL);
    }
    ckpts.save(refs, (progress.step / every) % durable == 0);
  }
  if (rank == 0 && kv.count("out")) {
    std::vector<torch::Tensor> params;
    for (auto& p : model->parameters()) params.push_back(p.detach().clone());
    torch::save(params, kv["out"]);
  }
  if (kv.count("linger_ms"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(kv["linger_ms"])));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  const std::string arg = argc > 2 ? argv[2] : "";
  // The library never reads the environment on its own: main does, once.
  dw::SessionOptions options = dw::SessionOptions::fromEnvironment();
  options.collective_timeout = std::chrono::seconds(60);
  options.store_timeout = std::chrono::seconds(60);
  return dw::recordErrors(options.error_file, [&]() -> int {
    if (scenario == "checkpoint_write") return checkpointWriter(arg);
    if (scenario == "checkpoint_verify") return checkpointVerify(arg);
    if (scenario == "throw_named") return throwNamed();
    if (scenario == "throw_in_thread") return throwInThread();
    if (scenario == "scaler") return scalerSequence(arg, argc > 3 ? argv[3] : "cpu");
    if (scenario == "ckpt_equal") return sameTensors(arg, argc > 3 ? argv[3] : "");
    dw::Session session(options);
    if (scenario == "equivalence") return equivalence(session, false, false);
    if (scenario == "equivalence_nosync") return equivalence(session, true, false);
    if (scenario == "equivalence_batchnorm") return equivalence(session, false, true);
    if (scenario == "overlap") return overlap(session);
    if (scenario == "buffers") return buffers(session, arg);
    if (scenario == "small_model_split") return smallModelSplit(session);
    if (scenario == "shape_mismatch") return shapeMismatch(session);
    if (scenario == "throw") return throwAfterSetup(session, arg);
    if (scenario == "signal") return waitForSignal(session, arg);
    if (scenario == "hang") return hang(session, arg);
    if (scenario == "straggler") return straggler(session, arg);
    if (scenario == "slow_teardown") return slowTeardown(session, arg);
    if (scenario == "ckpt_train") return checkpointedTraining(session, arg);
    throw ddpl::InvalidArgument("unknown scenario '" + scenario + "'");
  });
}
