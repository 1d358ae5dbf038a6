"""A script that ends without any cleanup call: every rank must exit 0."""

import torch

from accelerando import Accelerator

acc = Accelerator()
model, opt = acc.prepare(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
acc.backward(model(torch.ones(1, 2)).sum())
print(f"rank {acc.process_index} done", acc.gather(torch.tensor([acc.process_index])).tolist())
