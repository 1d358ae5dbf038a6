"""Checkpointing: `save_state` every N steps, `load_state` + `skip_first_batches` to resume mid-epoch.

    accelerando launch --cpu --num_processes 2 examples/by_feature/checkpointing.py --output_dir ckpt --stop_after 40
    accelerando launch --cpu --num_processes 2 examples/by_feature/checkpointing.py --output_dir ckpt --resume_from_checkpoint latest

The resumed run continues from the saved step with the same model, optimizer, scheduler, RNG and
data order, so its final weights equal those of a run that never stopped.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from _common import base_parser, evaluate, make_loaders, make_model

from accelerando import Accelerator
from accelerando.utils import ProjectConfiguration, set_seed


def fingerprint(model: torch.nn.Module) -> str:
    """A short hash of every parameter's bytes: equal hashes mean bit-identical weights."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


class Progress:
    """Where the loop is (epoch, batch in it, steps), saved with the checkpoint (`register_for_checkpointing`)."""

    def __init__(self) -> None:
        self.epoch, self.batch, self.step = 0, 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch, self.step = state["epoch"], state["batch"], state["step"]


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="checkpointing_output")
    parser.add_argument("--checkpointing_steps", type=int, default=10)
    parser.add_argument("--resume_from_checkpoint", default=None, help="a checkpoint folder, or 'latest'")
    parser.add_argument("--stop_after", type=int, default=None, help="stop (as if killed) after this step")
    args = parser.parse_args()
    project = ProjectConfiguration(project_dir=args.output_dir, automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=project, mixed_precision=args.mixed_precision)
    set_seed(args.seed)
    train, evaluation = make_loaders(args.batch_size)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.7)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, train, evaluation, scheduler
    )
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if args.resume_from_checkpoint:
        folder = args.resume_from_checkpoint
        if folder == "latest":
            folders = sorted(
                (Path(args.output_dir) / "checkpoints").glob("checkpoint_*"),
                key=lambda p: int(p.name.split("_")[1]),
            )
            folder = str(folders[-1])
        accelerator.load_state(folder)
        accelerator.print(f"resumed from {folder} at step {progress.step}")
    first_epoch, skip = progress.epoch, progress.batch
    for epoch in range(first_epoch, args.epochs):
        resumed_mid_epoch = epoch == first_epoch and skip > 0
        batches = accelerator.skip_first_batches(train, skip) if resumed_mid_epoch else train
        for i, (x, y) in enumerate(batches, start=skip if resumed_mid_epoch else 0):
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.epoch, progress.batch, progress.step = epoch, i + 1, progress.step + 1
            if progress.step % args.checkpointing_steps == 0:
                accelerator.save_state()
            if args.stop_after is not None and progress.step == args.stop_after:
                accelerator.print(f"stopped_at={progress.step} (as if the job had been killed)")
                accelerator.end_training()
                return
        progress.epoch, progress.batch = epoch + 1, 0
        accuracy, _ = evaluate(accelerator, model, evaluation)
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f}")
    accelerator.print(
        f"final_step={progress.step} weights={fingerprint(accelerator.unwrap_model(model))} accuracy={accuracy:.3f}"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
