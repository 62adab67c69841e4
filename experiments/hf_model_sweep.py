"""Hugging Face architectures at tiny sizes, compiled with ember against eager on the CPU: inference output,
and one training step's loss and parameter gradients (float32), with ember's counters of what ran eagerly.

    PYTHONPATH=<transformers> python -m experiments.hf_model_sweep [--models gpt2,t5] [--modes infer,train]
                                                                   [--dynamic]

Each model is built from its config class with 2 layers, hidden size 64 (where the config has those
fields), random weights (seed 0), batch 2 x 16 tokens (or the modality's input). One line per model and
mode: max |ember - eager| of the output (or loss) and over the gradients relative to the largest gradient,
eager fallbacks (whole graphs run eagerly), ATen fallbacks (ops ember did not lower), Dynamo graphs.
--dynamic compiles with `dynamic=True` and calls the model with two more batch and sequence sizes (images:
batch sizes), each compared with eager; the line reports the largest differences over the calls.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import traceback

import torch

import ember

SMALL = dict(num_hidden_layers=2, num_layers=2, n_layer=2, hidden_size=64, d_model=64, n_embd=64,
             num_attention_heads=4, n_head=4, encoder_attention_heads=4, decoder_attention_heads=4,
             num_heads=4, intermediate_size=128, d_ff=128, n_inner=128, encoder_ffn_dim=128,
             decoder_ffn_dim=128, encoder_layers=2, decoder_layers=2, num_decoder_layers=2, vocab_size=1000,
             max_position_embeddings=128, num_key_value_heads=2, d_kv=16, head_dim=16)

# name: (config class, model class, input kind)
MODELS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "tokens"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "tokens"),
    "mistral": ("MistralConfig", "MistralForCausalLM", "tokens"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "tokens"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "tokens"),
    "phi": ("PhiConfig", "PhiForCausalLM", "tokens"),
    "opt": ("OPTConfig", "OPTForCausalLM", "tokens"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", "tokens"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "tokens"),
    "bert": ("BertConfig", "BertForMaskedLM", "tokens"),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", "tokens"),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM", "tokens"),
    "albert": ("AlbertConfig", "AlbertForMaskedLM", "tokens"),
    "electra": ("ElectraConfig", "ElectraForMaskedLM", "tokens"),
    "deberta_v2": ("DebertaV2Config", "DebertaV2ForMaskedLM", "tokens"),
    "t5": ("T5Config", "T5ForConditionalGeneration", "seq2seq"),
    "bart": ("BartConfig", "BartForConditionalGeneration", "seq2seq"),
    "vit": ("ViTConfig", "ViTForImageClassification", "image"),
    "swin": ("SwinConfig", "SwinForImageClassification", "image"),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification", "image"),
    "resnet": ("ResNetConfig", "ResNetForImageClassification", "image"),
    "clip_vision": ("CLIPVisionConfig", "CLIPVisionModel", "image"),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model", "audio"),
}
# dropout as config fields (functional dropout, LayerDrop): off, so eager and ember compute the same function
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, hidden_dropout=0.0,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0, layerdrop=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0, dropout_rate=0.0,
                  classifier_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, activation_dropout_prob=0.0,
                  drop_path_rate=0.0, qa_dropout=0.0, seq_classif_dropout=0.0, summary_first_dropout=0.0,
                  mask_time_prob=0.0, mask_feature_prob=0.0)   # wav2vec2's SpecAugment draws its masks with numpy
IMAGE_CONFIG = dict(image_size=32, patch_size=8, num_channels=3, embed_dim=32, depths=[1, 1], num_heads=[2, 2],
                    window_size=4, hidden_sizes=[16, 32], depths_convnext=[1, 1], num_labels=10)


def build(name: str, batch: int = 2, length: int = 16):
    import transformers
    cfg_name, model_name, kind = MODELS[name]
    cfg_cls = getattr(transformers, cfg_name)
    defaults = cfg_cls().to_dict()
    kw = {k: v for k, v in {**SMALL, **NO_DROPOUT}.items() if k in defaults}
    if kind == "image":
        kw.update({k: v for k, v in IMAGE_CONFIG.items() if k in defaults or k == "num_labels"})
        if name == "convnext":
            kw.update(depths=[1, 1], hidden_sizes=[16, 32], num_stages=2)
        if name == "resnet":
            kw.update(depths=[1, 1], hidden_sizes=[16, 32], embedding_size=16)
        if name == "swin":
            kw.update(embed_dim=32, depths=[1, 1], num_heads=[2, 2], patch_size=4)
    if name == "wav2vec2":
        kw.update(conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                  num_conv_pos_embedding_groups=4)
    if kind == "seq2seq":
        kw.update(decoder_start_token_id=0, pad_token_id=0)
    cfg = cfg_cls(**kw)
    if hasattr(cfg, "_attn_implementation"):
        cfg._attn_implementation = "sdpa" if "sdpa" in str(getattr(cfg, "_attn_implementation", "")) else \
            cfg._attn_implementation
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(cfg)
    g = torch.Generator().manual_seed(1)
    if kind == "tokens":
        ids = torch.randint(0, 1000, (batch, length), generator=g)
        return model, {"input_ids": ids, "labels": ids}
    if kind == "seq2seq":
        ids = torch.randint(0, 1000, (batch, length), generator=g)
        return model, {"input_ids": ids, "labels": torch.randint(0, 1000, (batch, length - 4), generator=g)}
    if kind == "image":
        x = torch.randn(batch, 3, 32, 32, generator=g)
        return model, ({"pixel_values": x, "labels": torch.randint(0, 10, (batch,), generator=g)}
                       if "Classification" in model_name else {"pixel_values": x})
    return model, {"input_values": torch.randn(batch, 100 * length, generator=g)}


def _output(out):
    if getattr(out, "loss", None) is not None:
        return out.loss
    t = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    return t.float().pow(2).mean()


# (batch, sequence length) of the calls after the first under --dynamic
DYNAMIC_SIZES = [(3, 23), (5, 37)]


def run(name: str, mode: str, dynamic: bool = False) -> str:
    model, inputs = build(name)
    model.train(mode == "train")
    if mode == "train":   # dropout off: eager and ember must draw the same masks otherwise
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    ours = copy.deepcopy(model)
    ember.metrics.reset()
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="ember", dynamic=True if dynamic else None)
    calls = [inputs] + ([build(name, b, n)[1] for b, n in DYNAMIC_SIZES] if dynamic else [])
    worst = [0.0, 0.0, 0]
    for call in calls:
        worst = [max(w, d) for w, d in zip(worst, _compare(model, ours, compiled, call, mode))]
    if mode == "infer":
        detail = f"out max|diff| {worst[0]:.2e} (of {worst[1]:.2e})"
    else:
        detail = f"loss |diff| {worst[0]:.2e}, grad max|diff|/max {worst[1]:.2e}" + \
            (f", {worst[2]} grads missing" if worst[2] else "")
    m = ember.metrics
    return f"{detail}; eager fallbacks {m.eager_fallbacks}, aten fallbacks {dict(m.fallbacks)}, " \
           f"graphs {m.graphs_compiled}"


def _compare(model, ours, compiled, inputs, mode: str) -> tuple:
    """One call of eager and of the compiled copy: inference (max |diff|, max |eager|, 0); training (loss
    |diff|, gradients' max |diff| relative to the largest gradient, gradients present on one side only)."""
    if mode == "infer":
        with torch.no_grad():
            e, c = model(**inputs), compiled(**inputs)
        key = "logits" if getattr(e, "logits", None) is not None else "last_hidden_state"
        return (getattr(e, key) - getattr(c, key)).abs().max().item(), getattr(e, key).abs().max().item(), 0
    model.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    le, lc = _output(model(**inputs)), _output(compiled(**inputs))
    le.backward()
    lc.backward()
    gmax = max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)
    gdiff = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), ours.parameters())
                if p.grad is not None and q.grad is not None)
    missing = sum((p.grad is None) != (q.grad is None) for p, q in zip(model.parameters(), ours.parameters()))
    return abs(le.item() - lc.item()), gdiff / gmax, missing


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--dynamic", action="store_true")
    a = p.parse_args(argv)
    importlib.import_module("transformers")
    report_each(a.models.split(","), a.modes.split(","), lambda name, mode: run(name, mode, a.dynamic))


def report_each(names: list, modes: list, run_case, width: int = 12) -> None:
    """Print one line per model and mode: run_case(name, mode)'s text, or the error it raised."""
    for name in names:
        for mode in modes:
            try:
                line = run_case(name, mode)
            except Exception as e:                  # noqa: BLE001 - a sweep reports and goes on
                line = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:200]}\n" + \
                    "".join(traceback.format_exc(limit=-3).splitlines(True)[-6:])
            print(f"{name:{width}} {mode:5} {line}", flush=True)


if __name__ == "__main__":
    main()
