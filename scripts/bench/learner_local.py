"""`scripts.bench.learner --local`: one `PolicyLearner` in this process, no Ray and no engine.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.learner --local [--shape main] [--group 4]
        [--questions 8] [--steps 3] [--setting "learner.shared_prefix=false" --setting ...] [--random-init]
        [key=value ...]

What a bare machine can run (a GPU box without Ray or vLLM): the project's own learner (DeepSpeed
engine, `PolicyTokenStats`, the GRPO loss) on CUDA when `learner.gpus_per_rank` > 0 and CUDA is
present, else on the CPU. The batch is real text in a training step's shape:

- `--shape main`: the main job's s3 select-only episodes: the s3 prompt over 3 corpus passages
  (~620 tokens with Gemma's tokenizer) and a short selection answer (≤ 16 tokens, all policy tokens);
- `--shape multi_turn`: a Search-R1 prompt and `--response-tokens` of policy text and retrieved
  passages in turns (passages under loss mask 0);
- `--shape random`: random token ids, `--prompt-tokens` + `--response-tokens` a sequence, the response
  half policy tokens and half masked observation in 48-token blocks. It needs neither a tokenizer nor the
  data pack, only the model's `config.json` (with `--random-init`, `learner.model` may be a directory
  holding only that, such as `configs/architectures/qwen2.5-1.5b`): what a bare GPU machine can run.

Each of `--questions` questions has `--group` samples that share the prompt (a GRPO group) and differ
in their responses. Each `--setting "learner.k=v,..."` measures the same batches with those learner
keys over the config (a fresh learner in its own process each, the same seed); without one the
config's settings run once on a GPU, and on a CPU twice, `learner.dtype=bf16` then `learner.dtype=fp32`
(bf16 is emulated on CPUs without bf16 instructions: `configs.cpu_features`). Per setting: seconds per update (the
median after the first, a warm-up), sequence tokens the forward passes ran over, policy tokens, model
FLOPs of that work over seconds (MFU against this machine's measured matmul peak in the training
dtype, or the GPU's dense bf16 peak given by `--peak-tflops`), and peak memory during the updates
(CUDA: allocator peak; CPU: the process's resident set). `--memory-gib` caps the CUDA allocator (to ask
whether a shape fits a smaller GPU); a setting that fails (out of memory, say) is reported with its error
and the others still run. Ends with one line:
`learner local (<model>, <shape>, …, <device: the CPU's instruction sets>): <setting>: dtype=… update_s=…
sequence_tokens=… mfu=… peak_gib=…; … speedup=…` (the first setting's seconds over the last's).
"""

from __future__ import annotations

import json
import multiprocessing
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from configs.cpu_features import host_cpu


def main_shape_trajectories(cfg, tokenizer, questions: int, group: int, seed: int = 0) -> list[dict]:
    """The main job's s3 select-only shape: s3 prompt over 3 passages, `group` selections each."""
    from pipelines.data import iter_corpus, iter_qa, pack_file
    from recipes import get_recipe

    rng = random.Random(seed)
    recipe = get_recipe("s3", max_turns=0, prefill="<important_info>[")
    passages = list(iter_corpus(pack_file(cfg.data.corpus, cfg.data.dir), limit=3000))
    out = []
    for q, ex in enumerate(iter_qa(pack_file(cfg.data.train, cfg.data.dir), limit=questions)):
        docs = [{"doc_id": p.id, "title": p.title, "text": p.text} for p in rng.sample(passages, 3)]
        prompt = recipe.start(ex.question, ex.golden_answers, docs, chat=False).prompt.render(None)
        ids = tokenizer.encode(prompt)
        for _ in range(group):
            picks = sorted(rng.sample([1, 2, 3], rng.randint(1, 3)))
            text = ", ".join(map(str, picks)) + "]</important_info>"
            response = tokenizer.encode(text, add_special_tokens=False)[:16]
            out.append({"prompt_ids": ids, "response_ids": response, "loss_mask": [1] * len(response),
                        "logprobs": [0.0] * len(response), "group_id": f"q{q}"})
    return out


