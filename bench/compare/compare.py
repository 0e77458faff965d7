#!/usr/bin/env python3
"""Side by side: our runtime (bench_train_decode) and Hugging Face transformers
on the same randomly initialised Qwen3-shaped model, the same batch shapes,
threads and device, in one run. Prints tokens/s for a training step (forward,
loss, backward, AdamW) and for decoding, the ratio ours / transformers, and on
CUDA the MFU of the training step (6 N tokens + attention FLOPs over the GPU's
bf16 peak).

Usage: compare.py BENCH_BINARY [--device cpu|cuda] [--shapes tiny,30m,tiny-moe,30m-moe | 0.6b] [--profile]
                  [--unfused-too]

--unfused-too runs our side a second time with RL_FUSED_KERNELS=0 (the eager
libtorch path instead of the fused CUDA kernels) and prints it as a second row.

--profile adds, under the table, where each side's time goes: the operators
with the most self time (ATen operators through RecordFunction on both sides,
so the two lists are counted alike; the profiling slows both a little, so the
tokens/s of a --profile run are not the benchmark's figures).

On the CPU a line per shape gives the matrix products of a training step (their
GFLOP/s over their share of the step, and that rate against a plain sgemm of the
step's largest product measured in the same run), and another the process CPU time (all threads) of
one training step and of one generate call on each side and their ratio
(transformers / ours): on a machine shared with other work, wall time also
counts the other processes, CPU time mostly the work itself.
Run through scripts/run-bench-compare.sh, which makes the venv with transformers.
"""
import argparse
import contextlib
import json
import os
import subprocess
import time

import torch

SHAPES = {
    # hidden, layers, heads, kv heads, head dim, mlp, vocab
    "tiny": dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, mlp=768, vocab=259),
    "30m": dict(hidden=512, layers=8, heads=8, kv_heads=4, head_dim=64, mlp=1536, vocab=8192),
    "0.6b": dict(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, mlp=3072, vocab=151936),
    # The tiny-moe preset's shape: Qwen3-MoE, every layer 8 experts of 192, top-2.
    "tiny-moe": dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, mlp=768, vocab=259,
                     experts=8, top_k=2, moe_mlp=192),
    # The 30m shape with sparse layers: 16 experts of 384, top-4 (per token
    # the same expert FLOPs as 30m's dense MLP of 1536), 85 M parameters.
    "30m-moe": dict(hidden=512, layers=8, heads=8, kv_heads=4, head_dim=64, mlp=1536, vocab=8192,
                    experts=16, top_k=4, moe_mlp=384),
}
# Dense bf16 peak (TFLOP/s) by GPU name, for MFU.
PEAKS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def hf_model(shape, device, dtype):
    import transformers

    common = dict(
        hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"], intermediate_size=shape["mlp"], vocab_size=shape["vocab"],
        tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6,
        attn_implementation="sdpa", torch_dtype=dtype)
    if shape.get("experts"):
        cfg = transformers.Qwen3MoeConfig(
            num_experts=shape["experts"], num_experts_per_tok=shape["top_k"],
            moe_intermediate_size=shape["moe_mlp"], norm_topk_prob=True, **common)
    else:
        cfg = transformers.Qwen3Config(**common)
    torch.manual_seed(1)
    return transformers.AutoModelForCausalLM.from_config(cfg).to(device=device, dtype=dtype)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


class OpProfile:
    """Self time by operator over the measured iterations (torch.profiler),
    or nothing when profiling is off."""

    def __init__(self, on):
        self.on, self.prof, self.wall = on, None, 0.0

    def measured(self):
        if not self.on:
            return contextlib.nullcontext()
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        return self.prof

    def report(self):
        if self.prof is None:
            return None
        rows = [(e.key, e.self_cpu_time_total / 1e3, e.count)
                for e in self.prof.key_averages() if e.key.startswith("aten::")]
        rows.sort(key=lambda r: -r[1])
        return {"wall_ms": 1e3 * self.wall, "ops_ms": sum(r[1] for r in rows),
                "top": [{"op": k, "ms": ms, "calls": n} for k, ms, n in rows[:25]]}


def timed(step, device, prof, warmup, reps):
    """Runs step() warmup + reps times; returns the wall and CPU seconds of the
    last reps (profiled by prof, which keeps the wall time too)."""
    total = cpu = 0.0
    for i in range(warmup + reps):
        if i == warmup:
            ctx = prof.measured()
            ctx.__enter__()
        sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        sync(device)
        if i >= warmup:
            total += time.perf_counter() - t0
            cpu += time.process_time() - c0
    if reps > 0:
        ctx.__exit__(None, None, None)
    prof.wall = total
    return total, cpu


