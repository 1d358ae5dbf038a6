"""Early stopping across processes: any rank calls `set_trigger()`, every rank sees `check_trigger()`.

    accelerando launch --cpu --num_processes 2 examples/by_feature/early_stopping.py --target_loss 0.3

Breaking out of the loop on one rank only would leave the others waiting in a collective forever;
the trigger is a small all-reduce that every rank passes at the same point.
"""

from __future__ import annotations

import torch
from _common import base_parser, make_loaders, make_model

from accelerando import Accelerator
from accelerando.utils import set_seed


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--target_loss", type=float, default=0.3)
    args = parser.parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(args.seed)
    train, _ = make_loaders(args.batch_size)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    step, stopped, epochs_run = 0, False, 0
    for _ in range(args.epochs * 10):
        epochs_run += 1
        for x, y in train:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if loss.item() < args.target_loss:  # this rank's own batch: ranks disagree here
                accelerator.set_trigger()
            if accelerator.check_trigger():  # ...but every rank agrees here
                stopped = True
                break
        if stopped:
            break
    accelerator.print(f"stopped_early={stopped} step={step} epochs={epochs_run}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