def multi_turn_trajectories(cfg, tokenizer, questions: int, group: int, response_tokens: int,
                            seed: int = 0) -> list[dict]:
    """Search-R1 prompts, `group` responses each of policy text and passages (mask 0) in turns."""
    from scripts.bench.text import real_text_trajectories

    rows = real_text_trajectories(cfg, tokenizer, questions * group, response_tokens, seed=seed)
    return [{**r, "prompt_ids": rows[i - i % group]["prompt_ids"], "group_id": f"q{i // group}"}
            for i, r in enumerate(rows)]


def random_trajectories(vocab: int, questions: int, group: int, prompt_tokens: int, response_tokens: int,
                        seed: int = 0) -> list[dict]:
    """Random token ids in a training step's shape, no tokenizer: `questions` prompts of `prompt_tokens`,
    `group` responses of `response_tokens` each (a GRPO group shares its prompt); each response alternates
    48 policy tokens (loss mask 1) and 48 observation tokens (loss mask 0), starting with policy.

    Raises:
        ValueError: a count below 1, or a vocabulary too small to leave out the first 10 ids.
    """
    import torch

    if min(questions, group, prompt_tokens, response_tokens) < 1 or vocab <= 20:
        raise ValueError(f"random_trajectories: counts must be >= 1 and vocab > 20, got questions={questions} "
                         f"group={group} prompt_tokens={prompt_tokens} response_tokens={response_tokens} vocab={vocab}")
    gen = torch.Generator().manual_seed(seed)
    mask = [1 - (j // 48) % 2 for j in range(response_tokens)]
    out = []
    for q in range(questions):
        prompt = torch.randint(10, vocab - 10, (prompt_tokens,), generator=gen).tolist()  # ids 0-9: special tokens
        for _ in range(group):
            response = torch.randint(10, vocab - 10, (response_tokens,), generator=gen).tolist()
            out.append({"prompt_ids": prompt, "response_ids": response, "loss_mask": list(mask),
                        "logprobs": [0.0] * response_tokens, "group_id": f"q{q}"})
    return out


def model_vocab(model: str) -> int:
    """The vocabulary size in `model`'s `config.json` (the text model's, for a multimodal config)."""
    from transformers import AutoConfig

    from actors.engines.models import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(model))
    return int(config.get_text_config().vocab_size)


class PeakMemory:
    """Peak memory while a block runs: CUDA allocator peak, else the resident set sampled every 20 ms
    (bytes; the process's, model and optimizer state included)."""

    def __init__(self, device: str):
        self.device, self.peak, self._stop = device, 0, threading.Event()

    def __enter__(self) -> PeakMemory:
        import psutil
        import torch

        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            return self
        proc = psutil.Process()

        def sample() -> None:
            while not self._stop.wait(0.02):
                self.peak = max(self.peak, proc.memory_info().rss)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        if self.device == "cuda":
            self.peak = int(torch.cuda.max_memory_allocated())
            return
        self._stop.set()
        self._thread.join()


def _learner(cfg, learner_cfg, random_init: bool):
    """A set-up `PolicyLearner` (one rank, its process group started once per process)."""
    import torch.distributed as dist

    from actors.learner.policy import PolicyLearner
    from actors.learner.rank import free_port

    learner = PolicyLearner(learner_cfg, temperature=cfg.rollout.temperature)
    if not dist.is_initialized():
        learner.init_distributed("127.0.0.1", free_port())
    learner.setup(random_init=random_init)
    return learner


def bench_setting(cfg, learner_cfg, batch, steps: int, random_init: bool, memory_gib: float | None = None,
                  profile: str | None = None) -> dict:
    """`steps` GRPO updates of a fresh learner on `batch`: seconds, tokens and peak memory (`memory_gib`:
    the CUDA allocator's cap, GiB). `profile`: a path; one more update then runs under torch.profiler and
    its operators by self time (device time on CUDA), the top 40, are written there as a table."""
    import torch

    from algorithms import AlgorithmConfig, grpo_advantages

    if memory_gib and learner_cfg.gpus_per_rank > 0 and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, memory_gib * 2**30 / total))
    learner = _learner(cfg, learner_cfg, random_init)
    rewards = torch.tensor([float((i * 7) % 3 == 0) for i in range(batch.size)])
    train = batch.with_fields(advantages=grpo_advantages(rewards, batch.group_ids, batch.loss_mask), old_logprobs=None)
    device = learner.device.type
    rows = []
    with PeakMemory(device) as mem:
        for step in range(steps):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            m = learner.update(train, AlgorithmConfig(kl_coef=0.0))
            if device == "cuda":
                torch.cuda.synchronize()
            m["wall_s"] = time.perf_counter() - t0
            rows.append(m)
            print(f"  step {step}: {m['wall_s']:.2f} s, {m['sequence_tokens']:.0f} sequence tokens, "
                  f"loss {m['policy_loss']:.4f}", flush=True)
    if profile:
        _profile_update(learner, train, AlgorithmConfig(kl_coef=0.0), profile)
    shape = _model_shape(learner.engine.module.lm)
    learner.shutdown()
    timed = rows[1:] or rows
    return {"update_s": statistics.median(r["wall_s"] for r in timed), "sequence_tokens": rows[0]["sequence_tokens"],
            "policy_tokens": rows[0]["tokens"], "peak_bytes": mem.peak, "device": device,
            "update_s_all": [r["wall_s"] for r in rows], "loss": [r["policy_loss"] for r in rows],
            "flops_model": shape}


