"""autopar: trace a PyTorch model, solve for the fastest parallel plan under memory, run it."""
__version__ = "0.1.0"
