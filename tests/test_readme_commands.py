"""Every command in the README works on a fresh clone after `bash scripts/main.sh`.

Each command line of the README's ```bash blocks is parsed by its own entry point's argument parser and
config loader (stopped right after them), with `runs/<main-job run>` standing for a run the main job
leaves. Then the command must search an index the main job built (`configs/main_cpu.yaml`'s), or its
entry point (or the pipeline function it runs) must build the index its config names
(`pipelines.build_index.ensure_index` / `ready_index`). A command marked `# needs ...` (a GPU, a cluster,
a wandb account) is parsed but not held to the index rule.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shlex
from pathlib import Path

import pytest

from configs import load_config, save_config

ROOT = Path(__file__).resolve().parents[1]
RUN = "runs/<main-job run>"  # the README's placeholder for the main job's run directory
BUILDERS = ("ensure_index(", "ready_index(")


def readme_commands() -> list[str]:
    """The command lines of README.md's ```bash blocks (comment-only lines dropped)."""
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines += [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return lines


class _Parsed(Exception):
    def __init__(self, namespace, cfg):
        super().__init__("parsed")
        self.namespace, self.cfg = namespace, cfg


def entry_point(line: str, run_dir: Path) -> tuple[str, list[str], str | None]:
    """(module, argv, `# needs` marker or None) of one README command line; asserts its form."""
    command, _, comment = line.partition("  #")
    need = comment.strip() if comment.strip().startswith("needs") else None
    assert not re.search(r"(^|\s)/(work|tmp|home|mnt)/", command), f"an absolute path in: {line}"
    words = shlex.split(command.replace(RUN, str(run_dir)))
    assert not [w for w in words if "<" in w or ">" in w], f"a placeholder other than {RUN!r} in: {line}"
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    if words[0] == "bash":
        script = words[1]
        assert (ROOT / script).is_file(), f"{script} does not exist: {line}"
        if script == "scripts/main.sh":
            return "scripts.main", words[2:], need
        if script == "scripts/serve.sh":
            return "scripts.serve", ["--checkpoint", *words[2:]], need
        assert script == "scripts/test.sh", f"no rule for {script}: {line}"
        return "", [], need
    assert words[:2] == [".venv/bin/python", "-m"], f"Python entry points run as .venv/bin/python -m: {line}"
    assert env.get("SEARCHRL_DATA") == "../shared/data", f"SEARCHRL_DATA=../shared/data first: {line}"
    module = words[2]
    assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), f"no module {module}: {line}"
    return module, words[3:], need


def parse(module: str, argv: list[str], monkeypatch) -> tuple:
    """(args, config) as `module.main(argv)` parses them; it stops there, before anything starts."""
    import scripts.cli
    import scripts.serve

    real = scripts.cli.parse_config

    def stop_after_parsing(*a, **kw):
        raise _Parsed(*real(*a, **kw))

    mod = importlib.import_module(module)
    for m in (mod, scripts.serve, scripts.cli):
        if hasattr(m, "parse_config"):
            monkeypatch.setattr(m, "parse_config", stop_after_parsing)
    with pytest.raises(_Parsed) as parsed:
        mod.main(argv)
    return parsed.value.namespace, parsed.value.cfg


def builds_index(module: str) -> bool:
    """Whether the entry point, or a `pipelines` function it imports and runs, builds a missing index."""
    mod = importlib.import_module(module)
    source = inspect.getsource(mod)
    if any(b in source for b in BUILDERS):
        return True
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipelines."):
            pipeline = importlib.import_module(node.module)
            for alias in node.names:
                obj = getattr(pipeline, alias.name, None)
                if callable(obj) and any(b in inspect.getsource(obj) for b in BUILDERS):
                    return True
    return False


@pytest.fixture
def main_job_run(tmp_path) -> Path:
    """What `bash scripts/main.sh` leaves: a run directory with its config and a finished checkpoint."""
    run = tmp_path / "runs" / "search_r1-20261202-000000"
    step = run / "checkpoints" / "step-8"
    hf = step / "policy" / "hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_text("")
    (hf / "tokenizer.json").write_text("{}")
    (step / "trainer_state.json").write_text('{"step": 8}')
    save_config(load_config("configs/main_cpu.yaml"), run / "config.yaml")
    return run


def test_the_readme_has_its_commands():
    lines = readme_commands()
    assert "bash scripts/main.sh     # set up .venv, index the corpus, train a searcher, evaluate it (the main job)" \
        in lines and any(ln.startswith("bash scripts/test.sh") for ln in lines)
    assert len(lines) >= 8


@pytest.mark.parametrize("line", readme_commands())
def test_a_readme_command_runs_after_the_main_job(line, main_job_run, monkeypatch):
    monkeypatch.chdir(ROOT)
    module, argv, need = entry_point(line, main_job_run)
    if not module:  # scripts/test.sh: the suite itself
        return
    _, cfg = parse(module, argv, monkeypatch)
    if need:
        return
    main_index = load_config("configs/main_cpu.yaml").index.dir
    assert cfg.index.dir == main_index or builds_index(module), (
        f"{line}: searches {cfg.index.dir}, which the main job does not build ({main_index}), and "
        f"{module} does not build a missing index (pipelines.build_index.ensure_index)")


def test_every_module_and_config_the_docs_name_exists():
    """docs/*.md and README.md name only entry points and configs that exist, and no machine's absolute paths."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for module in set(re.findall(r"-m (scripts(?:\.[a-z_][a-z0-9_]*)+)", text)):
            assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), f"{page.name}: no module {module}"
        for config in set(re.findall(r"(configs/[a-z0-9_]+\.yaml)", text)):
            assert (ROOT / config).is_file(), f"{page.name}: no config {config}"
        assert not re.search(r"\s/work/", text), f"{page.name}: an absolute path of one machine"
