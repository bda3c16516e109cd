"""Stands in for a torch whose import initialised CUDA (no GPU here): the template's check asks
torch.cuda.is_initialized() and must refuse to fork. tests/gpu/ checks the real thing."""
from . import cuda  # noqa: F401
