"""Find the largest batch size that fits: `find_executable_batch_size` retries at 90 % after an OOM.

    accelerando launch --cpu --num_processes 2 examples/by_feature/memory.py --starting_batch_size 128 --simulate_oom_above 64

On a GPU, out-of-memory errors come by themselves. On CPU there are none to catch, so
`--simulate_oom_above N` raises the same `torch.OutOfMemoryError` for batch sizes above N to
show the retries. Everything built inside the decorated function is rebuilt at the smaller size.
"""

from __future__ import annotations

import torch
from _common import base_parser, evaluate, make_loaders, make_model

from accelerando import Accelerator
from accelerando.utils import find_executable_batch_size, set_seed


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--starting_batch_size", type=int, default=128)
    parser.add_argument("--simulate_oom_above", type=int, default=None)
    args = parser.parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=args.starting_batch_size)
    def train_loop(batch_size: int) -> float:
        accelerator.free_memory()  # drop references prepared by a failed attempt
        tried.append(batch_size)
        if args.simulate_oom_above is not None and batch_size > args.simulate_oom_above:
            raise torch.OutOfMemoryError("CUDA out of memory. (simulated on CPU by --simulate_oom_above)")
        set_seed(args.seed)
        train, evaluation = make_loaders(batch_size)
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
        for _ in range(args.epochs):
            for x, y in train:
                accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
        return evaluate(accelerator, model, evaluation)[0]

    accuracy = train_loop()
    accelerator.print(f"tried={','.join(map(str, tried))} batch_size={tried[-1]} accuracy={accuracy:.3f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
