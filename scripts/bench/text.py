"""Learner benchmark batches of real text (`scripts.bench.learner`, `scripts.bench.learner_local`,
`scripts.ops.gpu_check`): Search-R1 prompts of dev questions, then turns of policy text and passages."""

from __future__ import annotations

import random


def real_text_trajectories(cfg, tokenizer, seqs: int, response_tokens: int, seed: int = 0) -> list[dict]:
    """Trajectories of real tokens: a recipe prompt, then policy text and passages in turns."""
    from pipelines.data import iter_corpus, iter_qa, pack_file
    from recipes import get_recipe

    rng = random.Random(seed)
    recipe = get_recipe("search_r1")
    passages = [p.text for p in iter_corpus(pack_file(cfg.data.corpus, cfg.data.dir), limit=2000)]
    out = []
    for i, ex in enumerate(iter_qa(pack_file(cfg.data.dev, cfg.data.dir), limit=seqs)):
        prompt = recipe.start(ex.question, ex.golden_answers, [], chat=False).prompt.render(None)
        ids = tokenizer.encode(prompt)
        response, mask = [], []
        while len(response) < response_tokens:
            policy = tokenizer.encode(f"<think>{rng.choice(passages)[:200]}</think>\n<search> {ex.question} </search>",
                                      add_special_tokens=False)
            obs = tokenizer.encode(f"\n\n<information>{rng.choice(passages)}</information>\n\n", add_special_tokens=False)
            response += policy + obs
            mask += [1] * len(policy) + [0] * len(obs)
        response, mask = response[:response_tokens], mask[:response_tokens]
        out.append({"prompt_ids": ids, "response_ids": response, "loss_mask": mask,
                    "logprobs": [0.0] * len(response), "group_id": f"g{i // 4}"})
    return out
