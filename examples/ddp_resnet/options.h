#pragma once
// Command line of ddp_resnet. Torch-free, so that parsing (and its errors, exit code 2) happens
// before LibTorch spins up threads or any process group exists.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddpl::example {

// A bad command line: main prints it and exits with kUsageExitCode.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kUsageExitCode = 2;

enum class ModelKind { kResNet18, kResNet34, kResNet50 };
enum class StemKind { kAuto, kCifar, kImageNet };
enum class AmpMode { kOff, kBf16, kFp16 };
enum class ProgressMode { kAuto, kBar, kLines, kOff };
enum class CommHookKind { kNone, kFp16, kBf16 };

// Defaults are the `make demo` job: a narrow ResNet-18 on the synthetic set, a few minutes on two
// CPU cores. Real runs raise --width to 64 (the standard ResNet) and point --data at CIFAR-10.
inline constexpr int kDefaultWidth = 16;
inline constexpr int64_t kDefaultTrainSize = 8192;
inline constexpr int64_t kDefaultTestSize = 2048;
inline constexpr int kDefaultImageSize = 32;
inline constexpr int kDefaultClasses = 10;
inline constexpr int kDefaultEpochs = 4;
inline constexpr int kDefaultBatchSize = 64;
inline constexpr double kDefaultLr = 0.2;
inline constexpr double kDefaultWarmupEpochs = 0.5;
inline constexpr double kDefaultMomentum = 0.9;
inline constexpr double kDefaultWeightDecay = 5e-4;
inline constexpr int kDefaultKeepCheckpoints = 2;

struct Options {
  ModelKind model = ModelKind::kResNet18;
  int width = kDefaultWidth;  // channels of the first stage; 64 is the standard ResNet
  StemKind stem = StemKind::kAuto;

  // Empty: the embedded synthetic set. Otherwise a directory in CIFAR-10 binary format.
  std::string data_dir;
  int64_t train_size = kDefaultTrainSize;  // synthetic only
  int64_t test_size = kDefaultTestSize;    // synthetic only
  int image_size = kDefaultImageSize;      // synthetic only (CIFAR-10 is 32)
  int classes = kDefaultClasses;          // synthetic only
  uint64_t data_seed = 0;                 // which synthetic set; independent of --seed
  bool augment = true;                    // random crop + flip on CIFAR-10

  int epochs = kDefaultEpochs;
  int batch_size = kDefaultBatchSize;  // per rank, per micro-batch
  int accumulation = 1;               // micro-batches per optimizer step
  // On a device out-of-memory error, every rank halves (or so) the micro-batch and doubles the
  // accumulation, keeping the global batch: worker/auto_batch.h.
  bool auto_batch = false;
  // Testing --auto-batch: raise an out-of-memory error once at this optimizer step.
  struct OomInjection {
    int64_t step = -1;  // -1: none
    int rank = 0;       // -1: every rank
    bool in_backward = true;
  } inject_oom;
  double lr = kDefaultLr;
  double min_lr = 0.0;
  double warmup_epochs = kDefaultWarmupEpochs;
  double momentum = kDefaultMomentum;
  double weight_decay = kDefaultWeightDecay;
  bool nesterov = false;
  uint64_t seed = 0;

  std::string checkpoint_dir = "checkpoints/ddp_resnet";  // empty: no checkpoints
  int checkpoint_every = 0;  // optimizer steps; 0: at the end of each epoch only
  int keep_checkpoints = kDefaultKeepCheckpoints;
  // Under launch with checkpoints in memory: a memory copy every N steps besides the durable
  // ones (docs/checkpoints.md); 0: none.
  int memory_checkpoint_every = 10;
  bool resume = false;  // also resume on a first start (restarts by the launcher always do)
  int eval_every = 1;   // epochs; the last epoch is always evaluated

  std::optional<std::string> backend;  // overrides DDPL_BACKEND: auto, gloo, nccl
  AmpMode amp = AmpMode::kOff;
  bool channels_last = false;
  std::optional<bool> cudnn_benchmark;
  std::optional<bool> deterministic;
  bool tf32 = false;
  int threads = 0;  // intra-op threads per rank; 0: leave LibTorch's choice (OMP_NUM_THREADS)
  double bucket_mb = 25.0;
  CommHookKind comm_hook = CommHookKind::kNone;

  ProgressMode progress = ProgressMode::kAuto;
  int log_every = 0;         // steps between plain progress lines; 0: about ten per epoch
  std::string summary_json;  // rank 0 writes a machine-readable summary here

  bool help = false;
};

// Throws UsageError naming the flag. args excludes argv[0].
Options parseOptions(const std::vector<std::string>& args);

std::string usage();
std::string toString(ModelKind model);
std::string toString(AmpMode amp);

}  // namespace ddpl::example
