"""TRL's side of `scripts.bench.peer`: GRPO with TRL's `GRPOTrainer` on the prompts bench_peer wrote.

Runs in TRL's own virtual environment (`.venv-trl`, made by the command in `scripts/bench/peer.py`'s
docstring), never in `.venv`; it needs only torch, transformers, trl, datasets and pydantic (the
reward comes from this project's `recipes/`, the same code the searchrl run scores with).

Reads `--data` (JSONL, one row per question in step order: `prompt`, `question`, `golden_answers`),
trains `--steps` GRPO steps of `--questions-per-step` questions × `--samples` completions, and writes
`--out` (JSON): per step the wall seconds, the seconds spent generating, searching and scoring, the
mean reward and the policy's tokens; the rest of a step is TRL's log-prob pass and update.

`--workload single_turn`: TRL generates each completion itself (one answer turn of the naive-RAG
recipe). `--workload multi_turn`: the episodes of `--recipe` run through `scripts.peer.trl_search`
(TRL's `rollout_func` with `env_mask`), searching the project's `/retrieve` at `--retrieve-url`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Entry point (exit 0 after writing `--out`)."""
    p = argparse.ArgumentParser(prog="python -m scripts.peer.trl_runner", description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--model", required=True, help="a Hugging Face model directory (the converted Gemma 3 270M)")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--questions-per-step", type=int, default=2)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999))
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workload", choices=("single_turn", "multi_turn"), default="single_turn")
    p.add_argument("--recipe", default="naive_rag")
    p.add_argument("--recipe-options", default="{}", help="JSON: the recipe's options, as the searchrl run has them")
    p.add_argument("--limits", default="{}", help="JSON: max_new_tokens_per_turn, max_observation_tokens, "
                                                  "max_total_tokens (multi_turn)")
    p.add_argument("--retrieve-url", default="http://127.0.0.1:8001", help="the retrieval server (multi_turn)")
    p.add_argument("--lora", default=None, help="JSON {rank, alpha, target_modules, dropout}: LoRA adapters "
                                                "through peft_config, as searchrl's learner.lora")
    args = p.parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from recipes import get_recipe
    from recipes.base import Doc

    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    need = args.steps * args.questions_per_step
    if len(rows) < need:
        raise SystemExit(f"error: --data has {len(rows)} questions; {args.steps} steps need {need}")
    golds = {r["prompt"]: r["golden_answers"] for r in rows}
    recipe = get_recipe(args.recipe, **json.loads(args.recipe_options))
    timing = {"generate_s": 0.0, "search_s": 0.0, "score_s": 0.0, "tokens": 0, "searches": 0}

    placeholder = [Doc("-", "", "")]  # the episode needs its initial documents; the reward reads only the answer

    def f1_reward(prompts, completions, searchrl_reward=None, **_):
        """The recipe's own episode step and reward (single_turn: recipes.baselines' naive RAG), as searchrl
        scores it; multi_turn episodes were scored by the recipe in the rollout function already."""
        if searchrl_reward is not None:
            return list(searchrl_reward)
        t = time.perf_counter()
        out = []
        for prompt, completion in zip(prompts, completions):
            episode = recipe.start(prompt, golds[prompt], placeholder, chat=False)
            recipe.step(episode, completion)
            out.append(recipe.reward(episode).total)
        timing["score_s"] += time.perf_counter() - t
        return out

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    generate = model.generate

    stops = list(recipe.stop_strings)  # the turn ends where searchrl's rollout ends it

    def timed_generate(*a, **kw):
        t = time.perf_counter()
        # A stopped sequence is padded with EOS: TRL's completion mask ends at the first EOS.
        out = generate(*a, **{**kw, "stop_strings": stops, "tokenizer": tok, "pad_token_id": tok.eos_token_id})
        timing["generate_s"] += time.perf_counter() - t
        prompt_len = kw["input_ids"].shape[1] if "input_ids" in kw else a[0].shape[1]
        new = out[:, prompt_len:]
        timing["tokens"] += int((new != tok.eos_token_id).sum())  # completion tokens, the EOS padding left out
        return out

    if args.workload == "single_turn":  # multi_turn times its own turns (scripts.peer.trl_search)
        model.generate = timed_generate
    steps: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()
            timing.update(dict.fromkeys(timing, 0))

        def on_step_end(self, *_, **__):
            steps.append({"step_s": time.perf_counter() - self.t0, **timing})

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs and steps:
                steps[-1]["reward"] = float(logs["reward"])

    batch = args.questions_per_step * args.samples
    rollout_func, max_completion = None, args.max_new_tokens
    if args.workload == "multi_turn":
        from scripts.peer.trl_search import SearchRollout

        limits = json.loads(args.limits)
        rollout_func = SearchRollout(recipe, {r["prompt"]: r for r in rows}, tok, args.retrieve_url, limits, timing)
        max_completion = limits["max_total_tokens"]
    config = GRPOConfig(
        output_dir=str(Path(args.out).with_suffix("")) + "-trl", max_steps=args.steps, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, num_generations=args.samples, max_completion_length=max_completion,
        temperature=args.temperature, top_p=1.0, learning_rate=args.lr, adam_beta1=args.betas[0],
        adam_beta2=args.betas[1], weight_decay=args.weight_decay, lr_scheduler_type="constant",
        beta=0.0, loss_type="dapo", scale_rewards="group", num_iterations=1, shuffle_dataset=False, bf16=args.bf16,
        use_cpu=True, gradient_checkpointing=True, logging_steps=1, save_strategy="no", report_to="none",
        seed=args.seed, max_grad_norm=1.0)
    peft_config = None
    if args.lora:  # the same adapters as searchrl's learner.lora
        from peft import LoraConfig

        lora = json.loads(args.lora)
        peft_config = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], target_modules=lora["target_modules"],
                                 lora_dropout=lora["dropout"], bias="none", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[f1_reward], args=config,
                          train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows[:need]]),
                          callbacks=[StepTimer()], rollout_func=rollout_func, peft_config=peft_config)
    t = time.perf_counter()
    trainer.train()
    Path(args.out).write_text(json.dumps({"framework": "trl", "steps": steps, "seconds": time.perf_counter() - t}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
