"""PyTorch twins of memc's example models, in plain torch.nn.

Each twin has exactly the parameters of its .mdl (the benchmark asserts the counts) and
computes what the .mdl computes, written as a PyTorch user would: nn.Linear/Conv2d/
LayerNorm/GroupNorm/BatchNorm2d/RMSNorm modules, F.scaled_dot_product_attention,
F.cross_entropy. No dropout anywhere (the .mdl files have none). Index inputs are int64,
as nn.Embedding and F.cross_entropy expect (memc's are i32).

Every twin's forward calls its repeated blocks through `model.run_block`, which wraps each
in torch.utils.checkpoint when `model.checkpoint` is set, and runs the block (and so its
recomputation in backward) inside `model.block_context()`.
"""

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Twin(nn.Module):
    """A model whose forward(*inputs) returns the scalar loss."""

    def __init__(self):
        super().__init__()
        self.checkpoint = False
        self.block_context = contextlib.nullcontext

    def run_block(self, block, *args):
        def run(*a):
            with self.block_context():
                return block(*a)

        if self.checkpoint:
            return checkpoint(run, *args, use_reentrant=False)
        return run(*args)


def heads_split(x, heads):
    """[B, T, D] -> [B, heads, T, D / heads] (a view)."""
    b, t, d = x.shape
    return x.view(b, t, heads, d // heads).transpose(1, 2)


def heads_merge(x):
    """[B, heads, T, hd] -> [B, T, heads * hd]."""
    b, h, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, h * hd)


def attend(q, k, v, heads, causal):
    """Multi-head attention on [B, T, D] q, k, v with SDPA (flash kernel, no T x T)."""
    o = F.scaled_dot_product_attention(
        heads_split(q, heads), heads_split(k, heads), heads_split(v, heads), is_causal=causal
    )
    return heads_merge(o)


# ---------------------------------------------------------------- transformers (pre-norm)


class PreNormLayer(nn.Module):
    """GPT-2 / ViT encoder layer: x + attn(ln1(x)); x + mlp(ln2(x))."""

    def __init__(self, d, heads, causal, gelu_approx):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)
        self.heads, self.causal, self.approx = heads, causal, gelu_approx

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.proj(attend(q, k, v, self.heads, self.causal))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate=self.approx))


class Gpt2(Twin):
    """examples/gpt2.mdl: learned positions, tied embeddings, tanh-approximate GELU."""

    def __init__(self, V=50257, T=1024, D=768, H=12, L=12):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(V, D))
        self.wpe = nn.Parameter(torch.empty(T, D))
        self.layers = nn.ModuleList(PreNormLayer(D, H, True, "tanh") for _ in range(L))
        self.lnf = nn.LayerNorm(D)

    def forward(self, tokens, targets):
        x = F.embedding(tokens, self.wte) + self.wpe
        for layer in self.layers:
            x = self.run_block(layer, x)
        logits = self.lnf(x) @ self.wte.t()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class VitB16(Twin):
    """bench/models/vit_b16.mdl: patch conv, class token, learned positions, exact GELU."""

    def __init__(self, C=3, S=224, P=16, D=768, H=12, L=12, K=1000):
        super().__init__()
        n = (S // P) ** 2
        self.patch = nn.Conv2d(C, D, P, stride=P)
        self.cls = nn.Parameter(torch.empty(1, 1, D))
        self.pos = nn.Parameter(torch.empty(1, n + 1, D))
        self.layers = nn.ModuleList(PreNormLayer(D, H, False, "none") for _ in range(L))
        self.lnf = nn.LayerNorm(D)
        self.head = nn.Linear(D, K)

    def forward(self, images, labels):
        p = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(p.shape[0], -1, -1), p], dim=1) + self.pos
        for layer in self.layers:
            x = self.run_block(layer, x)
        return F.cross_entropy(self.head(self.lnf(x)[:, 0]), labels)


class PostNormLayer(nn.Module):
    """BERT encoder layer: ln1(x + attn(x)); ln2(x + ffn(x))."""

    def __init__(self, d, heads, f):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, f)
        self.fc_proj = nn.Linear(f, d)
        self.ln2 = nn.LayerNorm(d)
        self.heads = heads

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = self.ln1(x + self.proj(attend(q, k, v, self.heads, False)))
        return self.ln2(x + self.fc_proj(F.gelu(self.fc(x))))


class BertBase(Twin):
    """bench/models/bert_base.mdl: BERT-base, MLM head, decoder tied to the embeddings."""

    def __init__(self, V=30522, T=512, D=768, H=12, L=12, Fh=3072):
        super().__init__()
        self.word = nn.Parameter(torch.empty(V, D))
        self.position = nn.Parameter(torch.empty(T, D))
        self.segment = nn.Parameter(torch.empty(2, D))
        self.emb_ln = nn.LayerNorm(D)
        self.layers = nn.ModuleList(PostNormLayer(D, H, Fh) for _ in range(L))
        self.mlm_dense = nn.Linear(D, D)
        self.mlm_ln = nn.LayerNorm(D)
        self.mlm_bias = nn.Parameter(torch.zeros(V))

    def forward(self, tokens, segments, targets):
        x = F.embedding(tokens, self.word) + self.position + F.embedding(segments, self.segment)
        x = self.emb_ln(x)
        for layer in self.layers:
            x = self.run_block(layer, x)
        h = self.mlm_ln(F.gelu(self.mlm_dense(x)))
        logits = h @ self.word.t() + self.mlm_bias
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def rotate(x, cos, sin):
    """Rotary embedding on [B, heads, T, hd] (rotate-half pairing), in x's dtype."""
    a, b = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-b, a], dim=-1) * sin.to(x.dtype)


