"""Benchmark the served searcher against the way Search-R1's `infer.py` serves a question today.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.serve --checkpoint PATH [--questions 16] [key=value ...]

The same test questions (a seeded sample spread over the split's datasets) go through two paths:
(a) baseline: one process, one question at a time, transformers `generate` (greedy) until the
    recipe's closing tag, a `POST /retrieve` call, the documents appended as text, repeat (the whole
    text re-tokenized every turn, as `infer.py` does); it calls the app's own `/retrieve`; for s3, the
    frozen generator then answers from the selected documents (transformers, greedy), as the endpoint's does;
(b) the endpoint (`serving.app`, started here on its own local cluster): `POST /v1/search` from 16,
    then 4, then 1 concurrent clients (16 first: it runs with a cold prefix cache).
Prints where the endpoint's time goes (mean seconds per request: engine, retrieval, queue) and ends
with `serve: qps_1=… qps_4=… qps_16=… p50_s=… p95_s=… baseline_qps=… speedup=…` (p50/p95: request
latency at 16 clients; speedup: qps_16 / baseline_qps). Writes JSON with --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
from pathlib import Path

from scripts.cli import sigterm_as_interrupt
from scripts.ops.soak_report import percentile
from scripts.serve import served_config


async def endpoint_run(url: str, questions: list[str], clients: int, timeout_s: float) -> dict:
    """All `questions` through `POST /v1/search` with `clients` concurrent clients.

    Returns:
        {clients, qps, latencies_s, mean generate_s / search_s / queue_s / total_s, statuses,
        finish_reasons}.
    """
    import httpx

    from serving.auth import auth_headers

    sem = asyncio.Semaphore(clients)
    results: list[tuple[float, httpx.Response]] = []

    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, headers=auth_headers()) as client:
        async def one(q: str) -> None:
            async with sem:
                t = time.perf_counter()
                r = await client.post("/v1/search", json={"question": q})
                results.append((time.perf_counter() - t, r))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(q) for q in questions))
        wall = time.perf_counter() - t0
    ok = [r.json() for _, r in results if r.status_code == 200]
    mean = {k: statistics.fmean(b["timings"][k] for b in ok) if ok else float("nan")
            for k in ("total_s", "generate_s", "search_s", "queue_s")}
    mean["searches"] = statistics.fmean(b["usage"]["searches"] for b in ok) if ok else float("nan")
    return {"clients": clients, "qps": len(questions) / wall, "wall_s": wall, "latencies_s": [t for t, _ in results],
            "mean": mean, "statuses": sorted(r.status_code for _, r in results),
            "finish_reasons": sorted(b["finish_reason"] for b in ok), "answers": [b["answer"] for b in ok]}


def baseline_run(cfg, model_path: str, url: str, questions: list[str]) -> dict:
    """Search-R1 `infer.py`'s way: per question, generate with transformers until a stop string,
    search over HTTP, append the documents, repeat; one question at a time.

    The episode is the endpoint's: the evaluation's recipe options (`Config.eval_recipe_config`: top-k,
    max turns), greedy, and the endpoint's token limits (`Config.searcher_limits`): each turn generates
    at most `max_new_tokens_per_turn` and what is left of `max_total_tokens` (the forced-answer cap
    where the recipe forces one); observations are fitted to `max_observation_tokens` as the agent loop
    fits them (`fit_documents`), and an observation with no room ends the episode ("max_total_tokens").
    Where the frozen generator answers (s3), the same episode runs in the same plain loop: the searcher
    selects, then the generator (`frozen.model`, transformers, greedy, `frozen.max_answer_tokens`) answers
    from the selected documents in the s3 Fig. 12 prompt, one question at a time.
    """
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serving.auth import auth_headers

    from actors.engines.models import resolve_model
    from actors.rollout.agent_loop import fit_documents
    from recipes import get_recipe
    from scripts.peer.trl_search import search_r1_doc

    recipe = get_recipe(cfg.train.recipe, cfg.eval_recipe_config())
    path = resolve_model(model_path)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype="auto").eval()
    answer = generator_answerer(cfg) if recipe.generator_answers else None
    chat = bool(tok.chat_template) if cfg.rollout.chat is None else cfg.rollout.chat
    limits, k = cfg.searcher_limits(), recipe.config.topk
    client = httpx.Client(base_url=url, timeout=120.0, headers=auth_headers())  # a deployed server has a token

    def retrieve(query: str) -> list:
        r = client.post("/retrieve", json={"queries": [query], "topk": k, "return_scores": True})
        r.raise_for_status()
        return [search_r1_doc(item) for item in r.json()["result"][0]]

    latencies, reasons = [], []
    t0 = time.perf_counter()
    encode = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    decode = lambda ids: tok.decode(list(ids), skip_special_tokens=True)  # noqa: E731
    for q in questions:
        t = time.perf_counter()
        ep = recipe.start(q, initial_docs=retrieve(q) if recipe.initial_search else None, chat=chat)
        text = ep.prompt.render(tok if chat else None)
        while not ep.done:
            ids = tok(text, return_tensors="pt", add_special_tokens=not chat)
            budget = min(limits["max_new_tokens_per_turn"], limits["max_total_tokens"] - ids["input_ids"].shape[1])
            if ep.answer_forced:
                budget = min(budget, getattr(recipe.config, "forced_answer_tokens", budget))
            if budget < 1:
                recipe.finish(ep, "max_total_tokens")
                break
            with torch.inference_mode():
                out = model.generate(**ids, max_new_tokens=budget, do_sample=False, stop_strings=list(recipe.stop_strings),
                                     tokenizer=tok, pad_token_id=tok.pad_token_id or tok.eos_token_id)
            new_ids = out[0, ids["input_ids"].shape[1]:]
            new = tok.decode(new_ids, skip_special_tokens=True)
            turn = recipe.step(ep, new, "length" if len(new_ids) >= budget else "stop")
            if turn.needs_retrieval:
                recipe.observe(ep, fit_documents(recipe, retrieve(turn.action.query),
                                                 limits["max_observation_tokens"], encode, decode))
            obs = encode(turn.observation)
            cut = len(obs) > limits["max_observation_tokens"]  # a last resort after fit_documents, as in the loop
            obs = obs[: limits["max_observation_tokens"]]
            if turn.observation and ids["input_ids"].shape[1] + len(new_ids) + len(obs) > limits["max_total_tokens"]:
                recipe.finish(ep, "max_total_tokens")  # no room for the observation, as the agent loop ends it
                break
            text += new + (decode(obs) if cut else turn.observation)
        if answer is not None:  # s3: the generator reads what the searcher kept
            answer(q, recipe.format_docs((ep.final or recipe.final_output(ep)).selected_docs))
        latencies.append(time.perf_counter() - t)
        reasons.append(ep.stop_reason)
    wall = time.perf_counter() - t0
    client.close()
    return {"qps": len(questions) / wall, "wall_s": wall, "latencies_s": latencies, "finish_reasons": sorted(reasons),
            "generator": answer is not None}


def generator_answerer(cfg):
    """`answer(question, context) -> str`: the frozen generator (`frozen.model`) with transformers, greedy,
    at most `frozen.max_answer_tokens`, on the s3 Fig. 12 answer prompt (chat template where the model
    has one, else the plain prompt with an "Answer:" cue, as `actors.frozen.scorer.FrozenLLM` renders it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actors.engines.models import resolve_model
    from recipes.base import ANSWER_PROMPT

    path = resolve_model(cfg.frozen.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype="auto").eval()

    def answer(question: str, context: str) -> str:
        prompt = ANSWER_PROMPT.format(question=question, context=context)
        if tok.chat_template:
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                          return_tensors="pt", return_dict=True)
        else:
            ids = tok(prompt + "\nAnswer:", return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=cfg.frozen.max_answer_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id)
        return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()

    return answer


