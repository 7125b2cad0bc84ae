import torch
import torch.nn as nn


class Model(nn.Module):
    """C = diag(A) @ B: a diagonal matrix times a dense matrix (KernelBench level 1 #12 style)."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.diag(A) @ B


N = 1024
M = 1024


def get_inputs():
    return [torch.randn(N), torch.randn(N, M)]


def get_init_inputs():
    return []
