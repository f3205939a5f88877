"""decoder kernels: the C sources and their ctypes bindings."""
