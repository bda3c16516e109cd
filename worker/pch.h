#pragma once
// The one precompiled header for every LibTorch TU in worker/, tests and bench (REUSE_FROM).
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
