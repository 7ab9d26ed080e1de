"""Chat templates: which template a model's prompts are rendered with (:mod:`.prompt`), Go's
text/template with Ollama's rules (:mod:`.go`, :mod:`.ollama`), untrusted Jinja rendered in a
sandbox within a budget (:mod:`.sandbox`), llama.cpp's built-ins (:mod:`.builtins`), and what a
template supports, found by probing it (:mod:`.features`).
"""
