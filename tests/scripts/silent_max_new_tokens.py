"""generate() returning more new tokens than max_new_tokens (TrainCheck's transformers-23723).
Whisper's generate() took a text prompt (`prompt_ids`), forced its tokens as the first ones
generated, and so raised `max_new_tokens` by the prompt's length; it counted the prompt before
trimming it to fit the context window, so a long prompt let the model generate more tokens than
asked for. The installed transformers does not have that code: the model here (a tiny GPT-2
built from a config, nothing downloaded) plants the same mechanism in a generate() of its own,
the prompt forced by a logits processor and then cut out of the answer, as Whisper did.
--fixed trims the prompt before counting it. Plain generate() calls run in both."""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LogitsProcessor, LogitsProcessorList

FIXED = "--fixed" in sys.argv
VOCAB, CONTEXT = 64, 64
PROMPT_ROOM = CONTEXT // 4  # what is left of a prompt once trimmed


class ForcePrompt(LogitsProcessor):
    """The prompt's tokens as the first ones generated (as Whisper's forced decoder ids)."""

    def __init__(self, start, prompt_ids):
        self.start, self.prompt_ids = start, prompt_ids

    def __call__(self, input_ids, scores):
        i = input_ids.shape[-1] - self.start
        if 0 <= i < self.prompt_ids.shape[-1]:
            forced = torch.full_like(scores, float("-inf"))
            forced.scatter_(1, self.prompt_ids[:, i : i + 1], 0.0)
            return forced
        return scores


class PromptedLM(GPT2LMHeadModel):
    def generate(self, input_ids=None, prompt_ids=None, max_new_tokens=None, **kwargs):
        if prompt_ids is None:
            return super().generate(input_ids, max_new_tokens=max_new_tokens, **kwargs)
        if FIXED:
            prompt_ids = prompt_ids[:, -PROMPT_ROOM:]
        # the prompt is generated first, so it counts against the limit ...
        max_new_tokens += prompt_ids.shape[-1]
        # ... and is trimmed to fit the context window (after it was counted: the bug)
        prompt_ids = prompt_ids[:, -PROMPT_ROOM:]
        start = input_ids.shape[-1]
        forcing = LogitsProcessorList([ForcePrompt(start, prompt_ids)])
        out = super().generate(
            input_ids, max_new_tokens=max_new_tokens, logits_processor=forcing, **kwargs
        )
        return torch.cat([out[:, :start], out[:, start + prompt_ids.shape[-1] :]], dim=-1)


torch.manual_seed(0)
config = GPT2Config(
    vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
    bos_token_id=None, eos_token_id=None, pad_token_id=0,
)  # fmt: skip
model = PromptedLM(config).eval()
model.generation_config.pad_token_id = 0
for i in range(3):
    input_ids = torch.randint(1, VOCAB, (2, 6))
    mask = torch.ones_like(input_ids)
    plain = model.generate(input_ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert plain.shape[-1] <= 6 + 8, plain.shape
    prompt_ids = torch.randint(1, VOCAB, (2, 12 + 4 * i))  # longer than the room left for it
    answer = model.generate(
        input_ids, prompt_ids=prompt_ids, attention_mask=mask, max_new_tokens=8, do_sample=False
    )
    print(f"asked for 8 new tokens, got {answer.shape[-1] - input_ids.shape[-1]}")
