"""The Hopper (wgmma + TMA) kernel family: CUDA sources and its Python side."""
