"""dispatch_batches: rank 0's dataset raises mid-epoch while rank 1 waits for its next batch.

The job must end quickly with rank 0's error; rank 1 sees the channel close instead of hanging.
"""

import torch
from torch.utils.data import DataLoader, Dataset

from accelerando import Accelerator
from accelerando.config.options import DataLoaderConfiguration


class BreaksAt150(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 150:
            raise ValueError("sample 150 is corrupt on purpose")
        return torch.full((4,), float(i))


acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
loader = acc.prepare(DataLoader(BreaksAt150(), batch_size=4))
for batch in loader:
    acc.reduce(batch.sum())
