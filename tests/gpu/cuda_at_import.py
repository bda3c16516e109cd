"""A module that initialises CUDA when imported: a template that imports it must not fork."""
import torch

torch.cuda.init()
