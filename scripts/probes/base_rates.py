"""Base rates of untrained policies: how often each (model x recipe x prompt variant) searches validly.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.probes.base_rates [--config configs/train_cpu.yaml] \
        [--models gemma3-270m,smollm2-135m-instruct] [--recipes search_r1,r1_searcher] \
        [--variants plain,example,prefill,example+prefill] [--questions 6] [--samples 4] [--max-turns 2]
        [--recipe-options '{"stage": 1}'] [key=value ...]

RL cannot reinforce what the policy never samples, so measure before training. Each model gets one
RolloutWorker (the config's policy engine, `rollout.*` limits); each recipe runs `--samples` episodes
(temperature `rollout.temperature`, seeded) on the first `--questions` training questions against the
real retrieval pool (`--max-turns` search steps, top-k `retrieval.topk`), in every prompt variant: `plain` (the paper's prompt), `example` (one worked
example of the loop in the recipe's tags, `worked_example=true`), `prefill` (the response starts with
the recipe's opening search tag) and `example+prefill`. Chat models take their chat template. Rewards
are computed for recipes without frozen LLMs. Prints one markdown table (valid-action rate, episodes
that searched, searches per episode, searches whose query shares a content word with the question,
episodes ending in an answer, mean reward) and writes it as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from scripts.cli import parse_config, user_errors

COLUMNS = (("reward_mean", "reward"), ("reward_differs", "questions with differing reward"),
           ("f1_differs", "questions with differing F1"), ("searched_episode_rate", "episodes searching"),
           ("relevant_search_rate", "relevant queries"), ("finish/answer", "answered"),
           ("answer_forced_rate", "answer forced"), ("answer_f1", "answer F1"), ("answer_cover_em", "cover-EM"),
           ("valid_action_rate", "valid actions"))


def differing_share(trajs: list[dict], value) -> float:
    """Share of questions (GRPO groups) whose samples' `value(trajectory)` are not all equal: where a
    group-relative advantage is non-zero, so GRPO has something to learn from. 0.0 for no trajectories."""
    groups: dict[str, set] = {}
    for t in trajs:
        groups.setdefault(t["group_id"], set()).add(round(float(value(t)), 6))
    return sum(len(v) > 1 for v in groups.values()) / len(groups) if groups else 0.0


def answer_f1(traj: dict) -> float:
    """Token F1 of a trajectory's final answer against its gold answers (no answer: 0)."""
    from recipes.metrics import f1_score

    answer = (traj.get("final") or {}).get("answer")
    return f1_score(answer, traj["golden_answers"]) if answer is not None else 0.0


def variant_options(recipe_cls: type, variant: str) -> dict:
    """Recipe options of a prompt variant ("plain", "example", "prefill", "example+prefill").

    Raises:
        ValueError: an unknown variant name.
    """
    parts = set(variant.split("+")) - {"plain"}
    if parts - {"example", "prefill"}:
        raise ValueError(f"--variants: unknown variant {variant!r}; use plain, example, prefill or example+prefill")
    options: dict = {}
    if "example" in parts:
        options["worked_example"] = True
    if "prefill" in parts:
        options["prefill"] = recipe_cls.search_tags[0]
    return options


