"""The paper-scale configs hold the papers' settings (their own numbers, section by section)."""

from __future__ import annotations

from actors.engines.spec import engine_spec
from configs.loader import load_config
from recipes import get_recipe


def test_r_search_verifier_is_llama_3_2_3b_instruct():
    # R-Search §4.2: "we use a different family open-source model, Llama-3.2-3B-Instruct" for Eq. 4.
    cfg = load_config("configs/r_search_gpu.yaml")
    recipe = get_recipe("r_search", **cfg.recipe_config())
    assert recipe.frozen_roles() == ("verifier",)
    assert engine_spec(cfg, "verifier").model == "meta-llama/Llama-3.2-3B-Instruct"
    assert cfg.learner.model == "Qwen/Qwen2.5-7B-Instruct"


def test_eval_rar_ships_the_papers_two_3b_models_and_nothing_else_differs():
    # Eval-RAR §5.1 / Limitations: "all experiments were conducted with 3B models", Base and Instruct.
    base = load_config("configs/eval_rar_gpu.yaml")
    instruct = load_config("configs/eval_rar_instruct_gpu.yaml")
    assert base.learner.model == "Qwen/Qwen2.5-3B" and instruct.learner.model == "Qwen/Qwen2.5-3B-Instruct"
    a, b = base.model_dump(), instruct.model_dump()
    for cfg in (a, b):
        cfg.pop("name"), cfg["learner"].pop("model")
    assert a == b
    # App. A.2: batch 512, micro-batch 16, lr 1e-6, G = 5, beta 0.001, eps 0.2; §5.1: 200 steps, top-3.
    assert (base.train.questions_per_step, base.learner.micro_batch_size, base.learner.lr) == (512, 16, 1e-6)
    assert (base.rollout.samples_per_prompt, base.algorithm.kl_coef, base.algorithm.clip_eps) == (5, 0.001, 0.2)
    assert (base.train.total_steps, base.retrieval.topk, base.rollout.gpu_memory_utilization) == (200, 3, 0.6)


def test_every_training_config_states_its_algorithm():
    # No recipe default applies: a config that did not say would train with AlgorithmConfig()'s GRPO.
    from pathlib import Path

    from configs.loader import _read_with_base

    for path in sorted(Path("configs").glob("*.yaml")):
        raw = _read_with_base(path, str(path))
        if "recipe" in raw.get("train", {}):
            assert "advantage_estimator" in raw.get("algorithm", {}), f"{path} does not state algorithm.advantage_estimator"


def test_gpu_configs_train_with_the_papers_algorithms():
    from tests.algorithm_presets import RECIPE_PRESETS

    for recipe, name in [("s3", "s3"), ("search_r1", "search_r1"), ("r1_searcher", "r1_searcher"),
                         ("r_search", "r_search"), ("eval_rar", "eval_rar"), ("eval_rar", "eval_rar_instruct")]:
        algo = load_config(f"configs/{name}_gpu.yaml").algorithm
        preset = dict(RECIPE_PRESETS[recipe])
        if recipe == "r1_searcher":  # §3.3: "KL divergence set to 0 for Qwen-2.5-7B-Base and 1e-4 for Llama"
            assert preset.pop("kl_coef") == 1e-4 and algo.kl_coef == 0.0
        for key, value in preset.items():
            assert getattr(algo, key) == value, (name, key)


