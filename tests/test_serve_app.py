"""`serving.app.build_app` composes the deployments from the config (no Ray started: `.bind` only
builds the application graph; reads Serve's bound deployments, a private attribute, as tests may)."""

from __future__ import annotations

from serving.app import build_app


def deployments(app) -> dict:
    """Name → Deployment of every deployment bound into `app` (the ingress and its arguments)."""
    out, todo = {}, [app]
    while todo:
        d = todo.pop()._bound_deployment
        out[d.name] = d
        todo += [a for a in d.init_args if type(a).__name__ == "Application"]
    return out


def test_build_app_follows_serve_config():
    app = build_app({"checkpoint": "gemma3-270m", "config": "configs/search_r1_learn_cpu.yaml",
                     "overrides": "serve.replicas=3 serve.max_queued_requests=5 serve.max_ongoing_requests=8"})
    deps = deployments(app)
    assert set(deps) == {"Ingress", "Searcher", "Retrieval"}  # search_r1: the policy answers, no generator
    s = deps["Searcher"]
    assert (s.num_replicas, s.max_queued_requests, s.max_ongoing_requests) == (3, 5, 8)
    assert s.ray_actor_options["num_cpus"] == 1.0 and s.init_args[0]["model"] == "gemma3-270m"
    assert s.init_args[1] == "search_r1" and s.init_args[3] == {"temperature": 0.0, "top_p": 1.0, "seed": 0}


def test_serving_runs_the_episode_evaluation_runs():
    """One resolved set of episode settings: recipe options (eval.topk, eval.max_turns), sampling
    (eval.temperature) and token limits as `pipelines.evaluate` plans the searcher's episodes."""
    from configs import load_config
    from pipelines.evaluate import eval_sampling, plan_methods

    config = "configs/search_r1_learn_cpu.yaml"
    overrides = ["eval.topk=5", "eval.max_turns=2", "eval.temperature=0.1", "rollout.max_total_tokens=1500"]
    searcher = deployments(build_app({"checkpoint": "gemma3-270m", "config": config, "overrides": overrides}))["Searcher"]
    cfg = load_config(config, overrides)
    (policy,) = plan_methods(cfg, ["policy"], None)
    assert searcher.init_args[2] == policy.recipe_config and policy.recipe_config["topk"] == 5
    assert policy.recipe_config["max_turns"] == 2
    assert searcher.init_args[3] == eval_sampling(cfg) and searcher.init_args[3]["temperature"] == 0.1
    assert searcher.init_args[4] == policy.limits and policy.limits["max_total_tokens"] == 1500


def test_s3_gets_the_generator_and_autoscaling():
    auto = "serve.autoscaling_config={min_replicas: 1, max_replicas: 2, target_ongoing_requests: 8}"
    deps = deployments(build_app({"checkpoint": "gemma3-270m", "config": "configs/s3_cpu.yaml", "overrides": [auto]}))
    assert set(deps) == {"Ingress", "Searcher", "Retrieval", "Generator"}
    assert deps["Searcher"]._deployment_config.autoscaling_config.max_replicas == 2
