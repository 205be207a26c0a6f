"""C++ sources of the CPU backend, shipped as package data and compiled on first use."""
