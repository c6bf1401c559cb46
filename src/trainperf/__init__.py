"""trainperf: prove, tune and explain how fast a GPU cluster trains LLMs."""

__version__ = "0.1.0"