def hf_train(model, args, device, prof):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (args.seqs, args.seq_len), device=device)

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    total, cpu = timed(step, device, prof, args.warmup, args.steps)
    return args.seqs * args.seq_len * args.steps / total, cpu / args.steps


@torch.inference_mode()
def hf_decode(model, args, device, prof):
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_len), device=device)

    def step():
        model.generate(ids, do_sample=True, max_new_tokens=args.new_tokens,
                       min_new_tokens=args.new_tokens, pad_token_id=0)

    total, cpu = timed(step, device, prof, 1, args.decode_reps)
    return args.batch * args.new_tokens * args.decode_reps / total, cpu / args.decode_reps


def print_profile(title, ours, theirs):
    """Two operator lists side by side: ours (bench_train_decode) and transformers."""
    if ours is None or theirs is None:
        return
    print(f"  {title}: wall ours {ours['wall_ms']:.0f} ms, transformers {theirs['wall_ms']:.0f} ms"
          " (measured repetitions, profiled)")
    for side, p in (("ours", ours), ("transformers", theirs)):
        wall = p["wall_ms"]
        tops = ", ".join(f"{o['op'][6:]} {100 * o['ms'] / wall:.0f}%" for o in p["top"][:8])
        mm = sum(o["ms"] for o in p["top"] if o["op"] in ("aten::mm", "aten::addmm", "aten::bmm"))
        print(f"    {side:<12} mm+addmm+bmm {mm:.0f} ms ({100 * mm / wall:.0f}% of wall), all ops "
              f"{100 * p['ops_ms'] / wall:.0f}%: {tops}")


def print_gpu_profile(title, p):
    """Our side on CUDA: GPU time by kernel (Kineto) over the measured repetitions."""
    if p is None:
        return
    wall, busy = p["wall_ms"], p["gpu_busy_ms"]
    print(f"  {title} (ours, GPU kernels): wall {wall:.0f} ms, GPU busy {busy:.0f} ms "
          f"({100 * busy / wall:.0f}%)")
    for k in p["top"][:15]:
        print(f"    {k['ms']:8.1f} ms {100 * k['ms'] / wall:5.1f}% {k['calls']:6d}x  {k['kernel'][:110]}")


