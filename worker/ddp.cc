#include "worker/heartbeat.h"
#include "worker/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <chrono>
#include <mutex>
#include <sstream>

#include "common/errors.h"
#include "worker/log_bridge.h"
#include "worker/torch_compat.h"

namespace ddpl::worker {
namespace {

using Clock = std::chrono::steady_clock;

// Below this, one collective's latency outweighs any overlap a second bucket could bring.
constexpr size_t kMinBytesToSplit = size_t{64} << 10;

std::string shapeText(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// Tensors packed byte-wise (each slice 8-byte aligned, so it can be viewed back as its own
// dtype) into one flat uint8 tensor per device: one broadcast carries them all, whatever
// their dtypes.
struct TensorPack {
  at::Tensor flat;
  std::vector<size_t> members;   // indices into the tensor list the pack was built from
  std::vector<int64_t> offsets;  // byte offsets in flat
  c10::intrusive_ptr<c10d::Work> work;  // a broadcast in flight, if any
};

std::vector<TensorPack> packByDevice(const std::vector<at::Tensor>& tensors) {
  std::vector<TensorPack> packs;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto device = tensors[i].device();
    size_t k = 0;
    while (k < packs.size() && packs[k].flat.device() != device) ++k;
    if (k == packs.size()) {
      packs.push_back(TensorPack{at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device)), {}, {}, {}});
      sizes.push_back(0);
    }
    packs[k].members.push_back(i);
    packs[k].offsets.push_back(sizes[k]);
    sizes[k] += (static_cast<int64_t>(tensors[i].numel() * tensors[i].element_size()) + 7) / 8 * 8;
  }
  for (size_t k = 0; k < packs.size(); ++k) packs[k].flat = at::empty({sizes[k]}, packs[k].flat.options());
  return packs;
}

void packIn(TensorPack& pack, const std::vector<at::Tensor>& tensors) {
  torch::NoGradGuard noGrad;
  for (size_t j = 0; j < pack.members.size(); ++j) {
    const auto& t = tensors[pack.members[j]];
    pack.flat.narrow(0, pack.offsets[j], t.numel() * t.element_size())
        .copy_(t.detach().contiguous().view({-1}).view(at::kByte));
  }
}

void unpackInto(const TensorPack& pack, const std::vector<at::Tensor>& tensors) {
  torch::NoGradGuard noGrad;
  for (size_t j = 0; j < pack.members.size(); ++j) {
    auto t = tensors[pack.members[j]];
    t.copy_(pack.flat.narrow(0, pack.offsets[j], t.numel() * t.element_size()).view(t.scalar_type()).view(t.sizes()));
  }
}

void startBroadcast(c10d::Backend& backend, TensorPack& pack, const std::vector<at::Tensor>& tensors,
                    std::chrono::milliseconds timeout) {
  if (backend.getRank() == 0) packIn(pack, tensors);
  std::vector<at::Tensor> flat{pack.flat};
  c10d::BroadcastOptions options;
  options.rootRank = 0;
  options.timeout = timeout;
  pack.work = backend.broadcast(flat, options);
}

// Waits for the broadcast in flight, if any; every rank but the source takes what arrived.
void finishBroadcast(c10d::Backend& backend, TensorPack& pack, const std::vector<at::Tensor>& tensors,
                     std::chrono::milliseconds timeout) {
  if (!pack.work) return;
  auto work = std::move(pack.work);  // leaves pack.work empty: nothing in flight after this
  work->wait(timeout);
  if (backend.getRank() != 0) unpackInto(pack, tensors);
}

}  // namespace

struct DdpReducer::Impl {
  struct Bucket {
    std::vector<size_t> params;       // indices into params
    std::vector<int64_t> offsets;     // element offsets in flat
    at::Tensor flat;                  // averaged gradients live here during the reduction
    at::Tensor wire;                  // what goes over the network (flat, or compressed)
    size_t bytes = 0;
    size_t pending = 0;
    bool launched = false;
    c10::intrusive_ptr<c10d::Work> work;
  };

  std::shared_ptr<torch::nn::Module> module;
  c10::intrusive_ptr<c10d::Backend> backend;
  DdpOptions options;
  int world_size = 1;
  int rank = 0;

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<size_t> bucket_of;
  std::vector<at::Tensor> buffers;
  std::vector<TensorPack> buffer_packs;  // kept: the buffers travel before every forward
  std::vector<Bucket> buckets;
  std::vector<torch_compat::GradAccumulatorPtr> accumulators;
  std::vector<uintptr_t> hook_keys;

