"""Local SGD: each process steps on its own gradients; parameters are averaged every K steps.

    accelerando launch --cpu --num_processes 2 examples/by_feature/local_sgd.py --local_sgd_steps 8

Inside `LocalSGD` there is no gradient all-reduce; one parameter all-reduce every K steps replaces
K of them, which pays off when the network, not the computation, is the bottleneck.
"""

from __future__ import annotations

import torch
from _common import base_parser, evaluate, make_loaders, make_model

from accelerando import Accelerator
from accelerando.local_sgd import LocalSGD
from accelerando.utils import set_seed


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--local_sgd_steps", type=int, default=8)
    args = parser.parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(args.seed)
    train, evaluation = make_loaders(args.batch_size)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
    for epoch in range(args.epochs):
        with LocalSGD(accelerator, model, local_sgd_steps=args.local_sgd_steps) as local_sgd:
            for x, y in train:
                accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()
        accuracy, _ = evaluate(accelerator, model, evaluation)  # replicas are equal after the context
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f}")
    replicas = accelerator.gather(torch.cat([p.detach().reshape(1, -1) for p in model.parameters()], dim=1))
    accelerator.print(
        f"replicas_equal={bool(torch.equal(replicas[0], replicas[-1]))} accuracy={accuracy:.3f}"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
