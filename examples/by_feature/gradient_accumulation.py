"""Gradient accumulation: `accelerator.accumulate(model)` steps the optimizer every N batches.

    accelerando launch --cpu --num_processes 2 examples/by_feature/gradient_accumulation.py --gradient_accumulation_steps 4

Gradients are synchronised across processes only on the batch that steps, and the loss is scaled
by 1/N inside `backward`, so N batches of B equal one batch of N*B.
"""

from __future__ import annotations

import torch
from _common import base_parser, evaluate, make_loaders, make_model

from accelerando import Accelerator
from accelerando.utils import set_seed


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    args = parser.parse_args()
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps, mixed_precision=args.mixed_precision
    )
    set_seed(args.seed)
    train, evaluation = make_loaders(args.batch_size)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
    optimizer_steps = 0
    for epoch in range(args.epochs):
        for x, y in train:
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
                optimizer_steps += int(accelerator.sync_gradients)
        accuracy, _ = evaluate(accelerator, model, evaluation)
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f}")
    accelerator.print(
        f"optimizer_steps={optimizer_steps} batches={args.epochs * len(train)} accuracy={accuracy:.3f}"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