  mutable std::mutex mu;
  bool require_sync = true;
  uint64_t forwards_begun = 0;
  uint64_t forwards_ended = 0;
  // Per backward:
  bool in_backward = false;
  std::vector<bool> ready;
  size_t ready_count = 0;
  size_t next_to_launch = 0;
  Clock::time_point start;
  IterationTrace current;
  IterationTrace last;
  // Shared with the hooks, which outlive us inside the autograd graph's accumulators.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);

  void checkShapes();
  void buildBuckets();
  void startBufferBroadcast();
  void finishBufferBroadcast();
  bool syncsBuffers() const;
  void onGradReady(size_t index);
  void beginBackward();
  void launch(Bucket& bucket);
  void launchZeros(Bucket& bucket);
  void finalize();
  double sinceStartUs() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  }
};

void DdpReducer::Impl::checkShapes() {
  // Rank 0's layout, broadcast; every rank compares with its own and the verdict is agreed by
  // an all-reduce, so that all ranks fail together instead of some hanging in a collective.
  auto describe = [this]() {
    std::vector<int64_t> meta{static_cast<int64_t>(params.size()), static_cast<int64_t>(buffers.size())};
    auto add = [&meta](const at::Tensor& t) {
      meta.push_back(t.dim());
      for (auto s : t.sizes()) meta.push_back(s);
      meta.push_back(static_cast<int64_t>(t.scalar_type()));
    };
    for (const auto& p : params) add(p);
    for (const auto& b : buffers) add(b);
    return meta;
  };
  const std::vector<int64_t> mine = describe();
  const auto device = params.empty() ? at::Device(at::kCPU) : params[0].device();
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(device);

  std::vector<at::Tensor> length{at::tensor({static_cast<int64_t>(mine.size())}, i64)};
  c10d::BroadcastOptions bopts;
  bopts.timeout = options.timeout;
  backend->broadcast(length, bopts)->wait(options.timeout);
  const int64_t rootLength = length[0].cpu().item<int64_t>();
  std::vector<at::Tensor> root{rank == 0 ? at::tensor(mine, i64) : at::zeros({rootLength}, i64)};
  backend->broadcast(root, bopts)->wait(options.timeout);
  const at::Tensor rootCpu = root[0].cpu();
  const int64_t* r = rootCpu.data_ptr<int64_t>();

  std::string problem;
  if (r[0] != mine[0] || r[1] != mine[1]) {
    problem = "rank " + std::to_string(rank) + " has " + std::to_string(mine[0]) + " parameters and " +
              std::to_string(mine[1]) + " buffers, rank 0 has " + std::to_string(r[0]) + " and " +
              std::to_string(r[1]);
  } else {
    int64_t pos = 2;
    const size_t total = params.size() + buffers.size();
    for (size_t i = 0; i < total && problem.empty(); ++i) {
      const at::Tensor& t = i < params.size() ? params[i] : buffers[i - params.size()];
      std::vector<int64_t> rootShape(r + pos + 1, r + pos + 1 + r[pos]);
      const auto rootType = static_cast<c10::ScalarType>(r[pos + 1 + r[pos]]);
      pos += r[pos] + 2;
      const std::string what = i < params.size() ? "parameter '" + names[i] + "'" : "buffer #" + std::to_string(i - params.size());
      if (t.sizes().vec() != rootShape) {
        problem = what + " has shape " + shapeText(t.sizes()) + " on rank " + std::to_string(rank) +
                  " but " + shapeText(rootShape) + " on rank 0";
      } else if (t.scalar_type() != rootType) {
        problem = what + " has dtype " + std::string(c10::toString(t.scalar_type())) + " on rank " +
                  std::to_string(rank) + " but " + c10::toString(rootType) + " on rank 0";
      }
    }
  }
  std::vector<at::Tensor> verdict{at::tensor({problem.empty() ? int64_t{-1} : int64_t{rank}}, i64)};
  c10d::AllreduceOptions aopts;
  aopts.reduceOp = c10d::ReduceOp::MAX;
  aopts.timeout = options.timeout;
  backend->allreduce(verdict, aopts)->wait(options.timeout);
  const int64_t badRank = verdict[0].cpu().item<int64_t>();
  if (!problem.empty()) throw InvalidArgument("DistributedDataParallel: model mismatch: " + problem);
  if (badRank >= 0) {
    throw InvalidArgument("DistributedDataParallel: model mismatch: rank " + std::to_string(badRank) +
                          " holds different parameter shapes than rank 0 (see its error)");
  }
}

