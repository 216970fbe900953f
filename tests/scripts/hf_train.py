"""A tiny GPT-2 (built from a config, randomly initialised: no download) trained by the
transformers Trainer with TorchdoctorCallback. --plant-nan corrupts one embedding row, as a
damaged checkpoint would. Prints one JSON line: what the Trainer and the callback saw."""

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from torchdoctor.integrations.huggingface import TorchdoctorCallback

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--plant-nan", action="store_true")
args = parser.parse_args()

VOCAB, LENGTH = 64, 16
torch.manual_seed(0)
config = GPT2Config(
    n_layer=2,
    n_embd=32,
    n_head=2,
    vocab_size=VOCAB,
    n_positions=LENGTH,
    bos_token_id=0,
    eos_token_id=0,
)
model = GPT2LMHeadModel(config)
if args.plant_nan:
    with torch.no_grad():
        model.transformer.wte.weight[7] = float("nan")


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(i))
        ids[0] = 7  # every sample reads the planted row
        return {"input_ids": ids, "labels": ids}


callback = TorchdoctorCallback()
training_args = TrainingArguments(
    output_dir=args.out,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=args.accum,
    max_steps=args.steps,
    logging_steps=1,
    report_to=[],
    disable_tqdm=True,
    save_strategy="no",
    use_cpu=True,
)
dataset = RandomTokens()
trainer = Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=[callback])
trainer.train()
print(
    json.dumps(
        {
            "global_step": trainer.state.global_step,
            "run_dir": str(callback.run_dir or ""),
            "report": str(callback.report_path or ""),
            "log_history": trainer.state.log_history,
        }
    )
)
