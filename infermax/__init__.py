"""InferMax: simulate LLM inference schedulers on cost models fitted to GPU profiles."""

__version__ = "0.1.0"