def check_baseline_models(parser: argparse.ArgumentParser, cfg, policy: str) -> None:
    """Exit 2 with an `error:` line, before anything starts, when a model the baseline loads (the served
    policy; `frozen.model` where the generator answers) does not resolve to a loadable directory or name."""
    from actors.engines.models import resolve_model
    from recipes import recipe_class

    fields = [("--checkpoint", policy)]
    if recipe_class(cfg.train.recipe).generator_answers:
        fields.append(("frozen.model", cfg.frozen.model))
    for field, name in fields:
        try:
            resolve_model(name)
        except (OSError, ValueError, RuntimeError, ImportError) as e:  # ImportError: a packaged model not installed
            parser.exit(2, f"error: {field}={name!r}: {e}\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point: baseline (infer.py's loop) vs the endpoint at 1/4/16 clients; prints the `serve:` line."""
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=16, help="test questions (count) per run")
    parser.add_argument("--out", default=None, help="write the measurements as JSON here")
    args, served, cfg = served_config(parser, argv)
    from cluster.ray_init import init_ray
    from pipelines.build_index import ensure_index
    from pipelines.evaluate import load_questions
    from scripts.cli import user_errors
    from serving.launch import start_app, stop_app

    with user_errors():
        questions = [e["question"] for e in load_questions(cfg.data.test, cfg.data.dir, args.questions,
                                                           sample_seed=cfg.seed)]
    check_baseline_models(parser, cfg, served.model)  # the baseline runs last: its models are checked first
    local = init_ray(cfg.ray)
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)  # a SIGTERM still removes the app and our cluster
    try:
        with user_errors():
            ensure_index(cfg)  # built (resuming) when missing
        t = time.perf_counter()
        url = start_app(cfg, served)
        print(f"endpoint up in {time.perf_counter() - t:.0f} s at {url}; {len(questions)} questions, recipe "
              f"{cfg.train.recipe}, policy {served.model}", flush=True)
        runs = {}
        for clients in (16, 4, 1):
            runs[clients] = asyncio.run(endpoint_run(url, questions, clients, cfg.serve.request_timeout_s + 30))
            r = runs[clients]
            m = r["mean"]
            print(f"endpoint, {clients:2d} clients: {r['qps']:.3f} q/s ({r['wall_s']:.1f} s), statuses {set(r['statuses'])}; "
                  f"mean per request {m['total_s']:.2f} s = engine {m['generate_s']:.2f} + retrieval "
                  f"{m['search_s']:.2f} + queue {m['queue_s']:.2f} (+ other); {m['searches']:.2f} searches per question",
                  flush=True)
        base = baseline_run(cfg, served.model, url, questions)
        print(f"baseline (infer.py loop{' + generator' if base['generator'] else ''}, transformers, one at a time): {base['qps']:.3f} q/s ({base['wall_s']:.1f} s)")
    finally:
        stop_app(local)
    lat16 = runs[16]["latencies_s"]
    line = (f"serve: qps_1={runs[1]['qps']:.3f} qps_4={runs[4]['qps']:.3f} qps_16={runs[16]['qps']:.3f} "
            f"p50_s={percentile(lat16, 0.5):.2f} p95_s={percentile(lat16, 0.95):.2f} baseline_qps={base['qps']:.3f} "
            f"speedup={runs[16]['qps'] / base['qps']:.2f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"endpoint": runs, "baseline": base, "line": line}, indent=1))
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