def train_flops_per_token(shape, params, seq_len):
    # 6 N per token, plus causal attention scores and values: forward 2 matmuls
    # of 2 * (seq_len / 2) * heads * head_dim FLOPs each, backward twice that.
    attn = 6 * shape["layers"] * seq_len * shape["heads"] * shape["head_dim"]
    if shape.get("experts"):  # only the top-k experts of each layer run per token
        params -= (shape["layers"] * (shape["experts"] - shape["top_k"]) * 3 * shape["hidden"]
                   * shape["moe_mlp"])
    return 6 * params + attn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seqs", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--decode-reps", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--unfused-too", action="store_true",
                    help="also run ours with RL_FUSED_KERNELS=0 (the eager libtorch path)")
    args = ap.parse_args()
    gpu = args.device == "cuda"
    shapes = (args.shapes or ("0.6b" if gpu else "tiny,30m")).split(",")
    dtype_name = args.dtype or ("bfloat16" if gpu else "float32")
    dtype = getattr(torch, dtype_name)
    args.seqs = args.seqs or (16 if gpu else 16)
    args.seq_len = args.seq_len or (1024 if gpu else 128)
    args.batch = args.batch or (64 if gpu else 16)
    args.prompt_len = args.prompt_len or (128 if gpu else 16)
    args.new_tokens = args.new_tokens or (256 if gpu else 32)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    peak = None
    if gpu:
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAKS.items() if k in name), None)
        print(f"device: {name}, bf16 peak {peak} TFLOP/s" if peak else f"device: {name}")
    else:
        print(f"device: cpu, {threads} threads, torch {torch.__version__}")
    print(f"train: {args.seqs} x {args.seq_len} tokens per step; decode: {args.batch} prompts "
          f"of {args.prompt_len} tokens, {args.new_tokens} new tokens each; {dtype_name}")
    print()
    print(f"{'shape':<8} {'params':>9} | {'train tok/s ours':>16} {'transformers':>12} {'ratio':>6}"
          f"{' MFU ours':>9} | {'decode tok/s ours':>17} {'transformers':>12} {'ratio':>6}")
    for name in shapes:
        shape = SHAPES[name]
        cfg = dict(shape, device=args.device, dtype=dtype_name, threads=threads,
                   seqs=args.seqs, seq_len=args.seq_len, steps=args.steps, warmup=args.warmup,
                   batch=args.batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                   decode_reps=args.decode_reps, profile=args.profile)
        ours = json.loads(subprocess.run([args.binary, json.dumps(cfg)], check=True,
                                         capture_output=True, text=True).stdout)
        unfused = None
        if args.unfused_too:
            env = dict(os.environ, RL_FUSED_KERNELS="0")
            unfused = json.loads(subprocess.run([args.binary, json.dumps(dict(cfg, profile=False))],
                                                check=True, capture_output=True, text=True,
                                                env=env).stdout)
        model = hf_model(shape, args.device, dtype)
        # On CUDA only our side is profiled (GPU kernels); the CPU operator
        # lists compare the two sides on the CPU.
        hf_tp, hf_dp = OpProfile(args.profile and not gpu), OpProfile(args.profile and not gpu)
        hf_t, hf_t_cpu = hf_train(model, args, args.device, hf_tp)
        model.eval()
        hf_d, hf_d_cpu = hf_decode(model, args, args.device, hf_dp)
        del model
        params = ours["params"]
        mfu = ""
        if peak:
            flops = train_flops_per_token(shape, params, args.seq_len) * ours["train_tokens_per_s"]
            mfu = f"{100 * flops / (peak * 1e12):.1f}%"
        print(f"{name:<8} {params / 1e6:>8.1f}M | {ours['train_tokens_per_s']:>16.0f} {hf_t:>12.0f} "
              f"{ours['train_tokens_per_s'] / hf_t:>5.2f}x{mfu:>9} | "
              f"{ours['decode_tokens_per_s']:>17.0f} {hf_d:>12.0f} "
              f"{ours['decode_tokens_per_s'] / hf_d:>5.2f}x", flush=True)
        if unfused:
            row = f"{'':<8} {'unfused':>9} | {unfused['train_tokens_per_s']:>16.0f} {'':>12} "
            row += f"{unfused['train_tokens_per_s'] / hf_t:>5.2f}x"
            if peak:
                flops = train_flops_per_token(shape, params, args.seq_len)
                row += f"{100 * flops * unfused['train_tokens_per_s'] / (peak * 1e12):>8.1f}%"
            else:
                row += f"{'':>9}"
            row += (f" | {unfused['decode_tokens_per_s']:>17.0f} {'':>12} "
                    f"{unfused['decode_tokens_per_s'] / hf_d:>5.2f}x  (RL_FUSED_KERNELS=0)")
            print(row, flush=True)
            if unfused.get("decode_tokens_fnv") != ours.get("decode_tokens_fnv"):
                print(f"{'':<8} sampled tokens differ with and without the fused kernels "
                      f"(FNV {ours.get('decode_tokens_fnv')} / {unfused.get('decode_tokens_fnv')})")
        if "train_matmul_gflops" in ours:
            m, k, n = ours["train_matmul_largest"]
            print(f"{'':<8} {'matmuls':>9} | ours: {ours['train_matmul_gflops']:.0f} GFLOP/s over "
                  f"{100 * ours['train_matmul_share']:.0f}% of the step = "
                  f"{100 * ours['train_matmul_gflops'] / ours['train_sgemm_largest_gflops']:.0f}% "
                  f"of a plain sgemm of its largest product {m}x{k}x{n} "
                  f"({ours['train_sgemm_largest_gflops']:.0f} GFLOP/s)", flush=True)
        if not gpu:
            # On a shared machine wall time also counts the other processes;
            # process CPU time per step (all threads) counts only the work.
            print(f"{'':<8} {'cpu time':>9} | {1e3 * ours['train_cpu_s']:>13.0f} ms "
                  f"{1e3 * hf_t_cpu:>9.0f} ms {hf_t_cpu / ours['train_cpu_s']:>5.2f}x{'':>9} | "
                  f"{1e3 * ours['decode_cpu_s']:>14.0f} ms {1e3 * hf_d_cpu:>9.0f} ms "
                  f"{hf_d_cpu / ours['decode_cpu_s']:>5.2f}x", flush=True)
        if gpu:
            print(f"{'':<8} ours per step: forward+backward {1e3 * ours['train_forward_backward_s']:.0f}"
                  f" ms, optimizer {1e3 * ours['train_optim_s']:.0f} ms", flush=True)
        if "weight_bytes" in ours:
            # Zero copies: the engine holds its KV cache and nothing the size
            # of the weights beside the trainer's parameters.
            print(f"{'':<8} engine memory beside the trainer's {ours['weight_bytes'] / 2**20:.0f} MiB"
                  f" of weights: KV cache {ours['engine_cache_bytes'] / 2**20:.0f} MiB, other "
                  f"{ours['engine_other_bytes'] / 2**20:.0f} MiB", flush=True)
        print_gpu_profile("train", ours.get("train_gpu_profile"))
        print_gpu_profile("decode", ours.get("decode_gpu_profile"))
        print_profile("train", ours.get("train_profile"), hf_tp.report())
        print_profile("decode", ours.get("decode_profile"), hf_dp.report())


if __name__ == "__main__":
    main()