void DdpReducer::Impl::buildBuckets() {
  // Reverse registration order approximates the order gradients become ready in backward.
  Bucket bucket;
  auto close = [this, &bucket]() {
    if (bucket.params.empty()) return;
    const auto& first = params[bucket.params.front()];
    int64_t numel = 0;
    for (size_t i : bucket.params) {
      bucket.offsets.push_back(numel);
      numel += params[i].numel();
      bucket_of[i] = buckets.size();
    }
    bucket.flat = at::zeros({numel}, first.options().requires_grad(false));
    if (options.comm_hook == CommHook::kFp16Compress)
      bucket.wire = at::empty({numel}, bucket.flat.options().dtype(at::kHalf));
    else if (options.comm_hook == CommHook::kBf16Compress)
      bucket.wire = at::empty({numel}, bucket.flat.options().dtype(at::kBFloat16));
    else bucket.wire = bucket.flat;
    buckets.push_back(std::move(bucket));
    bucket = Bucket{};
  };
  size_t total = 0;
  for (const auto& p : params) total += p.numel() * p.element_size();
  // A model smaller than two first buckets would sit in one bucket that can only be launched
  // when backward ends, overlapping nothing (the small ResNet of bench/ddp_bench: 8.7% overhead
  // as one bucket, 3.8% as two). Its later half goes first instead.
  size_t firstCap = options.first_bucket_bytes;
  if (total < 2 * firstCap && total >= kMinBytesToSplit) firstCap = total / 2;
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    const size_t bytes = p.numel() * p.element_size();
    const size_t cap = buckets.empty() ? firstCap : options.bucket_bytes;
    if (!bucket.params.empty()) {
      const auto& head = params[bucket.params.front()];
      if (bucket.bytes + bytes > cap || head.scalar_type() != p.scalar_type() || head.device() != p.device()) {
        close();
      }
    }
    bucket.params.push_back(k);
    bucket.bytes += bytes;
  }
  close();
}

void DdpReducer::Impl::startBufferBroadcast() {
  for (auto& pack : buffer_packs) startBroadcast(*backend, pack, buffers, options.timeout);
}

void DdpReducer::Impl::finishBufferBroadcast() {
  for (auto& pack : buffer_packs) finishBroadcast(*backend, pack, buffers, options.timeout);
}

void DdpReducer::Impl::onGradReady(size_t index) {
  std::lock_guard<std::mutex> lock(mu);
  if (!require_sync || !options.communicate || world_size == 1) return;
  if (!in_backward) {
    beginBackward();
    // Runs when this backward has finished: nothing may reach the optimizer unreduced.
    std::weak_ptr<bool> weak = alive;
    torch::autograd::Engine::get_default_engine().queue_callback([this, weak] {
      if (weak.lock()) finalize();
    });
  }
  if (ready[index]) return;  // reentrant backward of the same parameter: already counted
  ready[index] = true;
  ++ready_count;
  current.last_grad_ready_us = sinceStartUs();
  Bucket& bucket = buckets[bucket_of[index]];
  --bucket.pending;
  // Collectives must be issued in the same order on every rank: launch strictly in bucket order.
  while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
    launch(buckets[next_to_launch++]);
  }
}

void DdpReducer::Impl::beginBackward() {
  in_backward = true;
  start = Clock::now();
  std::fill(ready.begin(), ready.end(), false);
  ready_count = 0;
  next_to_launch = 0;
  for (auto& b : buckets) {
    b.pending = b.params.size();
    b.launched = false;
    b.work.reset();
  }
  current = IterationTrace{};
  current.num_grads = params.size();
  current.buckets.resize(buckets.size());
}

void DdpReducer::Impl::launchZeros(Bucket& bucket) {
  torch::NoGradGuard noGrad;
  bucket.wire.zero_();
  std::vector<at::Tensor> tensors{bucket.wire};
  c10d::AllreduceOptions opts;
  opts.timeout = options.timeout;
  bucket.work = backend->allreduce(tensors, opts);
  bucket.launched = true;
}

