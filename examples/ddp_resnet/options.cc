#include "examples/ddp_resnet/options.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "common/parse.h"

namespace ddpl::example {
namespace {

// The checked parsers every ddplaunch program shares (common/parse.h), reporting as this
// program's usage errors.
template <typename F>
auto checked(F parse) {
  try {
    return parse();
  } catch (const ddpl::InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

int64_t parseInteger(const std::string& flag, const std::string& value, int64_t minValue,
                     int64_t maxValue) {
  return checked([&] { return ddpl::parseInteger(flag, value, minValue, maxValue); });
}

double parseNumber(const std::string& flag, const std::string& value, double minValue,
                   double maxValue) {
  return checked([&] { return ddpl::parseNumber(flag, value, minValue, maxValue); });
}

bool parseBool(const std::string& flag, const std::string& value) {
  return checked([&] { return ddpl::parseBool(flag, value); });
}

template <typename T>
T parseChoice(const std::string& flag, const std::string& value,
              const std::vector<std::pair<std::string, T>>& choices) {
  std::string names;
  for (const auto& [name, v] : choices) {
    if (name == value) return v;
    names += (names.empty() ? "" : ", ") + name;
  }
  throw UsageError(flag + ": '" + value + "' is not one of " + names);
}

struct Flag {
  std::string name;
  bool takes_value;  // false: a switch, optionally --name=1/0
  std::string metavar;
  std::string help;
  std::function<void(Options&, const std::string& flag, const std::string& value)> apply;
};

constexpr int64_t kMaxCount = 1'000'000'000;

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {"--model", true, "resnet18|resnet34|resnet50",
       "network (basic blocks for 18/34, bottleneck for 50)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.model = parseChoice<ModelKind>(f, v,
                                          {{"resnet18", ModelKind::kResNet18},
                                           {"resnet34", ModelKind::kResNet34},
                                           {"resnet50", ModelKind::kResNet50}});
       }},
      {"--width", true, "N", "channels of the first stage (64 = the standard ResNet; default 16)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.width = parseInteger(f, v, 1, 4096);
       }},
      {"--stem", true, "auto|cifar|imagenet",
       "3x3 stem for small images, 7x7/2 + max-pool for 224x224 (auto: by image size)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.stem = parseChoice<StemKind>(f, v,
                                        {{"auto", StemKind::kAuto},
                                         {"cifar", StemKind::kCifar},
                                         {"imagenet", StemKind::kImageNet}});
       }},
      {"--data", true, "DIR",
       "CIFAR-10 binary files (data_batch_*.bin, test_batch.bin); default: the synthetic set",
       [](Options& o, const std::string& f, const std::string& v) {
         if (v.empty()) throw UsageError(f + ": needs a directory");
         o.data_dir = v;
       }},
      {"--train-size", true, "N", "synthetic training images",
       [](Options& o, const std::string& f, const std::string& v) {
         o.train_size = parseInteger(f, v, 1, kMaxCount);
       }},
      {"--test-size", true, "N", "synthetic test images",
       [](Options& o, const std::string& f, const std::string& v) {
         o.test_size = parseInteger(f, v, 1, kMaxCount);
       }},
      {"--image-size", true, "N", "synthetic image side in pixels (224 for the ImageNet stem)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.image_size = parseInteger(f, v, 8, 1024);
       }},
      {"--classes", true, "N", "synthetic classes",
       [](Options& o, const std::string& f, const std::string& v) {
         o.classes = parseInteger(f, v, 2, 1000);
       }},
      {"--data-seed", true, "N", "which synthetic set (independent of --seed)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.data_seed = parseInteger(f, v, 0, kMaxCount);
       }},
      {"--augment", false, "",
       "random crop and flip on CIFAR-10 (default on; --augment=0 turns it off)",
       [](Options& o, const std::string& f, const std::string& v) { o.augment = parseBool(f, v); }},
      {"--epochs", true, "N", "passes over the training set",
       [](Options& o, const std::string& f, const std::string& v) {
         o.epochs = parseInteger(f, v, 1, kMaxCount);
       }},
      {"--batch-size", true, "N", "images per rank per micro-batch",
       [](Options& o, const std::string& f, const std::string& v) {
         o.batch_size = parseInteger(f, v, 1, kMaxCount);
       }},
      {"--accumulation", true, "N", "micro-batches per optimizer step (gradient accumulation)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.accumulation = parseInteger(f, v, 1, 1024);
       }},
      {"--auto-batch", false, "",
       "on running out of device memory, all ranks switch to a smaller micro-batch with more "
       "accumulation (same global batch) and run the step again",
       [](Options& o, const std::string& f, const std::string& v) {
         o.auto_batch = parseBool(f, v);
       }},
      {"--inject-oom", true, "STEP[:RANK[:forward|backward]]",
       "testing --auto-batch: an out-of-memory error at optimizer step STEP (0-based) on RANK "
       "(default 0; -1: all), raised midway through backward (default) or before the forward",
       [](Options& o, const std::string& f, const std::string& v) {
         std::vector<std::string> parts;
         std::stringstream in(v);
         for (std::string part; std::getline(in, part, ':');) parts.push_back(part);
         if (parts.empty() || parts.size() > 3)
           throw UsageError(f + ": '" + v + "' is not STEP[:RANK[:forward|backward]]");
         o.inject_oom.step = parseInteger(f, parts[0], 0, kMaxCount);
         if (parts.size() > 1)
           o.inject_oom.rank = static_cast<int>(parseInteger(f, parts[1], -1, 1 << 20));
         if (parts.size() > 2) {
           o.inject_oom.in_backward =
               parseChoice<bool>(f, parts[2], {{"backward", true}, {"forward", false}});
         }
       }},
      {"--lr", true, "X", "peak learning rate (after warm-up)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.lr = parseNumber(f, v, 0, 1e3);
       }},
      {"--min-lr", true, "X", "learning rate at the end of the cosine decay",
       [](Options& o, const std::string& f, const std::string& v) {
         o.min_lr = parseNumber(f, v, 0, 1e3);
       }},
      {"--warmup-epochs", true, "X", "linear warm-up length in epochs (fractions allowed)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.warmup_epochs = parseNumber(f, v, 0, 1e6);
       }},
      {"--momentum", true, "X", "SGD momentum",
       [](Options& o, const std::string& f, const std::string& v) {
         o.momentum = parseNumber(f, v, 0, 1);
       }},
      {"--weight-decay", true, "X", "L2 weight decay",
       [](Options& o, const std::string& f, const std::string& v) {
         o.weight_decay = parseNumber(f, v, 0, 1);
       }},
      {"--nesterov", false, "", "Nesterov momentum",
       [](Options& o, const std::string& f, const std::string& v) {
         o.nesterov = parseBool(f, v);
       }},
      {"--seed", true, "N", "initialisation and shuffling",
       [](Options& o, const std::string& f, const std::string& v) {
         o.seed = parseInteger(f, v, 0, kMaxCount);
       }},
      {"--checkpoint-dir", true, "DIR",
       "where checkpoints go ('' = none; default checkpoints/ddp_resnet)",
       [](Options& o, const std::string&, const std::string& v) { o.checkpoint_dir = v; }},
      {"--checkpoint-every", true, "N",
       "also checkpoint every N optimizer steps (0: end of each epoch only)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.checkpoint_every = parseInteger(f, v, 0, kMaxCount);
       }},
      {"--memory-checkpoint-every", true, "N",
       "under launch, also checkpoint into launch's memory every N optimizer steps (a memory "
       "copy; launch persists the durable ones and, after a failure, the newest); 0: only the "
       "durable ones",
       [](Options& o, const std::string& f, const std::string& v) {
         o.memory_checkpoint_every = parseInteger(f, v, 0, kMaxCount);
       }},
      {"--keep-checkpoints", true, "N", "how many recent checkpoints to keep",
       [](Options& o, const std::string& f, const std::string& v) {
         o.keep_checkpoints = parseInteger(f, v, 1, 1000);
       }},
      {"--resume", false, "",
       "continue from the latest checkpoint on a first start too (restarts always do)",
       [](Options& o, const std::string& f, const std::string& v) { o.resume = parseBool(f, v); }},
      {"--eval-every", true, "N", "evaluate every N epochs (the last epoch always is)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.eval_every = parseInteger(f, v, 1, kMaxCount);
       }},
      {"--backend", true, "auto|gloo|nccl",
       "process group backend (default: DDPL_BACKEND, else auto)",
       [](Options& o, const std::string& f, const std::string& v) {
         if (v != "auto" && v != "gloo" && v != "nccl")
           throw UsageError(f + ": '" + v + "' is not one of auto, gloo, nccl");
         o.backend = v;
       }},
      {"--amp", true, "off|bf16|fp16", "mixed precision (fp16 uses a GradScaler)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.amp = parseChoice<AmpMode>(
             f, v, {{"off", AmpMode::kOff}, {"bf16", AmpMode::kBf16}, {"fp16", AmpMode::kFp16}});
       }},
      {"--channels-last", false, "",
       "NHWC memory format (faster convolutions on GPUs and recent CPUs)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.channels_last = parseBool(f, v);
       }},
      {"--cudnn-benchmark", false, "", "let cuDNN pick the fastest algorithms",
       [](Options& o, const std::string& f, const std::string& v) {
         o.cudnn_benchmark = parseBool(f, v);
       }},
      {"--deterministic", false, "", "deterministic algorithms only",
       [](Options& o, const std::string& f, const std::string& v) {
         o.deterministic = parseBool(f, v);
       }},
      {"--tf32", false, "", "TF32 matmuls and convolutions on Ampere and newer",
       [](Options& o, const std::string& f, const std::string& v) { o.tf32 = parseBool(f, v); }},
      {"--threads", true, "N", "intra-op threads per rank (default: OMP_NUM_THREADS)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.threads = parseInteger(f, v, 1, 1024);
       }},
      {"--bucket-mb", true, "X", "DDP gradient bucket size in MiB",
       [](Options& o, const std::string& f, const std::string& v) {
         o.bucket_mb = parseNumber(f, v, 0.001, 1e5);
       }},
      {"--comm-hook", true, "none|fp16|bf16", "compress gradients for the all-reduce",
       [](Options& o, const std::string& f, const std::string& v) {
         o.comm_hook = parseChoice<CommHookKind>(f, v,
                                                 {{"none", CommHookKind::kNone},
                                                  {"fp16", CommHookKind::kFp16},
                                                  {"bf16", CommHookKind::kBf16}});
       }},
      {"--progress", true, "auto|bar|lines|off",
       "rank 0's progress: a bar on a terminal, else lines (auto)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.progress = parseChoice<ProgressMode>(f, v,
                                                {{"auto", ProgressMode::kAuto},
                                                 {"bar", ProgressMode::kBar},
                                                 {"lines", ProgressMode::kLines},
                                                 {"off", ProgressMode::kOff}});
       }},
      {"--log-every", true, "N", "steps between progress lines (0: about ten per epoch)",
       [](Options& o, const std::string& f, const std::string& v) {
         o.log_every = parseInteger(f, v, 0, kMaxCount);
       }},
      {"--summary-json", true, "PATH", "rank 0 writes the run's summary as JSON here",
       [](Options& o, const std::string& f, const std::string& v) {
         if (v.empty()) throw UsageError(f + ": needs a path");
         o.summary_json = v;
       }},
      {"--help", false, "", "this text",
       [](Options& o, const std::string& f, const std::string& v) { o.help = parseBool(f, v); }},
  };
  return table;
}

}  // namespace

