"""Metrics over several processes: `gather_for_metrics` drops the samples added to even out batches.

    accelerando launch --cpu --num_processes 2 examples/by_feature/multi_process_metrics.py

The eval set has 203 samples: on 2 processes the last batches are padded so every rank takes the
same steps; `gather_for_metrics` returns exactly 203 predictions, never a duplicate.
"""

from __future__ import annotations

import torch
from _common import base_parser, evaluate, make_loaders, make_model

from accelerando import Accelerator
from accelerando.utils import set_seed


def main() -> None:
    args = base_parser(__doc__.splitlines()[0]).parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(args.seed)
    train, evaluation = make_loaders(args.batch_size)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
    for epoch in range(args.epochs):
        for x, y in train:
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        accuracy, seen = evaluate(accelerator, model, evaluation)
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f} over {seen} samples")
    accelerator.print(f"eval_samples={seen} dataset={len(evaluation.dataset)} accuracy={accuracy:.3f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
