"""The accelerator backend: layouts, tiling, and instruction streams for conv2d, dense and add."""
