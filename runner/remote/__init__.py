"""Remote models: a Modelfile ``FROM http(s)://...`` names an upstream server (OpenAI-compatible
or Ollama-API) that runs the model; pollama forwards every request to it (README "Remote models").

- :mod:`.upstream`: the upstream URLs and the store's record of a remote model;
- :mod:`.discover`: what the upstream serves, asked when the model is created;
- :mod:`.dialect`, :mod:`.openai_wire`, :mod:`.ollama_wire`: the two upstream APIs;
- :mod:`.client`: HTTP with bounds, timeouts and same-host redirects;
- :mod:`.replicas`: which replica takes a request (pure policy);
- :mod:`.runner`: :class:`~.runner.RemoteRunner`, the runner contract kept by forwarding.
"""
