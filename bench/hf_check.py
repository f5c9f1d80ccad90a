"""memc's Hugging Face imports against transformers, on the CPU, in fp32.

For each architecture `memc import` writes, a small config (every dimension distinct, so a
transposed or misplaced weight cannot go unnoticed) is instantiated by transformers with
random weights and saved with `save_pretrained`; memc imports the same config.json, loads
that checkpoint by name (`--params DIR`) and runs one step on the same batch with `--dump`.
The check compares the loss and the gradient of every parameter with PyTorch's (the loss as
memc's model defines it: cross-entropy of every position against `targets`, mean over
the positions whose target is not -100), and prints the largest relative differences. The
models that take an `attention_mask` (BERT, GPT-2 and the LLaMA line) get a batch whose second row
is padded, masked in both and with labels -100 there: at its end for BERT, at its start for
the causal decoders (left padding, as batched generation pads; padding at the end would
change nothing that a causal model's loss sees).

Exit status 1 when a loss or a gradient differs by more than `--rtol` (relative to the
gradient's largest magnitude).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers

B, T = 2, 12

# Small configs: distinct sizes everywhere, fp32, no dropout.
DECODER = dict(
    hidden_size=48, intermediate_size=80, num_attention_heads=6, num_key_value_heads=2,
    num_hidden_layers=2, vocab_size=96, max_position_embeddings=T, rms_norm_eps=1e-5,
    rope_theta=10000.0, torch_dtype="float32", tie_word_embeddings=False,
    attention_dropout=0.0,
)
CONFIGS = {
    "llama": dict(DECODER, model_type="llama", hidden_act="silu"),
    "qwen2": dict(DECODER, model_type="qwen2", hidden_act="silu", use_sliding_window=False),
    "mistral": dict(DECODER, model_type="mistral", hidden_act="silu", sliding_window=5),
    "gemma": dict(DECODER, model_type="gemma", head_dim=16, hidden_act="gelu_pytorch_tanh",
                  hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
    # Three layers: local (window 5 of 12 positions), global, local; weights large enough
    # (initializer_range) that both soft caps bend the scores and the logits.
    "gemma2": dict(DECODER, model_type="gemma2", head_dim=16, num_hidden_layers=3,
                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                   query_pre_attn_scalar=24, sliding_window=5, attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0, initializer_range=0.3),
    "phi3": dict(DECODER, model_type="phi3", hidden_act="silu", sliding_window=7,
                 pad_token_id=0, embd_pdrop=0.0, resid_pdrop=0.0),
    "gpt2": dict(model_type="gpt2", n_embd=48, n_head=6, n_layer=2, n_positions=T,
                 vocab_size=96, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, torch_dtype="float32"),
    "bert": dict(model_type="bert", hidden_size=48, intermediate_size=80,
                 num_attention_heads=6, num_hidden_layers=2, vocab_size=96,
                 max_position_embeddings=T, type_vocab_size=2, hidden_act="gelu",
                 layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0, torch_dtype="float32"),
    "vit": dict(model_type="vit", hidden_size=48, intermediate_size=80,
                num_attention_heads=6, num_hidden_layers=2, image_size=16, patch_size=4,
                num_channels=3, hidden_act="gelu", layer_norm_eps=1e-12, qkv_bias=True,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                id2label={str(i): f"c{i}" for i in range(5)}, torch_dtype="float32"),
}
CLASSES = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM",
           "vit": "ViTForImageClassification"}
# The models memc imports with an `attention_mask` input, and how many tokens of row 1 pad it.
MASKED = {"bert", "gpt2", "llama", "qwen2", "mistral", "gemma", "gemma2", "phi3"}
PADDING = 3


def batch(name, config, rng):
    """memc's inputs (name -> array) and the transformers call that computes the loss."""
    if name == "vit":
        pixels = rng.standard_normal((B, 3, 16, 16)).astype(np.float32)
        labels = rng.integers(0, 5, size=(B,)).astype(np.int32)

        def loss(model):
            logits = model(pixel_values=torch.from_numpy(pixels)).logits
            return F.cross_entropy(logits, torch.from_numpy(labels).long())
        return {"pixel_values": pixels, "labels": labels}, loss
    vocab = config["vocab_size"]
    tokens = rng.integers(0, vocab, size=(B, T)).astype(np.int32)
    tokens[0, -1] = 0  # the padding token of those that have one: its row gets no gradient
    targets = rng.integers(0, vocab, size=(B, T)).astype(np.int32)
    targets[1, : T // 2] = -100  # no loss there (a prompt, padding, unmasked tokens)
    inputs = {"tokens": tokens, "targets": targets}
    kwargs = {"input_ids": torch.from_numpy(tokens).long()}
    if name in MASKED:
        mask = np.ones((B, T), dtype=np.int32)
        padding = slice(-PADDING, None) if name == "bert" else slice(0, PADDING)
        mask[1, padding] = 0
        targets[1, padding] = -100
        inputs["attention_mask"] = mask
        kwargs["attention_mask"] = torch.from_numpy(mask).long()
    if name == "bert":
        types = rng.integers(0, 2, size=(B, T)).astype(np.int32)
        inputs["token_type_ids"] = types
        kwargs["token_type_ids"] = torch.from_numpy(types).long()

    def loss(model):
        logits = model(**kwargs).logits
        return F.cross_entropy(logits.reshape(-1, vocab), torch.from_numpy(targets).long().reshape(-1))
    return inputs, loss


def checkpoint_grads(model, d):
    """Every parameter's gradient under its checkpoint name (transformers may name modules
    otherwise in memory): the gradients saved in the parameters' place by save_pretrained."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.grad)
    model.save_pretrained(d, safe_serialization=True)
    from safetensors.numpy import load_file
    return load_file(os.path.join(d, "model.safetensors"))


def check(memc, name, config, rtol, work):
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    d = os.path.join(work, name)
    os.makedirs(d)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    cfg = transformers.AutoConfig.from_pretrained(d)
    cls = getattr(transformers, CLASSES.get(name, type(cfg).__name__.replace("Config", "ForCausalLM")))
    if name == "gpt2" or name == "bert":
        cfg.tie_word_embeddings = True
    cfg._attn_implementation = "eager"
    model = cls(cfg).float()
    with torch.no_grad():  # nonzero biases and norm weights, so each one is checked
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(d, safe_serialization=True)
    model.train()
    inputs, loss_of = batch(name, config, rng)
    loss = loss_of(model)
    loss.backward()
    grads = checkpoint_grads(model, os.path.join(d, "grads"))
    mdl = os.path.join(d, "model.mdl")
    subprocess.run([memc, "import", cfg_path, "-o", mdl], check=True, capture_output=True)
    args = [memc, "run", mdl, "--params", d, "--dump", os.path.join(d, "dump"),
            "--precision", "fp32", "--set", f"B={B}"]
    if name != "vit":
        args += ["--set", f"T={T}"]
    for key, value in inputs.items():
        path = os.path.join(d, f"{key}.npy")
        np.save(path, value)
        args += ["--input", f"{key}={path}"]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        print(f"{name}: memc run failed:\n{run.stderr}")
        return False
    ours = float(np.load(os.path.join(d, "dump", "loss.npy")).reshape(-1)[0])
    worst, ok = (0.0, ""), abs(ours - loss.item()) <= rtol * abs(loss.item())
    dumped = [f for f in os.listdir(os.path.join(d, "dump")) if f.startswith("grad.")]
    for f in dumped:
        pname = f[len("grad."):-len(".npy")]
        base = pname.split(".", 1)[1] if pname not in grads else pname
        theirs = grads.get(pname, grads.get(base))
        if theirs is None:
            print(f"{name}: memc parameter {pname} has no transformers gradient")
            ok = False
            continue
        g = np.load(os.path.join(d, "dump", f))
        t = theirs
        # A floor for gradients that are zero in exact arithmetic (key biases): rounding.
        err = float(np.abs(g - t).max() / max(np.abs(t).max(), 1e-4))
        worst = max(worst, (err, pname))
    ok = ok and worst[0] <= rtol and len(dumped) == len(grads)
    print(f"{name:8} loss memc {ours:.7f} torch {loss.item():.7f}; {len(dumped)} of "
          f"{len(grads)} gradients, largest relative difference {worst[0]:.1e} ({worst[1]})"
          f"{'' if ok else '  FAIL'}")
    return ok


def check_lora(memc, rtol, work):
    """Adapters trained by memc (`--lora`, 3 steps) and saved with `--save-adapters`, loaded
    onto the base model by PEFT: PEFT's loss equals memc's fourth step's."""
    import peft
    name, config = "llama", CONFIGS["llama"]
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    d = os.path.join(work, "lora")
    os.makedirs(d)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    model = transformers.LlamaForCausalLM(transformers.AutoConfig.from_pretrained(d)).float()
    model.save_pretrained(d, safe_serialization=True)
    inputs, loss_of = batch(name, config, rng)
    mdl = os.path.join(d, "model.mdl")
    subprocess.run([memc, "import", cfg_path, "-o", mdl], check=True, capture_output=True)
    args = [memc, "run", mdl, "--params", d, "--precision", "fp32", "--set", f"B={B}",
            "--set", f"T={T}", "--lora", "r=4,alpha=8,targets=q_proj+v_proj"]
    for key, value in inputs.items():
        np.save(os.path.join(d, f"{key}.npy"), value)
        args += ["--input", f"{key}={os.path.join(d, key)}.npy"]
    adapters = os.path.join(d, "adapters")
    subprocess.run(args + ["--steps", "3", "--save-adapters", adapters], check=True,
                   capture_output=True)
    out = subprocess.run(args + ["--steps", "4"], check=True, capture_output=True, text=True)
    ours = float(out.stdout.strip().splitlines()[-1].split()[-1])
    adapted = peft.PeftModel.from_pretrained(model, adapters)
    adapted.eval()
    with torch.no_grad():
        theirs = loss_of(adapted).item()
    ok = abs(ours - theirs) <= rtol * abs(theirs)
    print(f"lora     loss after 3 steps: memc {ours:.7f}, PEFT with memc's adapters "
          f"{theirs:.7f}{'' if ok else '  FAIL'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memc", default=os.environ.get("MEMC", "target/release/memc"))
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("models", nargs="*", default=list(CONFIGS) + ["lora"])
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as work:
        results = [check(a.memc, m, CONFIGS[m], a.rtol, work) for m in a.models if m != "lora"]
        if "lora" in a.models:
            results.append(check_lora(a.memc, a.rtol, work))
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
