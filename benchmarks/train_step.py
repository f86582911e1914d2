"""Time bert_jax's full train step (forward, backward, AdamW update) against HF transformers (PyTorch) on the same
architecture, batch and optimizer, alternating the two so background load hits both alike, after untimed warm-up
windows (each framework's first steps also pay for mapping its memory).

    python benchmarks/train_step.py --model=bert-base --batch=8 --seq=128

Prints tokens/s for both, their ratio, model FLOPs per step (bert_jax/flops.py) and MFU against the matmul peak of
the compute dtype measured in the same run (the best of JAX and PyTorch on a large matmul, before and after the
timing). With `--set dtype=bfloat16` the peer runs under bfloat16 autocast. The last line is JSON:
{"tokens_per_s", "baseline_tokens_per_s", "ratio", "mfu", ...}.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402

from bert_jax import config_lib, flops, objectives, optimizer, state_dict, train  # noqa: E402
from bert_jax.config_lib import generator_config  # noqa: E402
from bert_jax.modeling import objective_head, pretraining_model  # noqa: E402

MODELS = {"bert-base": ("bert", "base"), "roberta-base": ("roberta", "base"), "albert-base": ("albert", "base"),
          "electra-small": ("electra", "small"), "bert-large": ("bert", "large"), "bert-tiny": ("bert", "tiny"),
          "modernbert-base": ("modernbert", "base"), "modernbert-tiny": ("modernbert", "tiny")}
# The HF forward's keyword and the batch's key of each objective's sentence-level label.
SENTENCE_LABELS = {"mlm_nsp": ("next_sentence_label", "next_sentence_labels"),
                   "mlm_sop": ("sentence_order_label", "sentence_order_labels")}


def benchmark_config(model_name: str, batch: int, seq: int, switches: list[str]):
    family, size = MODELS[model_name]
    config = config_lib.load_preset(family, size)
    config.data.batch_size, config.data.seq_length = batch, seq
    config.masking.max_predictions_per_seq = max(1, round(seq * config.masking.rate))
    config.optimizer.update(name="adamw", learning_rate=1e-4, warmup_steps=0, weight_decay=0.01, grad_clip_norm=1.0)
    for switch in switches:
        key, value = switch.split("=", 1)
        config.model[key] = type(config.model[key])(value) if not isinstance(config.model[key], bool) else \
            value.lower() in ("1", "true")
    return config


def synthetic_batch(config, rng: np.random.Generator) -> dict:
    """A pipeline-shaped batch: distinct masked positions, both segments, a sentence label."""
    b, s, p = config.data.batch_size, config.data.seq_length, config.masking.max_predictions_per_seq
    positions = np.sort(np.stack([rng.choice(np.arange(1, s), p, replace=False) for _ in range(b)]), axis=1)
    input_ids = rng.integers(1000, 8000, (b, s))
    segment_ids = (np.arange(s) >= s // 2) * np.ones((b, 1))
    batch = dict(input_ids=input_ids, input_mask=np.ones((b, s)), segment_ids=segment_ids,
                 masked_lm_positions=positions, masked_lm_ids=np.take_along_axis(input_ids, positions, 1),
                 masked_lm_weights=np.ones((b, p)), next_sentence_labels=rng.integers(0, 2, b),
                 sentence_order_labels=rng.integers(0, 2, b))
    if config.model.type_vocab_size == 1:
        batch["segment_ids"] = np.zeros((b, s))
    return {k: v.astype(np.int32) for k, v in batch.items()}


def jax_step(config):
    """A jitted bert_jax train step on one device and its initial state."""
    model = pretraining_model(config)
    tx = optimizer.make_optimizer(config.optimizer, total_steps=10**6)
    schedule = optimizer.learning_rate_schedule(config.optimizer, total_steps=10**6)
    state = jax.jit(lambda rng: nn.unbox(train.initial_state(model, tx, rng)))(jax.random.key(0))
    step = jax.jit(functools.partial(train.train_step, loss_fn=objectives.loss_fn(config, model), tx=tx,
                                     schedule=schedule, accum_steps=1), donate_argnums=0)
    return step, state


def hf_model(config):
    """The transformers model of the same architecture and head (state_dict.config_to_hf names its class)."""
    import torch  # the baseline only: a GPU check runs without PyTorch
    import transformers

    def build(model_config, head):
        hf = state_dict.config_to_hf(model_config, head)
        return getattr(transformers, hf["architectures"][0])(transformers.AutoConfig.for_model(**hf))

    model = config.model
    head = objective_head(config.objective, model)
    if head == "both":
        generator, discriminator = build(generator_config(model), "generator"), build(model, "discriminator")
        discriminator.electra.embeddings = generator.electra.embeddings  # shared, as in ELECTRA
        return torch.nn.ModuleDict({"generator": generator, "discriminator": discriminator})
    return build(model, head)


def hf_inputs(config, batch: dict, device: str = "cpu") -> dict:
    """The HF forward's keyword arguments for a synthetic batch: MLM labels at the masked positions (-100 elsewhere,
    so HF's head runs over every position), segment ids where the model has segment embeddings (ModernBERT has
    none), and the objective's sentence label."""
    import torch

    tensor = lambda key: torch.from_numpy(batch[key]).long().to(device)  # noqa: E731
    inputs = dict(input_ids=tensor("input_ids"), attention_mask=tensor("input_mask"),
                  labels=torch.full_like(tensor("input_ids"), -100).scatter_(1, tensor("masked_lm_positions"),
                                                                             tensor("masked_lm_ids")))
    if config.model.type_vocab_size > 1:
        inputs["token_type_ids"] = tensor("segment_ids")
    if config.objective in SENTENCE_LABELS:
        hf_key, batch_key = SENTENCE_LABELS[config.objective]
        inputs[hf_key] = tensor(batch_key)
    return inputs