def format_table(rows: list[dict]) -> str:
    """The probe's rows as a markdown table."""
    head = "| model | recipe | variant | episodes | " + " | ".join(c[1] for c in COLUMNS) + " |"
    lines = [head, "|" + " --- |" * 3 + " ---: |" * (1 + len(COLUMNS))]
    for r in rows:
        cells = [r["model"], r["recipe"], r["variant"], f"{r['episodes']:.0f}"]
        cells += [f"{r[k]:.2f}" for k, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Entry point: measure the base rates of untrained policies and print the table.

    Usage: SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.probes.base_rates [--models M,..]
    [--recipes R,..] [--variants V,..] [--questions 6] [--samples 4] [key=value ...]
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gemma3-270m,smollm2-135m-instruct")
    parser.add_argument("--recipes", default="search_r1,r1_searcher")
    parser.add_argument("--variants", default="plain,example,prefill,example+prefill")
    parser.add_argument("--questions", type=int, default=6, help="training questions (count)")
    parser.add_argument("--samples", type=int, default=4, help="episodes per question")
    parser.add_argument("--max-turns", type=int, default=2, help="search/invalid steps per episode (recipe max_turns)")
    parser.add_argument("--recipe-options", default="{}", type=json.loads,
                        help='JSON options for every probed recipe, e.g. \'{"stage": 1}\' (r1_searcher stage-1 rewards)')
    parser.add_argument("--out", default="runs/base_rates.json")
    parser.add_argument("--dump", default="", help="folder to write each row's trajectories to (JSONL.gz); '' = none")
    parser.add_argument("--sample-seed", type=int, default=None,
                        help="draw the questions as a seeded sample spread over the datasets (default: the first N)")
    args, cfg = parse_config(parser, argv)
    import ray

    from actors.lifecycle import ActorSet
    from actors.retrieval.pool import start_retrieval_pool
    from actors.rollout.worker import start_rollout_workers
    from cluster.ray_init import init_ray
    from pipelines.build_index import ensure_index
    from pipelines.data import iter_qa, pack_file
    from pipelines.train_metrics import rollout_metrics
    from recipes import RECIPES, get_recipe
    from recipes.tagged import TaggedSearchRecipe

    recipes = args.recipes.split(",")
    tagged = sorted(n for n, c in RECIPES.items() if issubclass(c, TaggedSearchRecipe))
    unknown = [r for r in recipes if r not in tagged]
    if unknown:
        parser.exit(2, f"error: --recipes: {unknown} are not search-tag recipes; choose from {tagged}\n")
    try:
        plans = [(r, v, variant_options(RECIPES[r], v)) for r in recipes for v in args.variants.split(",")]
    except ValueError as e:
        parser.exit(2, f"error: {e}\n")
    ro, rows = cfg.rollout, []
    limits = {"max_new_tokens_per_turn": ro.max_new_tokens_per_turn, "max_observation_tokens": ro.max_observation_tokens,
              "max_total_tokens": ro.max_total_tokens}
    with user_errors():
        if args.sample_seed is None:
            examples = [asdict(q) for q in iter_qa(pack_file(cfg.data.train, cfg.data.dir), limit=args.questions)]
        else:
            from pipelines.evaluate import load_questions

            examples = load_questions(cfg.data.train, cfg.data.dir, args.questions, sample_seed=args.sample_seed)
        started = init_ray(cfg.ray)
        actors = ActorSet()
        try:
            ensure_index(cfg)  # built (resuming) when missing
            pool = actors.adopt(start_retrieval_pool(cfg.index.dir, cfg.retrieval))
            for model in args.models.split(","):
                (worker,) = start_rollout_workers(actors, cfg, pool, model=model, count=1)
                actors.wait_ready([worker], timeout_s=1800, what=f"the policy engine of {model}")
                for recipe, variant, options in plans:
                    config = {"topk": cfg.retrieval.topk, "max_turns": args.max_turns, **args.recipe_options, **options}
                    scored = not get_recipe(recipe, config).frozen_roles()
                    trajs = ray.get(worker.run.remote(
                        examples, recipe, recipe_config=config, n=args.samples, limits=limits, chat=ro.chat,
                        sampling={"temperature": ro.temperature, "top_p": ro.top_p, "seed": cfg.seed},
                        compute_reward=scored))
                    m = {k.removeprefix("rollout/"): v for k, v in rollout_metrics(trajs).items()}
                    m["reward_differs"] = differing_share(trajs, lambda t: t.get("reward") or 0.0)
                    m["f1_differs"] = differing_share(trajs, answer_f1)
                    if args.dump:  # transcripts to read: a rising reward is not yet learning
                        from pipelines.prepare.common import write_jsonl_gz

                        write_jsonl_gz(Path(args.dump) / f"{model}-{recipe}-{variant}.jsonl.gz", trajs)
                    rows.append({"model": model, "recipe": recipe, "variant": variant, "options": options, **m})
                    print(format_table(rows[-1:]).splitlines()[-1], flush=True)
                actors.stop([worker])
        finally:
            actors.stop()
            if started:
                ray.shutdown()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    print()
    print(format_table(rows))
    print(f"\n{args.questions} training questions x {args.samples} samples, temperature {ro.temperature}; "
          f"rows in {args.out}")


if __name__ == "__main__":
    main()
