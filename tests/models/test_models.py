"""Small models trained and evaluated with ember against eager: outputs, parameter gradients, buffers."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.testing import MLP, assert_close


def train_and_compare(model, make_batch, steps=3, lr=0.05, rtol=1e-4, atol=1e-5, loss_fn=None):
    """Train a copy of `model` eagerly and one compiled with ember side by side; compare every step."""
    torch.manual_seed(0)
    eager = model
    ours = copy.deepcopy(model)
    compiled = torch.compile(ours, backend="ember")
    opt_e = torch.optim.SGD(eager.parameters(), lr=lr)
    opt_c = torch.optim.SGD(ours.parameters(), lr=lr)
    for step in range(steps):
        batch = make_batch()
        out_e, out_c = eager(*batch), compiled(*batch)
        assert_close(out_c, out_e, rtol, atol, what=f"step {step} output")
        loss_e = out_e if loss_fn is None else loss_fn(out_e, batch)
        loss_c = out_c if loss_fn is None else loss_fn(out_c, batch)
        loss_e.backward()
        loss_c.backward()
        for (name, pe), pc in zip(eager.named_parameters(), ours.parameters()):
            assert_close(pc.grad, pe.grad, rtol, atol, what=f"step {step} grad of {name}")
        for (name, be), bc in zip(eager.named_buffers(), ours.buffers()):
            assert_close(bc, be, rtol, atol, what=f"step {step} buffer {name}")
        for opt in (opt_e, opt_c):
            opt.step()
            opt.zero_grad()
    assert ember.metrics.eager_fallbacks == 0
    return compiled


def eval_and_compare(model, *inputs, rtol=1e-4, atol=1e-5):
    model.eval()
    ours = copy.deepcopy(model)
    compiled = torch.compile(ours, backend="ember")
    with torch.no_grad():
        for _ in range(2):
            assert_close(compiled(*inputs), model(*inputs), rtol, atol)
    for (name, be), bc in zip(model.named_buffers(), ours.buffers()):
        assert_close(bc, be, rtol, atol, what=f"buffer {name}")
    assert ember.metrics.eager_fallbacks == 0


# --- MLP ---------------------------------------------------------------------------------------------------

def test_mlp(device):
    model = MLP().to(device)
    train_and_compare(model, lambda: (torch.randn(16, 32, device=device), torch.randint(0, 10, (16,), device=device)))


def test_mlp_eval(device):
    eval_and_compare(MLP().to(device), torch.randn(16, 32, device=device), torch.randint(0, 10, (16,), device=device))


# --- a transformer encoder block, written with plain ops -----------------------------------------------------

class EncoderBlock(nn.Module):
    def __init__(self, d=32, heads=4, ff=64):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def attention(self, x, mask):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / (d // h) ** 0.5
        scores = scores.masked_fill(mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, d)
        return self.proj(out)

    def forward(self, x):
        s = x.shape[1]
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        x = x + self.attention(self.ln1(x), mask)
        x = x + self.ff2(F.gelu(self.ff1(self.ln2(x)), approximate="tanh"))
        return x


class TinyTransformer(nn.Module):
    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(16, d) * 0.02)
        self.blocks = nn.Sequential(EncoderBlock(d), EncoderBlock(d))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens, targets):
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        logits = self.head(self.ln(self.blocks(x)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def test_encoder_block(device):
    block = EncoderBlock().to(device)
    train_and_compare(block, lambda: (torch.randn(2, 8, 32, device=device),), loss_fn=lambda out, _: (out ** 2).mean(),
                      rtol=1e-4, atol=1e-4)


def test_tiny_transformer(device):
    model = TinyTransformer().to(device)
    train_and_compare(model, lambda: (torch.randint(0, 50, (2, 12), device=device),
                                      torch.randint(0, 50, (2, 12), device=device)), steps=2, rtol=1e-4, atol=1e-4)


# --- embedding + cross entropy -------------------------------------------------------------------------------

class Classifier(nn.Module):
    def __init__(self, vocab=40, d=16, classes=7):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.out = nn.Linear(d, classes)

    def forward(self, tokens, labels):
        pooled = self.emb(tokens).mean(1)
        return F.cross_entropy(self.out(torch.tanh(pooled)), labels, label_smoothing=0.1)


def test_embedding_cross_entropy(device):
    model = Classifier().to(device)
    train_and_compare(model, lambda: (torch.randint(0, 40, (8, 6), device=device), torch.randint(0, 7, (8,), device=device)))


def test_embedding_cross_entropy_ignore_index(device):
    model = Classifier().to(device)

    def batch():
        labels = torch.randint(0, 7, (8,), device=device)
        labels[::3] = -100
        return torch.randint(0, 40, (8, 6), device=device), labels
    train_and_compare(model, batch, steps=2)


# --- a module updating a buffer in place -------------------------------------------------------------------------

class RunningStats(nn.Module):
    def __init__(self, d=12):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("buf", torch.randn(d))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            self.buf.mul_(0.9).add_(y.detach().mean(0) * 0.1)
            self.steps.add_(1)
        return ((y - self.buf) ** 2).mean()


def test_in_place_buffer_update_training(device):
    model = RunningStats().to(device)
    train_and_compare(model, lambda: (torch.randn(10, 12, device=device),), steps=3)


def test_in_place_buffer_update_no_grad(device):
    model = RunningStats().to(device)
    ours = copy.deepcopy(model)
    compiled = torch.compile(ours, backend="ember")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(10, 12, device=device)
            assert_close(compiled(x), model(x))
    assert_close(ours.buf, model.buf, what="buf")
    assert int(ours.steps) == int(model.steps) == 3


# --- a tiny CNN: conv2d runs as an ATen fallback; batch norm in train and eval mode ---------------------------------

class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.b1(self.c1(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.b2(self.c2(x)) + x)
        return self.fc(x.mean((2, 3)))


def test_cnn_training_batchnorm(device):
    model = TinyCNN().to(device)
    train_and_compare(model, lambda: (torch.randn(4, 3, 8, 8, device=device),), steps=2,
                      loss_fn=lambda out, _: out.logsumexp(-1).mean(), rtol=1e-4, atol=1e-4)
    assert ember.metrics.fallbacks, "conv2d runs as an ATen fallback"


def test_cnn_eval_batchnorm(device):
    model = TinyCNN().to(device)
    with torch.no_grad():             # non-trivial running stats
        model.b1.running_mean.uniform_(-0.5, 0.5)
        model.b1.running_var.uniform_(0.5, 2.0)
        model.b2.running_mean.uniform_(-0.5, 0.5)
        model.b2.running_var.uniform_(0.5, 2.0)
    eval_and_compare(model, torch.randn(4, 3, 8, 8, device=device), rtol=1e-4, atol=1e-4)
