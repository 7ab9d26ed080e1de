"""``pollama serve``: Ollama's native API (/api/*) and OpenAI's (/v1/*) over the runner.

``app.create_app`` builds the FastAPI app, ``app.serve`` runs it with uvicorn on ``OLLAMA_HOST``;
``scheduler`` loads, shares and unloads models; ``service`` is the request lifecycle both APIs
share; ``ollama_api``/``openai_api`` translate the wire formats (``responses_api`` OpenAI's Responses API,
``anthropic_api`` Anthropic's Messages API, ``responsestore`` the responses it keeps); ``models``
lists and edits the store.
"""

from __future__ import annotations

from .app import create_app, serve

__all__ = ["create_app", "serve"]
