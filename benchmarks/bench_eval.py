"""Evaluation throughput: ``ebpo.generation.sample`` against Hugging Face ``generate`` on the same model.

    .venv/bin/python benchmarks/bench_eval.py                          # tiny model, CPU, 1 thread
    .venv/bin/python benchmarks/bench_eval.py --device cuda --prompts 64 --n 8 --max-new-tokens 256
    .venv/bin/python benchmarks/bench_eval.py --model PATH             # any local causal LM

Both sides get the same model, the same left-padded prompts (``--prompts`` arith test problems, each
asked ``--n`` times), ``max_new_tokens``, temperature and top-p, and stop rows at EOS. The peer is
``model.generate(do_sample=True, num_return_sequences=n, top_k=0)`` (HF's default top-k of 50 is off so
both sample from the same nucleus). Ours prefills each prompt once and repeats its KV cache n times, and
drops finished rows from the batch. Throughput = sampled responses per second and generated tokens
(EOS included, padding excluded) per second; medians over ``--repeats`` timed runs after one warm-up
run each, the two sides called round-robin; the ratio is between numbers measured in the same run. The
default tiny model is random, so it seldom emits EOS and both sides decode most of ``max_new_tokens``
steps; ``--model builtin`` (the trained arith base model) answers and stops within a few tokens.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from ebpo.generation import sample, stop_token_ids
from ebpo.tables import markdown_table


def timed_interleaved(
    fns: dict[str, Callable[[], int]], repeats: int, device: str
) -> dict[str, tuple[float, int]]:
    """Median seconds of each function over ``repeats`` runs, after one warm-up each, called round-robin so
    that load from other processes falls on all of them alike; also the tokens of the last run."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            tokens[name] = fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), tokens[name]) for name in fns}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        default=None,
        help="local model directory, or a built-in model: builtin:arith (also 'builtin'), builtin:gym (default: a "
        "fresh tiny model)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="model dtype")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--prompts", type=int, default=16, help="distinct prompts per batch (default 16)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="response budget (default 64)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus mass (default 0.95)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side (default 3)")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.models.tiny import build_tiny_model
    from ebpo.tasks import get_task

    torch.set_num_threads(args.threads)
    if args.model is None:
        path = build_tiny_model(tempfile.mkdtemp(prefix="bench-eval-"), seed=0)
    else:
        from ebpo.models.names import resolve_model

        path = resolve_model(args.model).path  # a built-in model by name, or a directory
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [rec.prompt for rec in get_task("arith").generate("test", args.prompts, seed=0)]
    result = compare_samplers(
        model, tokenizer, prompts, args.n, args.max_new_tokens, args.temperature, args.top_p, args.repeats
    )
    num_samples = args.prompts * args.n
    device_name = (
        torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {args.threads} thread(s)"
    )
    print(
        f"model {path} on {device_name}, {args.dtype}; {args.prompts} prompts x n={args.n} = {num_samples} samples, "
        f"max_new_tokens={args.max_new_tokens}, T={args.temperature}, top_p={args.top_p}; median of {args.repeats}"
    )
    print(table(result, num_samples))
    print(f"ratio (ours / HF, samples/s): {result['hf'][0] / result['ours'][0]:.2f}x")


def table(result: dict[str, tuple[float, int]], num_samples: int) -> str:
    """The markdown table of :func:`compare_samplers`' ``result`` for ``num_samples`` responses per batch."""
    rows = []
    for name, label in (("ours", "ebpo.generation.sample"), ("hf", "HF generate (peer)")):
        seconds, tokens = result[name]
        rows.append([label, f"{seconds:.3f}", f"{num_samples / seconds:.1f}", f"{tokens / seconds:.0f}"])
    header = ["sampler", "s / batch", "samples / s", "tokens / s"]
    return markdown_table(header, rows, align=["", "right", "right", "right"])


def compare_samplers(
    model,
    tokenizer,
    prompts: list[str],
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    repeats: int,
) -> dict[str, tuple[float, int]]:
    """``{"ours": (median s, tokens), "hf": (median s, tokens)}`` of ``sample`` and ``model.generate`` on the
    same left-padded ``prompts`` (``n`` each), on the model's device; see the module docstring."""
    device = str(next(model.parameters()).device)
    stop_ids = stop_token_ids(model, tokenizer)

    def ours() -> int:
        generator = torch.Generator(device=device).manual_seed(0)
        out = sample(
            model,
            tokenizer,
            prompts,
            n=n,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            generator=generator,
        )
        return int(out.lengths.sum())

    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)

    @torch.no_grad()
    def hf() -> int:
        torch.manual_seed(0)
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            num_return_sequences=n,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=stop_ids,
        )
        resp = out[:, enc["input_ids"].shape[1] :].cpu()
        is_stop = torch.isin(resp, torch.tensor(stop_ids))
        before_stop = (is_stop.long().cumsum(1) - is_stop.long()) == 0  # tokens up to and including EOS
        return int(before_stop.sum())

    return timed_interleaved({"ours": ours, "hf": hf}, repeats, device)


if __name__ == "__main__":
    main()
