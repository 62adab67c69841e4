"""Hugging Face GPT-2 training steps compiled by ember (needs transformers), e.g. for the report:
    ember report examples/hf_gpt2_train.py cuda 12 8 1024 8     (args: device layers batch seq steps)"""
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
layers, batch, seq, steps = (int(a) for a in (sys.argv[2:6] if len(sys.argv) > 5 else ("2", "2", "128", "8")))
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(n_layer=layers)).to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
cm = torch.compile(m, backend="ember")
x = torch.randint(0, 50000, (batch, seq), device=dev)
for i in range(steps):
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=(dev == "cuda")):
        loss = cm(x, labels=x).loss
    loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
print("loss", loss.item())