void DdpReducer::Impl::launch(Bucket& bucket) {
  torch::NoGradGuard noGrad;
  for (size_t j = 0; j < bucket.params.size(); ++j) {
    const auto& p = params[bucket.params[j]];
    auto slot = bucket.flat.narrow(0, bucket.offsets[j], p.numel());
    const auto& grad = p.grad();
    if (grad.defined() && ready[bucket.params[j]]) slot.copy_(grad.reshape({-1}));
    else slot.zero_();
  }
  // Divide before summing, as PyTorch does: the sum of averages cannot overflow where the sum
  // of gradients might (fp16).
  bucket.flat.div_(world_size);
  if (!bucket.wire.is_same(bucket.flat)) bucket.wire.copy_(bucket.flat);
  std::vector<at::Tensor> tensors{bucket.wire};
  c10d::AllreduceOptions opts;
  opts.timeout = options.timeout;
  bucket.work = backend->allreduce(tensors, opts);
  bucket.launched = true;
  auto& trace = current.buckets[&bucket - buckets.data()];
  trace.num_params = bucket.params.size();
  trace.bytes = bucket.bytes;
  trace.grads_ready_at_launch = ready_count;
  trace.launched_us = sinceStartUs();
}

void DdpReducer::Impl::finalize() {
  std::lock_guard<std::mutex> lock(mu);
  if (!in_backward) return;
  in_backward = false;
  if (ready_count < params.size()) {
    if (!options.find_unused_parameters) {
      std::string missing;
      size_t count = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        if (ready[i]) continue;
        if (count++ < 8) missing += (missing.empty() ? "" : ", ") + names[i];
      }
      // Drain what was launched so the backend is not left with dangling work.
      for (auto& b : buckets) {
        if (b.launched) {
          try { b.work->wait(options.timeout); } catch (...) {}
        }
      }
      throw InvalidArgument(
          "DistributedDataParallel: " + std::to_string(count) +
          " parameter(s) received no gradient in this backward: " + missing +
          (count > 8 ? ", ..." : "") +
          ". Construct with DdpOptions::find_unused_parameters = true if the model "
          "legitimately skips them (or call backward on a loss that uses them)");
    }
    // Unused parameters count as zeros, identically on every rank.
    while (next_to_launch < buckets.size()) launch(buckets[next_to_launch++]);
  }
  torch::NoGradGuard noGrad;
  std::chrono::steady_clock::duration waited{};
  for (auto& bucket : buckets) {
    auto waitStart = std::chrono::steady_clock::now();
    bucket.work->wait(options.timeout);
    waited += std::chrono::steady_clock::now() - waitStart;
    if (!bucket.wire.is_same(bucket.flat)) bucket.flat.copy_(bucket.wire);
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      auto& p = params[bucket.params[j]];
      auto averaged = bucket.flat.narrow(0, bucket.offsets[j], p.numel()).view_as(p);
      auto& grad = p.mutable_grad();
      // copy_ honours the gradient's own strides (channels-last stays channels-last).
      if (grad.defined() && grad.sizes() == p.sizes()) grad.copy_(averaged);
      else grad = averaged.clone();
    }
    bucket.work.reset();
  }
  current.finished_us = sinceStartUs();
  last = current;
  // One synchronised backward is one optimizer step: reported to launch, with the time this
  // rank spent waiting for the others (a straggler waits least).
  heartbeat::addWaitMicroseconds(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(waited).count()));
  heartbeat::beat();
}

DdpReducer::DdpReducer(std::shared_ptr<torch::nn::Module> module, c10::intrusive_ptr<c10d::Backend> backend,
                       DdpOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (!module) throw InvalidArgument("DistributedDataParallel: null module");
  if (!backend) throw InvalidArgument("DistributedDataParallel: null process group");
  impl_->module = std::move(module);
  impl_->backend = std::move(backend);
  impl_->options = std::move(options);
  impl_->world_size = impl_->backend->getSize();
  impl_->rank = impl_->backend->getRank();
  for (const auto& item : impl_->module->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    impl_->params.push_back(item.value());
    impl_->names.push_back(item.key());
  }
  for (const auto& b : impl_->module->buffers(/*recurse=*/true)) impl_->buffers.push_back(b);
  impl_->bucket_of.resize(impl_->params.size());
  impl_->ready.assign(impl_->params.size(), false);

  if (impl_->world_size > 1) {
    impl_->checkShapes();
    std::vector<at::Tensor> state = impl_->params;
    state.insert(state.end(), impl_->buffers.begin(), impl_->buffers.end());
    for (auto& pack : packByDevice(state)) {
      startBroadcast(*impl_->backend, pack, state, impl_->options.timeout);
      finishBroadcast(*impl_->backend, pack, state, impl_->options.timeout);
    }
  }
  impl_->buildBuckets();
  impl_->buffer_packs = packByDevice(impl_->buffers);

  Impl* impl = impl_.get();
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(impl_->params[i]);
    std::weak_ptr<bool> weak = impl_->alive;
    impl_->hook_keys.push_back(
        accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [impl, weak, i](const torch::autograd::variable_list& outputs,
                            const torch::autograd::variable_list&) {
              if (weak.lock()) impl->onGradReady(i);
              return outputs;
            })));
    impl_->accumulators.push_back(std::move(accumulator));
  }
  wlog::debug("DistributedDataParallel: " + std::to_string(impl_->params.size()) + " parameters in " +
              std::to_string(impl_->buckets.size()) + " buckets");
}

