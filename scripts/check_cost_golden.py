#!/usr/bin/env python3
"""Independent derivation of the pinned cost-model values (models/tests/cost.rs).

`golden_values_do_not_drift` pins, to the nanosecond, costs of Qwen2.5-VL-7B on an H200.
This script recomputes each of them from the data files alone (models/data/models/*.toml,
models/data/hardware/*.toml, read with tomllib) and the formulas documented in
models/README.md ("Cost formulas") and models/src/cost.rs, in exact rational arithmetic
(fractions.Fraction, the TOML numbers read as decimals), so the only rounding is the final
documented ceil. It shares no code with the Rust crate. The pinned calls and the expected
values are parsed out of the Rust test (each `assert_eq!(c.FN(ARGS), VALUE)` under the
test's `setup(HW, MODEL, TP)`), so both sides check the same numbers; the script fails when
a value disagrees or when it finds no pinned value at all. Exit status 1 on any mismatch.

Formulas (README "Cost formulas"; cost.rs module docs):
  time = ceil(max(FLOPs / (tp * peak * mfu), bytes / (tp * hbm_bw * hbm_efficiency))
              + allreduce) + overhead                        (ns; no work costs 0)
  encoder, per image of v visual tokens, p = merge^2 * v patches:
    FLOPs = sum[2 (patch_embed + depth * block) p + 2 merger v
                + 4 vit_hidden p (window_blocks * min(p, (window/patch)^2) + full_blocks * p)]
    bytes = ViT weights (patch embed, blocks, merger) once
  prefill, n new after c cached:
    FLOPs = 2 layer_params layers n + 2 vocab hidden + 4 layers heads head_dim (n c + n(n+1)/2)
    bytes = streamed weights (layers, final norm, LM head) + KV of c + n tokens
  decode, b sequences, T context tokens in total:
    FLOPs = b (2 layer_params layers + 2 vocab hidden) + 4 layers heads head_dim (T + b)
    bytes = streamed weights + KV of T + b tokens
  all-reduce (tp > 1): two ring all-reduces per layer over NVLink, each
    latency + 2 (tp-1)/tp * tokens * width * dtype / bw   (tokens: patches for the ViT)
  KV bytes per token = 2 * layers * kv_heads * head_dim * dtype.

Where the docs are not enough to compute a value, and what this script assumes (written
from the Qwen2 / Qwen2.5-VL architecture, not from the Rust code):
  - Parameter counts. The docs list the parts ("q/k/v/o projections (q/k/v bias if any),
    gated MLP, two RMSNorms"; "fused qkv and output projection (with bias), gated MLP
    (with bias), two RMSNorms"; merger "RMSNorm, then merge^2*hidden -> same -> out") but
    not which linears carry biases. Assumed: LLM attention has q/k/v biases when qkv_bias
    and no o bias, LLM MLP (gate, up, down) has no biases; every ViT linear (qkv, proj,
    gate, up, down) and both merger linears have biases; each RMSNorm has `width` weights;
    the patch embedding is a bias-free Conv3d (in_channels * temporal * patch^2 * hidden).
    These counts are checked below against the totals stated in models/README.md (which
    match the model cards: 7,615,616,512 LLM and 676,550,144 ViT + merger parameters for
    the 7B), so an error here fails the script instead of agreeing by accident.
  - The all-reduce bandwidth is the NVLink link's `put_bytes_per_s` (NVLink is symmetric
    in every profile) and its latency is `links.nvlink.latency_ns`.
"""
import decimal
import re
import sys
import tomllib
from fractions import Fraction as F
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "models" / "data"
TEST = ROOT / "models" / "tests" / "cost.rs"
README = ROOT / "models" / "README.md"

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


def load(kind: str, name: str) -> dict:
    # Numbers as decimals, then exact fractions: 0.35 is 7/20, not the nearest double.
    with open(DATA / kind / f"{name}.toml", "rb") as f:
        return tomllib.load(f, parse_float=decimal.Decimal)


def frac(x) -> F:
    return F(x) if not isinstance(x, decimal.Decimal) else F(str(x))