Options parseOptions(const std::vector<std::string>& args) {
  Options options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h") {
      options.help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0)
      throw UsageError("unexpected argument '" + arg + "' (options start with --)");
    const auto eq = arg.find('=');
    std::string name = arg.substr(0, eq);
    // torchrun users write --batch_size; accept both spellings as launch does.
    std::replace(name.begin() + 2, name.end(), '_', '-');
    const auto flag =
        std::find_if(flags().begin(), flags().end(), [&](const Flag& f) { return f.name == name; });
    if (flag == flags().end())
      throw UsageError("unknown option '" + arg.substr(0, eq) + "' (see --help)");
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (flag->takes_value) {
      if (i + 1 >= args.size()) throw UsageError(name + ": needs a value (" + flag->metavar + ")");
      value = args[++i];
    } else {
      value = "1";
    }
    flag->apply(options, name, value);
  }
  if (options.min_lr > options.lr) {
    throw UsageError("--min-lr: " + std::to_string(options.min_lr) + " is above --lr " +
                     std::to_string(options.lr));
  }
  if (options.inject_oom.step >= 0 && !options.auto_batch) {
    throw UsageError("--inject-oom: tests --auto-batch, which is off (add --auto-batch)");
  }
  if (!options.data_dir.empty() && options.classes != kDefaultClasses) {
    throw UsageError(
        "--classes: CIFAR-10 has 10 classes; --classes applies to the synthetic set only");
  }
  return options;
}

std::string usage() {
  std::ostringstream out;
  out << "usage: launch --nproc-per-node=N ddp_resnet [options]\n\n"
         "Trains a ResNet with DistributedDataParallel, one process per rank (started by "
         "`launch`,\n"
         "torchrun or mpirun; alone it runs as a single rank). Options:\n";
  for (const auto& f : flags()) {
    std::string lhs = "  " + f.name + (f.takes_value ? " " + f.metavar : "");
    if (lhs.size() < 34)
      lhs.resize(34, ' ');
    else
      lhs += "\n" + std::string(34, ' ');
    out << lhs << f.help << "\n";
  }
  return out.str();
}

std::string toString(ModelKind model) {
  switch (model) {
    case ModelKind::kResNet18:
      return "resnet18";
    case ModelKind::kResNet34:
      return "resnet34";
    case ModelKind::kResNet50:
      return "resnet50";
  }
  return "?";
}

std::string toString(AmpMode amp) {
  switch (amp) {
    case AmpMode::kOff:
      return "off";
    case AmpMode::kBf16:
      return "bf16";
    case AmpMode::kFp16:
      return "fp16";
  }
  return "?";
}

}  // namespace ddpl::example