DdpReducer::~DdpReducer() {
  // A broadcast still in flight reads and writes our pack: let it land (every rank has the
  // same one outstanding, so this does not wait on anything that will not come).
  try {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->finishBufferBroadcast();
  } catch (const std::exception& e) {
    wlog::warn(std::string("DistributedDataParallel: buffer broadcast failed at teardown: ") + e.what());
  }
  *impl_->alive = false;
  impl_->alive.reset();
  for (size_t i = 0; i < impl_->accumulators.size(); ++i) {
    impl_->accumulators[i]->del_post_hook(impl_->hook_keys[i]);
  }
}

bool DdpReducer::Impl::syncsBuffers() const {
  return options.broadcast_buffers && options.communicate && world_size > 1 &&
         !buffer_packs.empty();
}

void DdpReducer::beforeForward() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ++impl_->forwards_begun;
  if (!impl_->syncsBuffers()) return;
  // Not at the end of backward: the graph just run saved the running statistics, and writing
  // them in place would break a second backward through it (retain_graph).
  if (!impl_->options.overlap_buffer_broadcast) impl_->startBufferBroadcast();
  impl_->finishBufferBroadcast();
}

void DdpReducer::afterForward() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->forwards_ended = impl_->forwards_begun;
  if (!impl_->syncsBuffers() || !impl_->options.overlap_buffer_broadcast) return;
  impl_->finishBufferBroadcast();  // a forward without beforeForward: one broadcast in flight at most
  impl_->startBufferBroadcast();
}

void DdpReducer::setRequireGradSync(bool sync) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->require_sync = sync;
}

bool DdpReducer::requireGradSync() const { return impl_->require_sync; }

uint64_t DdpReducer::forwardsBegun() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->forwards_begun;
}

void DdpReducer::completeAbandonedPass(uint64_t begunBefore, bool sync) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& im = *impl_;
  const bool buffers = im.syncsBuffers();
  const bool overlap = im.options.overlap_buffer_broadcast;
  if (im.forwards_begun == begunBefore) {  // failed before its forward: what beforeForward does
    ++im.forwards_begun;
    if (buffers) {
      if (!overlap) im.startBufferBroadcast();
      im.finishBufferBroadcast();
    }
  }
  if (im.forwards_ended < im.forwards_begun) {  // failed inside its forward: what afterForward does
    im.forwards_ended = im.forwards_begun;
    if (buffers && overlap) {
      im.finishBufferBroadcast();
      im.startBufferBroadcast();
    }
  }
  if (!sync || !im.options.communicate || im.world_size == 1) {
    im.in_backward = false;
    return;
  }
  // A backward that threw never reaches its final callback (autograd drops it with the failed
  // graph task), so the buckets it launched are still in flight: the rest go as zeros, in order.
  if (!im.in_backward) im.beginBackward();
  for (auto& bucket : im.buckets) {
    if (!bucket.launched) im.launchZeros(bucket);
  }
  for (auto& bucket : im.buckets) {
    bucket.work->wait(im.options.timeout);
    bucket.work.reset();
  }
  im.in_backward = false;
}

IterationTrace DdpReducer::lastIteration() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last;
}

std::vector<std::vector<std::string>> DdpReducer::bucketLayout() const {
  std::vector<std::vector<std::string>> layout;
  for (const auto& b : impl_->buckets) {
    layout.emplace_back();
    for (size_t i : b.params) layout.back().push_back(impl_->names[i]);
  }
  return layout;
}

const DdpOptions& DdpReducer::options() const { return impl_->options; }

}  // namespace ddpl::worker