class Spec:
    """Derived sizes of a model spec (parameter counts as assumed in the module docstring)."""

    def __init__(self, m: dict):
        llm, vit = m["llm"], m["vision"]
        self.dtype = DTYPE_BYTES[m["dtype"]]
        self.layers = llm["num_hidden_layers"]
        self.hidden = llm["hidden_size"]
        self.heads = llm["num_attention_heads"]
        self.kv_heads = llm["num_key_value_heads"]
        self.head_dim = llm.get("head_dim", self.hidden // self.heads)
        self.vocab = llm["vocab_size"]
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        qkv_bias = (q + 2 * kv) if llm["qkv_bias"] else 0
        self.layer_params = (
            h * q + h * kv + h * kv + q * h + qkv_bias  # q, k, v, o
            + 3 * h * llm["intermediate_size"]  # gate, up, down (no bias)
            + 2 * h  # input and post-attention RMSNorm
        )
        self.lm_head = self.vocab * h
        embed = self.vocab * h
        self.llm_params = (
            embed + self.layers * self.layer_params + h
            + (0 if llm["tie_word_embeddings"] else self.lm_head)
        )
        self.streamed_bytes = (self.layers * self.layer_params + h + self.lm_head) * self.dtype
        self.kv_bytes_per_token = 2 * self.layers * self.kv_heads * self.head_dim * self.dtype

        vh, vi = vit["hidden_size"], vit["intermediate_size"]
        merge2 = vit["spatial_merge_size"] ** 2
        self.vit_hidden = vh
        self.vit_depth = vit["depth"]
        self.patches_per_token = merge2
        self.patch_embed = (
            vit["in_channels"] * vit["temporal_patch_size"] * vit["patch_size"] ** 2 * vh
        )
        self.vit_block = (
            (vh * 3 * vh + 3 * vh) + (vh * vh + vh)  # fused qkv, proj (biases)
            + 2 * (vh * vi + vi) + (vi * vh + vh)  # gate, up, down (biases)
            + 2 * vh  # two RMSNorms
        )
        mw = merge2 * vh
        self.merger = vh + (mw * mw + mw) + (mw * vit["out_hidden_size"] + vit["out_hidden_size"])
        self.vit_params = self.patch_embed + self.vit_depth * self.vit_block + self.merger
        self.vit_weight_bytes = self.vit_params * self.dtype
        self.window_patches = (vit["window_size"] // vit["patch_size"]) ** 2
        self.full_blocks = len(vit["fullatt_block_indexes"])
        self.window_blocks = self.vit_depth - self.full_blocks


class Cost:
    def __init__(self, hw: dict, spec: Spec, tp: int):
        self.hw, self.s, self.tp = hw, spec, tp
        eff, ov = hw["efficiency"], hw["overheads"]
        self.peak = frac(hw["peak_bf16_flops_per_s"])
        self.bw = frac(hw["hbm_bytes_per_s"])
        self.hbm_eff = frac(eff["hbm_efficiency"])
        self.mfu = {k: frac(eff[f"{k}_mfu"]) for k in ("encoder", "prefill", "decode")}
        self.overhead = {
            "encoder": ov["encoder_batch_ns"],
            "prefill": ov["prefill_chunk_ns"],
            "decode": ov["decode_iter_ns"],
        }

    def allreduce_ns(self, layers: int, tokens, width: int) -> F:
        if self.tp <= 1:
            return F(0)
        nv = self.hw["links"]["nvlink"]
        each = F(nv["latency_ns"]) + F(2 * (self.tp - 1), self.tp) * tokens * width * \
            self.s.dtype * F(10**9) / frac(nv["put_bytes_per_s"])
        return 2 * layers * each

    def time_ns(self, kind: str, flops, nbytes, comm) -> int:
        if flops == 0 and nbytes == 0:
            return 0
        compute = F(flops) * 10**9 / (self.tp * self.peak * self.mfu[kind])
        memory = F(nbytes) * 10**9 / (self.tp * self.bw * self.hbm_eff)
        x = max(compute, memory) + comm
        ceil = -((-x.numerator) // x.denominator)
        return ceil + self.overhead[kind]

    def encoder_time_ns(self, visual_tokens: list) -> int:
        s = self.s
        flops, patches = F(0), 0
        for v in visual_tokens:
            p = s.patches_per_token * v
            window = min(p, s.window_patches)
            flops += (
                2 * (s.patch_embed + s.vit_depth * s.vit_block) * p
                + 2 * s.merger * v
                + 4 * s.vit_hidden * p * (s.window_blocks * window + s.full_blocks * p)
            )
            patches += p
        if patches == 0:
            return 0
        comm = self.allreduce_ns(s.vit_depth, patches, s.vit_hidden)
        return self.time_ns("encoder", flops, s.vit_weight_bytes, comm)

    def prefill_time_ns(self, n: int, c: int) -> int:
        s = self.s
        if n == 0:
            return 0
        flops = (
            2 * s.layer_params * s.layers * n
            + 2 * s.vocab * s.hidden
            + 4 * s.layers * s.heads * s.head_dim * (F(n * c) + F(n * (n + 1), 2))
        )
        nbytes = s.streamed_bytes + (c + n) * s.kv_bytes_per_token
        return self.time_ns("prefill", flops, nbytes, self.allreduce_ns(s.layers, n, s.hidden))

    def decode_iter_time_ns(self, b: int, ctx: int) -> int:
        s = self.s
        if b == 0:
            return 0
        flops = (
            b * (2 * s.layer_params * s.layers + 2 * s.vocab * s.hidden)
            + 4 * s.layers * s.heads * s.head_dim * (ctx + b)
        )
        nbytes = s.streamed_bytes + (ctx + b) * s.kv_bytes_per_token
        return self.time_ns("decode", flops, nbytes, self.allreduce_ns(s.layers, b, s.hidden))


def check_params(name: str, spec: Spec) -> list:
    """The assumed parameter counts against the totals models/README.md states."""
    text = README.read_text()
    row = re.search(r"^\| LLM parameters \(derived\) \|(.*)$", text, re.M)
    vrow = re.search(r"^\| ViT \+ merger parameters \(derived\) \|(.*)$", text, re.M)
    kvrow = re.search(r"^\| KV bytes per token \|(.*)$", text, re.M)
    cols = {"qwen2.5-vl-3b": 0, "qwen2.5-vl-7b": 1, "qwen2.5-vl-72b": 2}
    if not (row and vrow and kvrow) or name not in cols:
        return [f"models/README.md states no parameter counts for {name}"]
    i = cols[name]

    def cell(r):
        return int(r.group(1).split("|")[i].strip().strip("*").replace(",", ""))

    out = []
    for what, got, want in [
        ("LLM parameters", spec.llm_params, cell(row)),
        ("ViT + merger parameters", spec.vit_params, cell(vrow)),
        ("KV bytes per token", spec.kv_bytes_per_token, cell(kvrow)),
    ]:
        ok = got == want
        print(f"{'ok ' if ok else 'BAD'} {name} {what}: python {got:,}, README {want:,}")
        if not ok:
            out.append(what)
    return out


def parse_int(s: str) -> int:
    return int(s.replace("_", ""))


def pinned():
    """(hw, model, tp, fn, args, value) for every assert_eq! in golden_values_do_not_drift."""
    text = TEST.read_text()
    m = re.search(r"fn golden_values_do_not_drift\(\) \{(.*?)\n\}", text, re.S)
    if not m:
        sys.exit(f"{TEST}: no golden_values_do_not_drift test")
    body = m.group(1)
    setup = re.search(r'setup\("([^"]+)",\s*"([^"]+)",\s*(\d+)\)', body)
    if not setup:
        sys.exit(f"{TEST}: golden_values_do_not_drift has no setup(hw, model, tp)")
    hw, model, tp = setup.group(1), setup.group(2), int(setup.group(3))
    rows = []
    for fn, args, value in re.findall(
        r"assert_eq!\(\s*c\.(\w+)\((.*?)\),\s*([\d_]+)\s*\)", body, re.S
    ):
        if fn == "encoder_time_ns":
            parsed = ([parse_int(a) for a in re.findall(r"[\d_]+", args)],)
        else:
            parsed = tuple(parse_int(a.strip()) for a in args.split(","))
        rows.append((hw, model, tp, fn, parsed, parse_int(value)))
    if not rows:
        sys.exit(f"{TEST}: no pinned assert_eq! in golden_values_do_not_drift")
    return rows


# The README's sanity table (models/README.md, "Sanity figures"): row label -> call.
SANITY_ROWS = {
    "decode, batch 1, 4k context": ("decode_iter_time_ns", (1, 4096)),
    "decode, batch 64, 2k context each": ("decode_iter_time_ns", (64, 64 * 2048)),
    "prefill 4,096 tokens": ("prefill_time_ns", (4096, 0)),
    "prefill 512 new after 3,584 cached": ("prefill_time_ns", (512, 3584)),
    "encode one 1,024-token image": ("encoder_time_ns", ([1024],)),
    "encode eight 256-token images": ("encoder_time_ns", ([256] * 8,)),
}


def check_readme_table() -> list:
    """Every figure of the README's Qwen2.5-VL-7B sanity table, to the decimals it shows."""
    text = README.read_text()
    head = re.search(r"^\| Qwen2.5-VL-7B \|(.*)\|$", text, re.M)
    if not head:
        return ["models/README.md has no Qwen2.5-VL-7B sanity table"]
    hws = [h.strip().lower() for h in head.group(1).split("|")]
    spec = Spec(load("models", "qwen2.5-vl-7b"))
    bad, seen = [], 0
    for label, (fn, args) in SANITY_ROWS.items():
        row = re.search(rf"^\| {re.escape(label)} \|(.*)\|$", text, re.M)
        if not row:
            bad.append(f"README row {label!r} missing")
            continue
        for hw, cell in zip(hws, row.group(1).split("|")):
            shown = cell.strip().removesuffix(" ms")
            decimals = len(shown.split(".")[1]) if "." in shown else 0
            got = getattr(Cost(load("hardware", hw), spec, 1), fn)(*args)
            ours = f"{got / 1e6:.{decimals}f}"
            seen += 1
            if ours != shown:
                print(f"BAD README {hw} {label}: python {ours} ms, README {shown} ms")
                bad.append(f"README {hw} {label}")
    # The 72B line exercises the tensor-parallel all-reduce: "H200 `tp = 4` decode batch 1
    # at 4k 11.2 ms, prefill 4k 340 ms; B200 `tp = 2` 14.1 ms and 346 ms".
    m = re.search(
        r"H200 `tp = 4` decode batch 1 at 4k ([\d.]+) ms, prefill 4k ([\d.]+) ms; "
        r"B200\s+`tp = 2` ([\d.]+) ms and ([\d.]+) ms",
        text,
    )
    if not m:
        return bad + ["README's Qwen2.5-VL-72B tp line missing"]
    big = Spec(load("models", "qwen2.5-vl-72b"))
    for hw, tp, d_shown, p_shown in [("h200", 4, m[1], m[2]), ("b200", 2, m[3], m[4])]:
        c = Cost(load("hardware", hw), big, tp)
        for shown, got in [(d_shown, c.decode_iter_time_ns(1, 4096)), (p_shown, c.prefill_time_ns(4096, 0))]:
            decimals = len(shown.split(".")[1]) if "." in shown else 0
            ours = f"{got / 1e6:.{decimals}f}"
            seen += 1
            if ours != shown:
                print(f"BAD README 72B {hw} tp{tp}: python {ours} ms, README {shown} ms")
                bad.append(f"README 72B {hw} tp{tp}")
    print(f"{'ok ' if not bad else 'BAD'} README sanity figures (7B table, 72B tp line): {seen}")
    return bad


def main() -> int:
    bad = check_readme_table()
    checked_specs = set()
    for hw, model, tp, fn, args, want in pinned():
        spec = Spec(load("models", model))
        if model not in checked_specs:
            bad += check_params(model, spec)
            checked_specs.add(model)
        got = getattr(Cost(load("hardware", hw), spec, tp), fn)(*args)
        ok = got == want
        call = f"{hw} {model} tp{tp} {fn}{args if len(args) > 1 else '(' + str(args[0]) + ')'}"
        print(f"{'ok ' if ok else 'BAD'} {call}: python {got:,} ns, rust pins {want:,} ns")
        if not ok:
            bad.append(call)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