def hf_adamw(model, config, fused: bool):
    """torch's AdamW with benchmark_config's settings, weight decay off biases and norms as bert_jax's
    (BERT's LayerNorm, ModernBERT's norm)."""
    import torch

    named = list(model.named_parameters())
    undecayed = [("bias" in name or "norm" in name.lower()) for name, _ in named]
    return torch.optim.AdamW(
        [{"params": [p for (_, p), skip in zip(named, undecayed) if not skip], "weight_decay": 0.01},
         {"params": [p for (_, p), skip in zip(named, undecayed) if skip], "weight_decay": 0.0}],
        lr=config.optimizer.learning_rate, eps=config.optimizer.eps, fused=fused)


def torch_step(config):
    """The same update in PyTorch: MLM over all positions with -100 labels elsewhere (HF's way), AdamW, clipping.
    With `--set dtype=bfloat16` the forward runs under bfloat16 autocast (float32 weights), as bert_jax's does."""
    import torch

    model = hf_model(config).train()
    params = list(model.parameters())
    opt = hf_adamw(model, config, fused=False)
    mixed_precision = config.model.dtype == "bfloat16"

    def step(batch):
        inputs = hf_inputs(config, batch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed_precision):
            if config.objective == "rtd":
                labels, ids = inputs.pop("labels"), inputs["input_ids"]
                gen = model["generator"](**inputs, labels=labels)
                noise = -torch.log(-torch.log(torch.rand_like(gen.logits)))
                sampled = torch.where(labels >= 0, (gen.logits.detach() + noise).argmax(-1), ids)
                disc = model["discriminator"](**{**inputs, "input_ids": sampled},
                                              labels=(sampled != torch.where(labels >= 0, labels, ids)).long())
                loss = gen.loss + config.rtd_weight * disc.loss
            else:
                loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def matmul_peak_flops(with_torch: bool, n: int = 2048, trials: int = 5, dtype: str = "float32") -> float:
    """The machine's matmul FLOP/s in the compute dtype (bfloat16: float32 sums): the best of several timed trials,
    in JAX and (if there) PyTorch."""
    x = jnp.ones((n, n), dtype)
    matmul = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
    matmul(x).block_until_ready()
    runs = [lambda: matmul(x).block_until_ready()]
    if with_torch:
        import torch

        y = torch.ones(n, n, dtype=getattr(torch, dtype))
        runs.append(lambda: y @ y)
    best = float("inf")
    for run in runs:
        run()
        for _ in range(trials):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


