"""Speculative decoding: proposers, and the verification that keeps the target model's distribution."""
