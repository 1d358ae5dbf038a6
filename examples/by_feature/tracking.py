"""Experiment tracking: the loss of every step and the accuracy of every epoch in TensorBoard.

    accelerando launch --cpu --num_processes 2 examples/by_feature/tracking.py --project_dir runs/tracking
    tensorboard --logdir runs/tracking

`log_with` names the tracker and `project_dir` where it writes; `init_trackers` starts the run
and records the hyper-parameters; `log` sends values at a step; `end_training` closes the files.
Only the main process writes, so the loss logged is the mean over all ranks (`reduce`), not rank 0's.
"""

from __future__ import annotations

import torch
from _common import base_parser, evaluate, make_loaders, make_model

from accelerando import Accelerator
from accelerando.utils import set_seed


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--project_dir", default="runs/tracking", help="where the event files go")
    args = parser.parse_args()
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision, log_with="tensorboard", project_dir=args.project_dir
    )
    accelerator.init_trackers("tracking_example", config=vars(args))
    set_seed(args.seed)
    train, evaluation = make_loaders(args.batch_size)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
    step, mean_loss, accuracy = 0, 0.0, 0.0
    for epoch in range(args.epochs):
        for x, y in train:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            mean_loss = accelerator.reduce(loss.detach(), "mean").item()
            accelerator.log({"train_loss": mean_loss}, step=step)
            step += 1
        accuracy, _ = evaluate(accelerator, model, evaluation)
        accelerator.log({"accuracy": accuracy, "epoch": epoch}, step=step - 1)
    log_dir = accelerator.get_tracker("tensorboard").logging_dir
    accelerator.end_training()  # flushes and closes the event files
    accelerator.print(f"steps={step} last_loss={mean_loss!r} accuracy={accuracy!r} log_dir={log_dir}")


if __name__ == "__main__":
    main()
