"""capacity: predict GPU memory, latency and GPU count for LLM serving before you deploy.

The core (model cards, GPU catalogue, memory budget) needs only numpy/pydantic/pyyaml; heavy packages
(torch, streamlit, plotly, openpyxl, ray) are imported inside the functions that use them.
"""
__version__ = "0.1.0"


def compiled() -> bool:
    """Whether the simulator's hot modules run compiled by mypyc (`scripts/compile.sh` in a checkout, or a wheel built
    with CAPACITY_MYPYC=1): the same sources and results, bit for bit (`bench/compiled.py`), about 2-2.6x faster."""
    from capacity.sched import continuous

    return not str(getattr(continuous, "__file__", "")).endswith(".py")