def test_r_search_evaluates_with_top5_and_temperature_0_1_for_every_method():
    # R-Search §4.3: "During evaluation, we align the top-k retrieval setting to 5 across all methods";
    # A.3: "During inference, we set the temperature to 0.1". Training keeps top-3.
    from pipelines.evaluate import eval_judge_config, eval_sampling, plan_methods

    cfg = load_config("configs/r_search_gpu.yaml")
    assert cfg.recipe_config()["topk"] == 3
    plans = plan_methods(cfg, ["direct", "naive_rag", "policy", "untrained"], None)
    assert {p.method: p.recipe_config["topk"] for p in plans} == {"direct": 5, "naive_rag": 5, "policy": 5,
                                                                   "untrained": 5}
    assert eval_sampling(cfg) == {"temperature": 0.1, "top_p": 1.0, "seed": 0}
    # s3 keeps its training top-3 and greedy decoding; the judge is the frozen generator's unless eval says.
    s3 = load_config("configs/s3_gpu.yaml")
    assert {p.recipe_config["topk"] for p in plan_methods(s3, ["naive_rag", "policy"], None)} == {3}
    assert eval_sampling(s3)["temperature"] == 0.0
    assert s3.eval_judge_model == "Qwen/Qwen2.5-14B-Instruct-GPTQ-Int4"
    other = load_config("configs/s3_gpu.yaml", ["eval.judge_model=Qwen/Qwen2.5-7B-Instruct", "eval.max_turns=2"])
    assert engine_spec(eval_judge_config(other), "judge").model == "Qwen/Qwen2.5-7B-Instruct"
    assert plan_methods(other, ["policy"], None)[0].recipe_config["max_turns"] == 2


def test_evaluation_may_run_the_frozen_generator_on_another_engine():
    """`eval.frozen_backend`: training keeps the generator on hf (one process beside the learners), the
    evaluation's baselines and s3 answers run on vLLM; unset, the training engine is kept."""
    from pipelines.evaluate import eval_frozen_config, plan_methods

    main = load_config("configs/main_cpu.yaml", ["frozen.backend=hf", "eval.frozen_backend=vllm"])
    assert main.frozen.backend == "hf" and main.eval.frozen_backend == "vllm"
    evaluated = eval_frozen_config(main)
    assert evaluated.frozen.backend == "vllm" and main.frozen.backend == "hf"  # a copy; training's is untouched
    (rag,) = plan_methods(evaluated, ["naive_rag"], None)
    assert rag.spec.backend == "vllm"
    same = load_config("configs/s3_cpu.yaml")
    assert eval_frozen_config(same) is same


def test_eval_section_errors_name_the_field():
    import pytest

    with pytest.raises(Exception, match="eval.topk"):
        load_config("configs/r_search_gpu.yaml", ["eval.topk=500"])
    with pytest.raises(Exception, match="eval.temperature"):
        load_config("configs/r_search_gpu.yaml", ["eval.temperature=-0.1"])


def test_r1_searcher_selects_data_with_the_instruct_model_and_the_selection_prompt():
    # R1-Searcher §2.1: "We utilize the Qwen-2.5-7B-Instruct model ... and prompt the model (Prompt 2.1)";
    # §2.2.2 / §3.3: the RL policy is Qwen-2.5-7B-Base with the base-model prompt.
    from pipelines.prepare.r1_difficulty import selection_chat, selection_model, selection_recipe_config

    cfg = load_config("configs/r1_searcher_gpu.yaml")
    assert selection_model(cfg) == "Qwen/Qwen2.5-7B-Instruct" and selection_chat(cfg) is True
    assert selection_model(cfg, "other") == "other"
    rcfg = selection_recipe_config(cfg)
    assert (rcfg.prompt, rcfg.stage, rcfg.max_turns) == ("data_selection", 2, 8)
    prompt = get_recipe("r1_searcher", rcfg).start("Who wrote Hamlet?", ["William Shakespeare"]).prompt
    system = prompt.messages[0]["content"]
    assert system.startswith("You are a helpful assistant. Given a question, you should answer it by first thinking")
    assert "You should perform thinking with decomposing, reflecting, brainstorming, verifying, refining, and revising." in system
    assert '"<|begin_of_query|> search query (only keywords) here <|end_of_query|>". Then,' in system
    assert prompt.messages[1]["content"] == "Who wrote Hamlet?"
    # Training: the base model, no chat template, §2.2.2's prompt ending in "Assistant: <think>".
    assert cfg.learner.model == "Qwen/Qwen2.5-7B" and cfg.rollout.chat is False
    train = get_recipe("r1_searcher", **cfg.recipe_config()).start("Who wrote Hamlet?", ["William Shakespeare"],
                                                                   chat=cfg.rollout.chat)
    assert train.prompt.completion.startswith("The User asks a question, and the Assistant solves it.")
    assert train.prompt.completion.endswith("User:Who wrote Hamlet?\nAssistant: <think>")
