"""The torch-free core: specs and their resolution and validation, the layout arithmetic, the GPU
table, model FLOPs, errors and atomic writes. Imports nothing above it and never imports torch."""
