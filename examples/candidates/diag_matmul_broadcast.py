import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """diag(A) @ B == A[:, None] * B: one elementwise pass instead of an N x N matrix product."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return A.unsqueeze(1) * B
