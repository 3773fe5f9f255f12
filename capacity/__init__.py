"""capacity: predict GPU memory, latency and GPU count for LLM serving before you deploy.

The core (model cards, GPU catalogue, memory budget) needs only numpy/pydantic/pyyaml; heavy packages
(torch, streamlit, plotly, openpyxl, ray) are imported inside the functions that use them.
"""
__version__ = "0.1.0"
