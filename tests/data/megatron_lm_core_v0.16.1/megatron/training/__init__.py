# Not the upstream megatron/training/__init__.py (which imports the whole training loop): an empty package
# so that arguments.py imports on a machine without GPUs. See ../../README.md.
