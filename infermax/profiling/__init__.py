"""PyTorch operator profiles (``infermax profile``) and real execution of Schedules (``infermax gpu-replay``).

Needs PyTorch (``pip install 'infermax[gpu]'``); everything runs on a CPU with tiny shapes for tests.
The operators timed by the profiler (``layers``) are the very functions the executor (``execute``)
runs, so a replay measures the code the cost model was fitted to.
"""

from __future__ import annotations


def import_torch():
    """``torch``, or a ValueError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise ValueError("PyTorch is not installed: pip install 'infermax[gpu]' (or pip install torch)") from None
    return torch
