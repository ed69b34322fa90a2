"""What an evaluation reads, checked before any actor starts: the method names, a checkpoint, the
questions of a QA file or MIRAGE (`pipelines.evaluate` runs them). Errors a user can fix are
`EvaluationError`, naming the argument or config field and the fix."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pipelines.checkpoints import CheckpointPathError, model_dir_problem, policy_model_dir
from pipelines.eval_rows import MIRAGE

class EvaluationError(ValueError):
    """An argument or input a user can fix (method list, checkpoint, QA file, limit); the message
    names the argument or config field and the fix."""



METHODS = ("direct", "naive_rag", "policy", "no_search", "untrained", "warm_start", "expert", "rstool")
"""Known method names; see the module docstring."""

DEFAULT_METHODS = ("direct", "naive_rag", "policy")

BASELINES = ("direct", "naive_rag")
"""Methods that are fixed baselines: the frozen generator (`frozen.model`) answers with the recipe of the
same name, whatever the training recipe is and whether that recipe is trainable (`naive_rag` is, for
`scripts.bench.peer`). Only `policy`, `no_search`, `untrained` and `warm_start` run the training recipe on the
policy model; `expert` runs the training recipe's rule-based expert in the policy's place."""

SEARCH_META = ("context_ids", "supporting_titles")
"""A QA row's fields that evaluation keeps for the search measures (`recipes.search_metrics`: gold-paragraph
recall) and the expert (`recipes.expert`); the data pack README lists them."""

# ----------------------------------------------------------------------------- inputs


def resolve_warm_start(path: str | Path) -> str:
    """The warm-started policy of the run that `path` belongs to (`--methods warm_start`): `path` is a run
    directory or one of its checkpoints; the model is `<run>/checkpoints/warm-start/policy/hf`
    (`pipelines.warm_start.WARM_START_DIR`).

    Raises:
        EvaluationError: no such model (a run without `train.warm_start`, or not a run's path).
    """
    from pipelines.warm_start import WARM_START_DIR

    p = Path(path).expanduser()
    run = p if (p / "checkpoints").is_dir() else p.parent.parent if p.parent.name == "checkpoints" else p
    model = run / WARM_START_DIR / "policy" / "hf"
    problem = model_dir_problem(model)
    if problem is not None:
        raise EvaluationError(f"--methods warm_start: {model}: {problem}; pass --checkpoint a run directory (or one "
                              "of its checkpoints) trained with train.warm_start, or drop warm_start")
    return str(model.resolve())


def resolve_checkpoint(path: str | Path) -> str:
    """The Hugging Face model directory of a checkpoint (`pipelines.checkpoints.policy_model_dir`: a run
    directory's newest complete checkpoint, a checkpoint the learner wrote, or a model directory itself).

    Returns:
        The model directory, absolute.
    Raises:
        EvaluationError: the message of `CheckpointPathError`, for `--checkpoint`.
    """
    try:
        return str(policy_model_dir(path)[0])
    except CheckpointPathError as e:
        raise EvaluationError(f"--{e}") from None


def parse_methods(methods: str | Iterable[str]) -> list[str]:
    """Method names from "a,b,c" or a list, deduplicated in order.

    Raises:
        EvaluationError: empty, or a name not in `METHODS`.
    """
    names = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise EvaluationError(f"--methods {','.join(names) or '(empty)'}: unknown {unknown or 'none given'}; "
                              f"choose from {','.join(METHODS)}")
    return list(dict.fromkeys(names))


def _check_model_field(field: str, value: str) -> None:
    """A model given as a path (starts with / ./ ../ ~) must exist; names are left to the engine."""
    if value.startswith(("/", "./", "../", "~")) and not Path(value).expanduser().is_dir():
        raise EvaluationError(f"{field}={value!r}: no such model directory; set {field} to an existing "
                              f"directory, 'gemma3-270m' or a Hugging Face name")


def load_questions(qa_file: str | Path, data_dir: str | None = None, limit: int | None = None,
                   sample_seed: int | None = None) -> list[dict]:
    """Questions of `qa_file` as dicts (id, question, golden_answers, dataset, meta: the row's `SEARCH_META`
    fields it has, which the search measures read): the first `limit`
    (None = all), or with `sample_seed` a sample of `limit` spread over the datasets.

    The sample takes each dataset's questions in a seeded random order and deals them out round-robin
    over the datasets (so 64 questions of a 6-dataset split hold 10-11 of each); the result keeps file
    order. Pack splits are sorted by dataset, so their first N questions are usually one dataset.

    Raises:
        EvaluationError: limit < 1, or the file has no questions.
        DataPackError: neither a file nor a data pack file; BadRowError: a malformed row.
    """
    from pipelines.data import iter_qa, pack_file, spread_sample

    if limit is not None and limit < 1:
        raise EvaluationError(f"--limit {limit}: must be >= 1 (questions), or omitted for the whole file")
    path = Path(qa_file).expanduser()
    if not path.is_file():
        path = pack_file(str(qa_file), data_dir)
    examples = [
        {"id": e.id, "question": e.question, "golden_answers": list(e.golden_answers), "dataset": e.dataset,
         "meta": {k: e.meta[k] for k in SEARCH_META if e.meta.get(k)}}
        for e in iter_qa(path, limit=None if sample_seed is not None else limit)
    ]
    if not examples:
        raise EvaluationError(f"--qa {path}: no questions in the file")
    if sample_seed is None or limit is None or limit >= len(examples):
        return examples
    return spread_sample(examples, limit, sample_seed)


def mirage_examples(path: str | Path, limit: int, seed: int) -> list[dict]:
    """`limit` MIRAGE rows of `path` (a seeded sample dealt round-robin over its sets; all of them when
    `limit` reaches the file's size) as evaluation examples: the question with its options listed
    ("A. ...", one per line), golden answers the right option as "B. text" and its text alone, and
    dataset `mirage/<set>`.

    Raises:
        EvaluationError: limit < 1. BadRowError: a malformed row.
    """
    from pipelines.data import iter_mirage, spread_sample

    if limit < 1:
        raise EvaluationError(f"eval.mirage_questions={limit}: must be >= 1 here (0 leaves MIRAGE out)")
    rows = list(iter_mirage(path))
    out = []
    for r in spread_sample(rows, limit, seed):
        options = "\n".join(f"{k}. {v}" for k, v in r["options"].items())
        right = r["options"][r["answer"]]
        out.append({"id": r["id"], "question": f"{r['question']}\nOptions:\n{options}",
                    "golden_answers": [f"{r['answer']}. {right}", right], "dataset": MIRAGE + str(r.get("dataset"))})
    return out
