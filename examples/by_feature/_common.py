"""Data, model and evaluation shared by the by-feature examples, so each script shows only its feature.

The task is a 4-class problem on generated features (no downloads): a linear teacher labels
Gaussian inputs, so a small MLP reaches high accuracy in a few epochs on CPU.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES = 16, 4


def make_dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, FEATURES, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def make_loaders(
    batch_size: int, train_size: int = 1024, eval_size: int = 203
) -> tuple[DataLoader, DataLoader]:
    """An uneven eval set (203 samples) so `gather_for_metrics` has padding to drop on 2 ranks."""
    train = DataLoader(make_dataset(train_size, seed=0), batch_size=batch_size, shuffle=True)
    evaluation = DataLoader(make_dataset(eval_size, seed=1), batch_size=batch_size)
    return train, evaluation


def make_model(hidden: int = 64) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES)
    )


def evaluate(accelerator, model, loader) -> tuple[float, int]:
    """Accuracy over every eval sample exactly once, and how many samples that was."""
    model.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for x, y in loader:
            preds, labels = accelerator.gather_for_metrics((model(x).argmax(dim=1), y))
            correct += (preds == labels).sum().item()
            seen += labels.numel()
    model.train()
    return correct / seen, seen


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16"])
    return parser
