"""Train a small CNN image classifier: Accelerate's CV example, offline.

    accelerando launch --cpu --num_processes 2 examples/cv_example.py
    accelerando launch --num_processes 8 --mixed_precision bf16 examples/cv_example.py   # same code on GPUs

The images are generated: noise plus a bright square in one of four quadrants, the label being the
quadrant. Random flips in the dataset (drawn from the DataLoader worker's seeded RNG) change the
quadrant, so the label follows the augmentation.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, Dataset

from accelerando import Accelerator
from accelerando.utils import set_seed

SIZE = 24


class Quadrants(Dataset):
    def __init__(self, n: int, seed: int, augment: bool) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        self.images = 0.3 * torch.randn(n, 3, SIZE, SIZE, generator=g)
        half = SIZE // 2
        for i, q in enumerate(self.labels.tolist()):
            top, left = (q // 2) * half, (q % 2) * half
            self.images[i, :, top + 3 : top + 9, left + 3 : left + 9] += 1.0
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.images[i], int(self.labels[i])
        if self.augment and torch.rand(()) < 0.5:  # horizontal flip: left <-> right quadrant
            image, label = image.flip(-1), label ^ 1
        return image, label


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * (SIZE // 4) ** 2, 4),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--train_size", type=int, default=1024)
    parser.add_argument("--num_workers", type=int, default=0)
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(42)
    train = DataLoader(
        Quadrants(args.train_size, seed=0, augment=True), batch_size=args.batch_size, shuffle=True,
        num_workers=args.num_workers,
    )  # fmt: skip
    evaluation = DataLoader(Quadrants(301, seed=1, augment=False), batch_size=args.batch_size)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=args.epochs * len(train)
    )
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, train, evaluation, scheduler
    )
    for epoch in range(args.epochs):
        model.train()
        for images, labels in train:
            accelerator.backward(torch.nn.functional.cross_entropy(model(images), labels))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for images, labels in evaluation:
                preds, labels = accelerator.gather_for_metrics((model(images).argmax(dim=1), labels))
                correct += (preds == labels).sum().item()
                seen += labels.numel()
        accelerator.print(f"epoch {epoch}: accuracy {correct / seen:.3f} on {seen} samples")
    accelerator.print(f"accuracy={correct / seen:.3f} eval_samples={seen}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
