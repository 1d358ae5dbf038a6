"""A small classifier trained the Accelerate way; run by `make demo` on 2 CPU processes.

    accelerando launch --cpu --num_processes 2 examples/demo_train.py --output_dir demo_output

Change nothing to run it on one process (`python examples/demo_train.py`) or on GPUs
(`accelerando launch --num_processes 8 examples/demo_train.py`).
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

from accelerando import Accelerator
from accelerando.utils import set_seed, tqdm


def make_data(n: int = 2048) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    true_w = torch.randn(16, 4, generator=g)
    y = (x @ true_w).argmax(dim=1)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="demo_output")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    args = parser.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(42)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = DataLoader(make_data(), batch_size=32, shuffle=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train))
    model, optimizer, train, scheduler = accelerator.prepare(model, optimizer, train, scheduler)
    accelerator.print(
        f"{accelerator.num_processes} process(es) on {accelerator.device}, {accelerator.distributed_type}"
    )

    for epoch in range(args.epochs):
        model.train()
        total, seen = torch.zeros((), device=accelerator.device), 0
        for x, y in tqdm(train, desc=f"epoch {epoch}"):
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            total += loss.detach() * len(y)
            seen += len(y)
        mean_loss = accelerator.reduce(total, "sum") / accelerator.reduce(torch.tensor(float(seen)), "sum")
        preds, labels = [], []
        model.eval()
        with torch.no_grad():
            for x, y in train:
                preds.append(accelerator.gather_for_metrics(model(x).argmax(dim=1)))
                labels.append(accelerator.gather_for_metrics(y))
        accuracy = (torch.cat(preds) == torch.cat(labels)).float().mean().item()
        accelerator.print(f"epoch {epoch}: loss {mean_loss.item():.4f}  accuracy {accuracy:.3f}")

    accelerator.save_state(f"{args.output_dir}/checkpoint")
    accelerator.save_model(model, args.output_dir)
    accelerator.print(
        f"saved weights to {args.output_dir}/model.safetensors and a checkpoint to {args.output_dir}/checkpoint"
    )


if __name__ == "__main__":
    main()