def _profile_update(learner, batch, algorithm, path: str) -> None:
    """One update under torch.profiler; its operators' table (top 40 by self time) written to `path`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = learner.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        learner.update(batch, algorithm)
        if cuda:
            torch.cuda.synchronize()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=60))


def parse_setting(text: str) -> dict[str, Any]:
    """`"learner.a=1,learner.b=false,learner.lora={rank: 1, alpha: 10}"` -> `{"a": 1, "b": False, "lora":
    {"rank": 1, "alpha": 10}}` (learner keys only; YAML values).

    Raises:
        ValueError: an item without "=", or a key outside `learner.`.
    """
    import yaml

    items, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):  # commas inside {...} or [...] belong to the value
        depth += (ch in "{[") - (ch in "}]")
        if ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    out = {}
    for item in filter(None, items):
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("learner."):
            raise ValueError(f"--setting {text!r}: each item is learner.KEY=VALUE, got {item!r}")
        out[key.removeprefix("learner.")] = yaml.safe_load(value)
    return out


def _model_shape(lm) -> dict:
    from actors.learner.flops import decoder_param_count

    head = lm.get_output_embeddings().weight
    return {"decoder_params": decoder_param_count(lm), "hidden": int(head.shape[1]), "vocab": int(head.shape[0])}


def _batch(args, cfg):
    """The training batch of `--shape` (see the module docstring)."""
    from actors.learner.batch import make_train_batch

    if args.shape == "random":
        vocab = model_vocab(cfg.learner.model)
        return make_train_batch(random_trajectories(vocab, args.questions, args.group, args.prompt_tokens,
                                                    args.response_tokens), 0)
    from transformers import AutoTokenizer

    from actors.engines.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.learner.model))
    if args.shape == "main":
        trajs = main_shape_trajectories(cfg, tokenizer, args.questions, args.group)
    else:
        trajs = multi_turn_trajectories(cfg, tokenizer, args.questions, args.group, args.response_tokens)
    return make_train_batch(trajs, tokenizer.pad_token_id or 0)


def _run_setting(cfg, learner_cfg, batch, args, profile: str | None = None) -> dict:
    """One setting in a process of its own: its own peak memory, nothing left over from the one before.
    A failure (out of memory, say) comes back as `{"error": "<type>: <message>"}`."""
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(bench_setting, (cfg, learner_cfg, batch, args.steps, args.random_init,
                                              getattr(args, "memory_gib", None), profile))
    except Exception as e:  # noqa: BLE001 - the measurement of this setting failed; the others still run
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"  failed: {type(e).__name__}: {first[:300]}", flush=True)
        return {"error": f"{type(e).__name__}: {first[:300]}"}


CPU_DTYPE_SETTINGS: dict[str, dict[str, Any]] = {"learner.dtype=bf16": {"dtype": "bf16"},
                                                 "learner.dtype=fp32": {"dtype": "fp32"}}
"""What a CPU run without `--setting` measures: bf16 and fp32 side by side (bf16 is 27x slower than fp32 where the
CPU emulates it, `configs.cpu_features`)."""


def run_local(args, cfg) -> dict:
    """The benchmark of the module docstring; returns the summary written to `--out` (rewritten after
    every setting, so a run stopped part-way keeps what it measured)."""
    import torch

    from actors.learner.flops import matmul_peak_flops, update_flops

    batch = _batch(args, cfg)
    update = {"mini_batch_size": batch.size, "num_ranks": 1}
    if torch.cuda.is_available() and cfg.learner.gpus_per_rank == 0 and args.cuda:
        update["gpus_per_rank"] = 1.0
    device = "cuda" if update.get("gpus_per_rank", cfg.learner.gpus_per_rank) > 0 and torch.cuda.is_available() else "cpu"
    settings = {text or "config": parse_setting(text) for text in args.setting} or (
        CPU_DTYPE_SETTINGS if device == "cpu" else {"config": {}})
    peaks: dict[str, float] = {}  # dtype -> the measured matmul peak (CPU) or --peak-tflops (GPU)

    def peak_of(dtype: str) -> float:
        if dtype not in peaks:
            peaks[dtype] = args.peak_tflops * 1e12 if device == "cuda" else matmul_peak_flops(
                dtype, size=2048 if dtype == "fp32" or host_cpu().native_bf16 else 512)  # emulated bf16: ~1 GFLOP/s
        return peaks[dtype]

    peak = peak_of(cfg.learner.dtype)
    summary = {"model": cfg.learner.model, "shape": args.shape, "questions": args.questions, "group": args.group,
               "sequences": batch.size, "prompt_columns": batch.prompt_len, "response_columns": batch.response_len,
               "unpacked_tokens": int(batch.attention_mask.sum()), "dtype": cfg.learner.dtype,
               "gradient_checkpointing": cfg.learner.gradient_checkpointing,
               "micro_batch_size": cfg.learner.micro_batch_size, "peak_flops": peak, "device": device,
               "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
               "memory_gib": getattr(args, "memory_gib", None), "results": {}}
    results = summary["results"]
    for name, change in settings.items():
        print(f"{name}: {batch.size} sequences, prompt {batch.prompt_len} columns, response {batch.response_len}",
              flush=True)
        # The setting's values checked (and nested ones, such as lora, built) by the schema.
        learner_cfg = type(cfg.learner).model_validate({**cfg.learner.model_dump(), **update, **change})
        profile = None
        if getattr(args, "profile", None):
            slug = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:120]  # plain file names
            profile = str(Path(args.profile) / f"{slug}.txt")
        r = results[name] = _run_setting(cfg, learner_cfg, batch, args, profile)
        if "error" not in r:
            s = r.pop("flops_model")
            r["model_flops"] = update_flops(s["decoder_params"], s["hidden"], s["vocab"], int(r["sequence_tokens"]),
                                            int(r["policy_tokens"]))
            r["dtype"] = learner_cfg.dtype
            r["peak_flops"] = peak_of(learner_cfg.dtype)
            r["mfu"] = r["model_flops"] / r["update_s"] / r["peak_flops"]
            r["tokens_per_s"] = r["sequence_tokens"] / r["update_s"]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2))
    parts = []
    for name, r in results.items():
        if "error" in r:
            parts.append(f"{name}: error={r['error'].split(':')[0]}")
            continue
        parts.append(f"{name}: dtype={r['dtype']} update_s={r['update_s']:.3g} sequence_tokens={r['sequence_tokens']:.0f} "
                     f"mfu={r['mfu']:.3g} peak_gib={r['peak_bytes'] / 2**30:.2f}")
    done = [r for r in results.values() if "error" not in r]
    speedup = f" speedup={done[0]['update_s'] / done[-1]['update_s']:.2f}x" if len(done) > 1 else ""
    where = device if device == "cuda" else f"cpu {'+'.join(host_cpu().isa_names()) or 'no-AVX2'}" + (
        "" if host_cpu().native_bf16 else " (bf16 emulated)")
    print(f"learner local ({cfg.learner.model}, {args.shape}, {args.questions}x{args.group}, {where}): "
          + "; ".join(parts) + speedup, flush=True)
    return summary
