"""Profiling: `with accelerator.profile() as prof:` runs `torch.profiler`, one Chrome trace per process.

    accelerando launch --cpu --num_processes 2 examples/by_feature/profiler.py --trace_dir traces

Open `traces/profile_<rank>.json` in chrome://tracing or Perfetto. `ProfileKwargs` chooses the
activities (cpu, cuda, ...), a wait/warmup/active schedule, shapes, memory, stacks and FLOPs.
"""

from __future__ import annotations

import torch
from _common import base_parser, make_loaders, make_model

from accelerando import Accelerator
from accelerando.utils import ProfileKwargs, set_seed


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--trace_dir", default="profiler_traces")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    profile = ProfileKwargs(
        activities=["cpu"], record_shapes=True, with_flops=True, output_trace_dir=args.trace_dir
    )
    accelerator = Accelerator(kwargs_handlers=[profile], mixed_precision=args.mixed_precision)
    set_seed(args.seed)
    train, _ = make_loaders(args.batch_size)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    with accelerator.profile() as prof:
        for step, (x, y) in enumerate(train):
            if step == args.steps:
                break
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=8)
    accelerator.print(table)
    accelerator.print(f"trace={args.trace_dir}/profile_{accelerator.process_index}.json steps={args.steps}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
