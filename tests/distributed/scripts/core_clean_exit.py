"""A script that ends without any cleanup call, or with `end_training()` (argument `end`), after a
dispatching loader: every rank must exit 0."""

import sys

import torch
from torch.utils.data import DataLoader

from accelerando import Accelerator, DataLoaderConfiguration

acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
model, opt = acc.prepare(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
loader = acc.prepare(DataLoader(torch.ones(8, 2), batch_size=2))
for x in loader:
    acc.backward(model(x).sum())
print(f"rank {acc.process_index} done", acc.gather(torch.tensor([acc.process_index])).tolist())
if sys.argv[1:] == ["end"]:
    acc.end_training()
