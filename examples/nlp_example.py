"""Fine-tune a (tiny, randomly initialised) BERT classifier: Accelerate's NLP example, offline.

    accelerando launch --cpu --num_processes 2 examples/nlp_example.py
    accelerando launch --num_processes 8 --mixed_precision bf16 examples/nlp_example.py   # same code on GPUs

The data are generated token sequences of varying length; the label says whether a "keyword"
token occurs in the sequence. Batches are padded per batch by the collate function, so the
evaluation gathers predictions of different sequence lengths across processes.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

from accelerando import Accelerator
from accelerando.utils import set_seed

VOCAB, KEYWORD, PAD = 64, 7, 0


def make_examples(n: int, seed: int) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(n):
        length = int(torch.randint(8, 33, (1,), generator=g))
        ids = torch.randint(2, VOCAB, (length,), generator=g)
        examples.append(([1, *ids.tolist()], int((ids == KEYWORD).any())))  # 1 plays [CLS]
    return examples


def collate(batch: list[tuple[list[int], int]]) -> dict[str, torch.Tensor]:
    longest = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), longest), PAD)
    attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
    for row, (ids, _) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    labels = torch.tensor([label for _, label in batch])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--train_size", type=int, default=2048)
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(42)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, num_labels=2,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    train = DataLoader(
        make_examples(args.train_size, seed=0), batch_size=args.batch_size, shuffle=True, collate_fn=collate
    )
    evaluation = DataLoader(make_examples(501, seed=1), batch_size=args.batch_size, collate_fn=collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, 10, args.epochs * len(train))
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, train, evaluation, scheduler
    )
    for epoch in range(args.epochs):
        model.train()
        for batch in train:
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for batch in evaluation:
                preds = model(**batch).logits.argmax(dim=-1)
                preds, labels = accelerator.gather_for_metrics((preds, batch["labels"]))
                correct += (preds == labels).sum().item()
                seen += labels.numel()
        accelerator.print(f"epoch {epoch}: accuracy {correct / seen:.3f} on {seen} samples")
    accelerator.print(f"accuracy={correct / seen:.3f} eval_samples={seen}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
