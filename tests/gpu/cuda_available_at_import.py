"""A module that asks torch.cuda.is_available() when imported, as many libraries do: the template
answers it through NVML (PYTORCH_NVML_BASED_CUDA_CHECK during its imports), so workers forked from
it can still use CUDA."""
import torch

assert torch.cuda.is_available()