class LlamaLayer(nn.Module):
    """LLaMA layer: RMSNorm, rotary q/k, causal attention, SwiGLU MLP, no biases."""

    def __init__(self, d, heads, f):
        super().__init__()
        self.attn_norm = nn.RMSNorm(d, eps=1e-6)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.mlp_norm = nn.RMSNorm(d, eps=1e-6)
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)
        self.heads = heads

    def forward(self, x, cos, sin):
        h = self.attn_norm(x)
        q = rotate(heads_split(self.wq(h), self.heads), cos, sin)
        k = rotate(heads_split(self.wk(h), self.heads), cos, sin)
        v = heads_split(self.wv(h), self.heads)
        x = x + self.wo(heads_merge(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        m = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(m)) * self.w3(m))


class Llama(Twin):
    """examples/llama7b.mdl (any size via its dims): untied head, rotary positions."""

    def __init__(self, V=32000, T=2048, D=4096, H=32, L=32, Fh=11008):
        super().__init__()
        self.tok = nn.Parameter(torch.empty(V, D))
        self.layers = nn.ModuleList(LlamaLayer(D, H, Fh) for _ in range(L))
        self.norm = nn.RMSNorm(D, eps=1e-6)
        self.head = nn.Linear(D, V, bias=False)
        hd = D // H
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tokens, targets):
        x = F.embedding(tokens, self.tok)
        for layer in self.layers:
            x = self.run_block(layer, x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# ---------------------------------------------------------------- convolutional


class Basic(nn.Module):
    """ResNet basic block; with `stride` or a channel change, a 1x1 projection shortcut."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        h = F.relu(self.bn1(self.c1(x)))
        h = self.bn2(self.c2(h))
        return F.relu((x if self.proj is None else self.proj(x)) + h)


class ResNet18(Twin):
    """examples/resnet18.mdl (torchvision's resnet18 layout)."""

    def __init__(self, C=3, K=1000):
        super().__init__()
        self.stem = nn.Conv2d(C, 64, 7, stride=2, padding=3, bias=False)
        self.stem_bn = nn.BatchNorm2d(64)
        widths = [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1)]
        widths += [(128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1)]
        self.layers = nn.ModuleList(Basic(i, o, s) for i, o, s in widths)
        self.fc = nn.Linear(512, K)

    def forward(self, images, labels):
        x = F.relu(self.stem_bn(self.stem(images)))
        x = F.max_pool2d(x, 3, stride=2, padding=1)
        for layer in self.layers:
            x = self.run_block(layer, x)
        return F.cross_entropy(self.fc(x.mean((2, 3))), labels)


class Res(nn.Module):
    """UNet residual block with a time embedding (and a 1x1 skip when channels change)."""

    def __init__(self, cin, cout, groups, tdim):
        super().__init__()
        self.gn1 = nn.GroupNorm(groups, cin)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.tp = nn.Linear(tdim, cout)
        self.gn2 = nn.GroupNorm(groups, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, t):
        h = self.c1(F.silu(self.gn1(x)))
        h = h + self.tp(t)[:, :, None, None]
        h = self.c2(F.silu(self.gn2(h)))
        return (x if self.skip is None else self.skip(x)) + h


class Attn(nn.Module):
    """UNet self-attention over the pixels of a [B, ch, s, s] map."""

    def __init__(self, ch, groups, heads):
        super().__init__()
        self.gn = nn.GroupNorm(groups, ch)
        self.qkv = nn.Linear(ch, 3 * ch)
        self.proj = nn.Linear(ch, ch)
        self.heads = heads

    def forward(self, x, t):
        b, c, s, _ = x.shape
        h = self.gn(x).flatten(2).transpose(1, 2)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = self.proj(attend(q, k, v, self.heads, False))
        return x + h.transpose(1, 2).reshape(b, c, s, s)


class UNet(Twin):
    """examples/unet.mdl."""

    def __init__(self, C=3, M=64, G=32, TE=64, HEADS=4):
        super().__init__()
        self.t1 = nn.Linear(TE, 4 * M)
        self.t2 = nn.Linear(4 * M, 4 * M)
        self.conv_in = nn.Conv2d(C, M, 3, padding=1)
        self.down1 = nn.Conv2d(M, M, 3, stride=2, padding=1)
        self.down2 = nn.Conv2d(2 * M, 2 * M, 3, stride=2, padding=1)
        td = 4 * M
        self.s1 = Res(M, M, G, td)
        self.s2 = Res(M, 2 * M, G, td)
        self.mid1 = Res(2 * M, 2 * M, G, td)
        self.mid_attn = Attn(2 * M, G, HEADS)
        self.mid2 = Res(2 * M, 2 * M, G, td)
        self.up2 = Res(4 * M, 2 * M, G, td)
        self.up1 = Res(3 * M, M, G, td)
        self.gn_out = nn.GroupNorm(G, M)
        self.conv_out = nn.Conv2d(M, C, 3, padding=1)

    def forward(self, noisy, temb, noise):
        t = self.t2(F.silu(self.t1(temb)))
        run = self.run_block
        s1 = run(self.s1, self.conv_in(noisy), t)
        s2 = run(self.s2, self.down1(s1), t)
        x = self.down2(s2)
        x = run(self.mid1, x, t)
        x = run(self.mid_attn, x, t)
        x = run(self.mid2, x, t)
        up = lambda y: F.interpolate(y, scale_factor=2, mode="nearest")  # noqa: E731
        x = run(self.up2, torch.cat([up(x), s2], dim=1), t)
        x = run(self.up1, torch.cat([up(x), s1], dim=1), t)
        eps = self.conv_out(F.silu(self.gn_out(x)))
        return F.mse_loss(eps, noise)


def init_(model):
    """Small normal weights (the values do not change memory; real runs stay finite)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 or name.endswith(("cls", "pos")):
                p.normal_(0.0, 0.02)
    return model


def _ids(shape, high):
    return torch.randint(0, high, shape, dtype=torch.int64)


# name -> spec: the memc spec, `dims` (the sizes both sides use, passed to memc as --set),
# `tiny` (the sizes of the validation runs, twin only), the twin and its inputs, the
# optimizer the spec's `train` section names, and its gradient clipping.
MODELS = {
    "resnet18": dict(
        spec="examples/resnet18.mdl",
        dims=dict(B=32, S=224),
        tiny=dict(B=8, S=64),
        make=lambda d: ResNet18(),
        inputs=lambda d: (torch.randn(d["B"], 3, d["S"], d["S"]), _ids((d["B"],), 1000)),
        optimizer="sgd",
    ),
    "vit_b16": dict(
        spec="bench/models/vit_b16.mdl",
        dims=dict(B=32, S=224, L=12),
        tiny=dict(B=8, S=64, L=2, D=64, H=4),
        make=lambda d: VitB16(S=d["S"], L=d["L"], D=d.get("D", 768), H=d.get("H", 12)),
        inputs=lambda d: (torch.randn(d["B"], 3, d["S"], d["S"]), _ids((d["B"],), 1000)),
        optimizer="adamw",
    ),
    "bert_base": dict(
        spec="bench/models/bert_base.mdl",
        dims=dict(B=8, T=512, L=12),
        tiny=dict(B=4, T=64, L=2, V=512, D=64, H=4, F=256),
        make=lambda d: BertBase(
            T=d["T"], L=d["L"], V=d.get("V", 30522), D=d.get("D", 768), H=d.get("H", 12),
            Fh=d.get("F", 3072),
        ),
        inputs=lambda d: (
            _ids((d["B"], d["T"]), d.get("V", 30522)),
            _ids((d["B"], d["T"]), 2),
            _ids((d["B"], d["T"]), d.get("V", 30522)),
        ),
        optimizer="adamw",
    ),
    "unet": dict(
        spec="examples/unet.mdl",
        dims=dict(B=4, S=32),
        tiny=dict(B=4, S=32),
        make=lambda d: UNet(),
        inputs=lambda d: (
            torch.randn(d["B"], 3, d["S"], d["S"]),
            torch.randn(d["B"], 64),
            torch.randn(d["B"], 3, d["S"], d["S"]),
        ),
        optimizer="adamw",
        clip=1.0,
    ),
    "llama1b": dict(
        spec="examples/llama7b.mdl",
        dims=dict(B=2, T=2048, D=2048, L=16, F=5632),
        tiny=dict(B=4, T=64, D=64, H=4, L=2, F=96, V=512),
        make=lambda d: Llama(
            V=d.get("V", 32000), T=d["T"], D=d["D"], H=d.get("H", 32), L=d["L"], Fh=d["F"]
        ),
        inputs=lambda d: (
            _ids((d["B"], d["T"]), d.get("V", 32000)),
            _ids((d["B"], d["T"]), d.get("V", 32000)),
        ),
        optimizer="adamw",
    ),
    "gpt2": dict(
        spec="examples/gpt2.mdl",
        dims=dict(B=8, T=1024, L=12),
        tiny=dict(B=4, T=64, L=2, V=512, D=64, H=4),
        make=lambda d: Gpt2(
            V=d.get("V", 50257), T=d["T"], D=d.get("D", 768), H=d.get("H", 12), L=d["L"]
        ),
        inputs=lambda d: (
            _ids((d["B"], d["T"]), d.get("V", 50257)),
            _ids((d["B"], d["T"]), d.get("V", 50257)),
        ),
        optimizer="adamw",
    ),
}
