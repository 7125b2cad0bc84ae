import torch
import torch.nn as nn


class Model(nn.Module):
    """Y = (A @ B) @ X: two square matrices times a thin one, parenthesised the expensive way
    (N³ + N²·K multiply-adds where A @ (B @ X) needs 2·N²·K: 32.5x fewer at N = 1024, K = 16)."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B, X):
        return (A @ B) @ X


N = 1024
K = 16


def get_inputs():
    return [torch.randn(N, N) / N**0.5, torch.randn(N, N) / N**0.5, torch.randn(N, K)]


def get_init_inputs():
    return []