def interleaved_times(windows: dict, rounds: int, warmup: int = 0) -> dict[str, list[float]]:
    """Each window's seconds a step, round by round, one window each in turn, after `warmup` untimed rounds: load
    that comes and goes hits every run alike."""
    for _ in range(warmup):
        for window in windows.values():
            window()
    times = {name: [] for name in windows}
    for _ in range(rounds):
        for name, window in windows.items():
            times[name].append(window())
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="bert-base")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="steps per timing window")
    parser.add_argument("--rounds", type=int, default=3, help="alternating windows per framework")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed alternating windows first: each framework's first steps map its memory afresh "
                             "(on one Intel machine bert_jax's first windows took up to 1.2x its later ones)")
    parser.add_argument("--baseline", choices=("transformers", "none"), default="transformers",
                        help="none: time bert_jax alone (e.g. on a GPU without a CUDA PyTorch)")
    parser.add_argument("--peak_flops", type=float, default=0.0,
                        help="MFU denominator per device (989e12 for H100/H200 bf16 dense); 0 measures a matmul")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config.model switch, e.g. --set dtype=bfloat16 --set remat_policy=dots")
    args = parser.parse_args()

    config = benchmark_config(args.model, args.batch, args.seq, args.set)
    rng = np.random.default_rng(0)
    batches = [synthetic_batch(config, rng) for _ in range(args.steps)]
    ours_step, state = jax_step(config)
    with_baseline = args.baseline == "transformers"
    theirs_step = torch_step(config) if with_baseline else None
    measure_peak = functools.partial(matmul_peak_flops, with_baseline, dtype=config.model.dtype)
    peak = args.peak_flops or measure_peak()

    def ours_window() -> float:
        nonlocal state, metrics
        start = time.perf_counter()
        for batch in batches:
            state, metrics = ours_step(state, batch)
        jax.block_until_ready(metrics)
        return (time.perf_counter() - start) / args.steps

    def theirs_window() -> float:
        start = time.perf_counter()
        for batch in batches:
            theirs_step(batch)
        return (time.perf_counter() - start) / args.steps

    state, metrics = ours_step(state, batches[0])  # compile
    jax.block_until_ready(metrics)
    windows = {"ours": ours_window}
    if with_baseline:
        theirs_step(batches[0])
        windows["theirs"] = theirs_window
    times = interleaved_times(windows, args.rounds, args.warmup)
    ours_times, theirs_times = times["ours"], times.get("theirs", [])

    peak = args.peak_flops or max(peak, measure_peak())  # before and after: load that came and went lowers one
    tokens = args.batch * args.seq
    ours_seconds = float(np.median(ours_times))
    step_flops = flops.train_step_flops(config, gathered_mlm_head=True)
    result = {
        "model": args.model, "batch": args.batch, "seq": args.seq, "switches": args.set,
        "device": jax.devices()[0].device_kind, "devices": jax.device_count(),
        "tokens_per_s": tokens / ours_seconds, "model_flops_per_step": step_flops, "peak_flops": peak,
        "mfu": step_flops / ours_seconds / peak, "loss": float(metrics["loss"]),
    }
    print(f"{args.model} batch {args.batch} x seq {args.seq} {' '.join(args.set)} on {result['device']}")
    print(f"  bert_jax      {result['tokens_per_s']:9.1f} tokens/s   MFU {100 * result['mfu']:5.1f}%   "
          f"({step_flops / 1e9:.1f} GFLOP/step, MLM head on masked positions)")
    if with_baseline:
        theirs_seconds = float(np.median(theirs_times))
        baseline_flops = flops.train_step_flops(config, gathered_mlm_head=False)
        round_ratios = [theirs / ours for ours, theirs in zip(ours_times, theirs_times)]
        result.update(baseline_tokens_per_s=tokens / theirs_seconds, ratio=theirs_seconds / ours_seconds,
                      round_ratios=[round(min(round_ratios), 3), round(max(round_ratios), 3)],
                      baseline_model_flops_per_step=baseline_flops, baseline_mfu=baseline_flops / theirs_seconds / peak,
                      torch_threads=torch_threads())
        print(f"  transformers  {result['baseline_tokens_per_s']:9.1f} tokens/s   MFU "
              f"{100 * result['baseline_mfu']:5.1f}%   ({baseline_flops / 1e9:.1f} GFLOP/step, MLM head on all "
              f"positions)")
        low, high = result["round_ratios"]
        print(f"  ratio {result['ratio']:.2f}x (rounds {low:.2f}-{high:.2f}x)")
    print(f"  peak {peak / 1e9:.0f} GFLOP/s per device")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
