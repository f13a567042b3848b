"""`seed-tot serve`: an OpenAI-compatible HTTP server over one engine (FastAPI + uvicorn, the `serve` extra).
Importing this package imports neither: the command imports them when it runs."""
