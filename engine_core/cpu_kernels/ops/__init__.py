"""Fused norm / rotary / SiLU-and-mul kernels (fused_ops.py binds both dtypes: fused_torch_rounding.c, bf16, torch's
roundings; fused_fixed_order.c, float32) and RMSNorm's fixed-order row statistic (rms_fixed_order.c)."""
