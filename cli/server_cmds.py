"""Commands that talk to a running ``pollama serve`` (serve, ps, stop), registered on the app."""
