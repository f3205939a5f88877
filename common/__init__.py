"""Shared by the frontend and the engine core: sampling parameters, wire protocol, configs.

Nothing here may import torch: the frontend host has none.
"""
